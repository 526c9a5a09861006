// MPI's environment and world: MpiEnvironment (MPI_Init_thread bounded by a timeout, and
// MPI_Finalize when it owns MPI) and make_mpi_world.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "commgrid/mpi.hpp"
#include "deadline_watchdog.hpp"
#include "mpi_internal.hpp"

namespace commgrid {

using mpi_backend::Clock;
using mpi_backend::error_text;

namespace {
// MPI_Init blocks until every rank of the job has started it; a rank that never does (it
// failed to start, or was stopped) would hang the others, and mpirun, forever. The bound is
// the caller's (MpiEnvironment's init_timeout). Past it this rank writes one line and exits
// 1; mpirun then ends the whole job with its own message. MPI_Abort is not allowed before
// MPI_Init returns, so this is the only way out.

// Past the bound: one line in one write (safe from the watchdog thread), then exit 1.
std::shared_ptr<void> end_stuck_init(std::chrono::milliseconds timeout) {
  char line[256];
  const int n = std::snprintf(line, sizeof(line),
                              "error: mpi MPI_Init_thread: did not complete within %.1f s (a "
                              "rank of the job did not start or is stopped); ending this "
                              "rank\n",
                              static_cast<double>(timeout.count()) / 1000.0);
  if (n > 0) [[maybe_unused]]
    auto w = ::write(2, line, static_cast<size_t>(n));
  std::_Exit(1);
}

}  // namespace

MpiEnvironment::MpiEnvironment(MpiThreadSupport required, std::chrono::milliseconds init_timeout) {
  init(nullptr, nullptr, required, init_timeout);
}

MpiEnvironment::MpiEnvironment(int* argc, char*** argv, MpiThreadSupport required,
                               std::chrono::milliseconds init_timeout) {
  init(argc, argv, required, init_timeout);
}

void MpiEnvironment::init(int* argc, char*** argv, MpiThreadSupport required,
                          std::chrono::milliseconds init_timeout) {
  if (init_timeout.count() <= 0)
    throw InvalidValueError("init_timeout", "mpi init: init_timeout must be > 0 ms, got " +
                                                std::to_string(init_timeout.count()));
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized != 0)
    throw BackendError("mpi init: MPI was already finalized and cannot be initialized again");
  int provided = MPI_THREAD_SINGLE;
  if (initialized != 0) {
    MPI_Query_thread(&provided);
  } else {
    int rc = MPI_SUCCESS;
    {
      const std::chrono::milliseconds timeout = init_timeout;
      const detail::WatchedDeadline bound(Clock::now() + timeout,
                                          [timeout] { return end_stuck_init(timeout); });
      rc = MPI_Init_thread(argc, argv, static_cast<int>(required), &provided);
    }
    if (rc != MPI_SUCCESS) throw BackendError("mpi MPI_Init_thread: " + error_text(rc));
    owns_ = true;
    // We own MPI, so errors on the predefined communicators come back as codes too.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  }
  provided_ = static_cast<MpiThreadSupport>(provided);
  if (provided < static_cast<int>(required)) {
    if (owns_) MPI_Finalize();
    owns_ = false;
    throw BackendError("mpi init: thread support " + std::to_string(static_cast<int>(required)) +
                       " requested, MPI provides only " + std::to_string(provided));
  }
}

MpiEnvironment::~MpiEnvironment() {
  if (!owns_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized == 0) MPI_Finalize();
}

void MpiEnvironment::abort(int code) noexcept {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort should not return; if it does, end this process anyway
}

std::unique_ptr<MpiCommunicator> make_mpi_world(const MpiOptions& options) {
  if (options.timeout.count() <= 0)
    throw InvalidValueError("timeout", "mpi world: timeout must be > 0 ms, got " +
                                           std::to_string(options.timeout.count()));
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0)
    throw BackendError("mpi world: MPI is not initialized; create an MpiEnvironment first");
  auto world = MpiCommunicator::duplicate(MPI_COMM_WORLD, "world", options.timeout);
  world->set_collective_calls(options.collective_calls);
  return world;
}

}  // namespace commgrid
