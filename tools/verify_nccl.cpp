#include "cli_errors.hpp"
#include "verify_nccl.hpp"
#include "command.hpp"

#include <iostream>
#include <memory>
#include <mutex>

#include "commgrid/backends.hpp"
#include "commgrid/nccl.hpp"
#if COMMGRID_HAS_GLOO
#include "commgrid/gloo.hpp"
#include "commgrid/local_ranks.hpp"
#endif
#if COMMGRID_HAS_MPI
#include "commgrid/mpi.hpp"
#endif

namespace commgrid::cli {
namespace {

// One rank of a launched job over `boot`: rank 0 prints. Errors end this rank with 1 (a
// config mismatch, raised on every rank alike, with 2); `abort_job` ends the other ranks
// where the launcher would not (MPI).
int verify_one_rank(Communicator& boot, const ParallelConfig& config, const VerifyOptions& options,
                    std::chrono::milliseconds timeout, void (*abort_job)()) {
  VerifyReport report;
  try {
    NcclOptions nccl;
    nccl.timeout = timeout;
    const auto world = make_nccl_world(boot, nccl);
    report = run_verify(*world, config, options);
  } catch (const ConfigError& e) {
    if (boot.rank() == 0) print_error(e.what());
    return 2;
  } catch (const Error& e) {
    print_error("rank " + std::to_string(boot.rank()) + ": " + e.what());
    if (abort_job != nullptr) abort_job();
    return 1;
  }
  if (boot.rank() == 0) return print_verify_report(report);
  return report.passed() ? 0 : 1;
}

}  // namespace

int run_verify_nccl(const LayoutFlags& layout, const VerifyOptions& options,
                    std::chrono::milliseconds timeout, std::optional<int> local_ranks) {
#if COMMGRID_HAS_GLOO
  GlooOptions gloo;
  gloo.timeout = timeout;
  if (local_ranks) {
    const ParallelConfig config = checked_verify_config(layout, options, *local_ranks);
    std::mutex mutex;
    std::optional<VerifyReport> report;
    LocalRunResult run = run_local_ranks_collect(*local_ranks, [&](Communicator& boot) {
      NcclOptions nccl;
      nccl.timeout = timeout;
      const auto world = make_nccl_world(boot, nccl);  // device = rank: one GPU per thread
      VerifyReport r = run_verify(*world, config, options);
      if (world->rank() == 0) {
        std::lock_guard lock(mutex);
        report = std::move(r);
      }
    }, gloo);
    if (run.first_failed_rank >= 0) {
      print_error(run.first_failure);
      try {
        std::rethrow_exception(run.errors[static_cast<std::size_t>(run.first_failed_rank)]);
      } catch (const ConfigError&) {
        return 2;
      } catch (...) {
        return 1;
      }
    }
    return print_verify_report(*report);
  }
  if (world_env_present()) {  // under commgrid launch: a Gloo bootstrap from COMMGRID_*
    const WorldEnv env = read_world_env();
    const ParallelConfig config = checked_verify_config(layout, options, env.size);
    const auto boot = make_gloo_world_from_env(gloo);
    return verify_one_rank(*boot, config, options, timeout, nullptr);
  }
#else
  if (local_ranks)
    throw ConfigError("local", "local: --local runs ranks as threads over a Gloo bootstrap, and "
                               "this build of commgrid has no Gloo backend");
#endif
#if COMMGRID_HAS_MPI
  mpi::MpiEnvironment env;
  const std::unique_ptr<mpi::MpiCommunicator> boot = make_mpi_world(timeout);
  ParallelConfig config;
  try {
    config = checked_verify_config(layout, options, boot->size());
  } catch (const ConfigError& e) {
    if (boot->rank() == 0) print_error(e.what());
    return 2;
  }
  return verify_one_rank(*boot, config, options, timeout, [] { mpi::MpiEnvironment::abort(1); });
#else
  (void)layout;
  (void)options;
  throw ConfigError("backend", "verify --backend nccl: without --local or commgrid launch the "
                               "bootstrap is MPI, and this build of commgrid has no MPI backend");
#endif
}

}  // namespace commgrid::cli
