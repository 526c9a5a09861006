// The MPI backend's Communicator object: adoption of an MPI communicator, its error checks,
// and the bounded wait on a request.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "commgrid/mpi.hpp"
#include "deadline_watchdog.hpp"
#include "fingerprint.hpp"
#include "mpi_internal.hpp"

namespace commgrid {

using namespace mpi_backend;

namespace {

int tag_upper_bound(MPI_Comm comm) {
  void* value = nullptr;
  int flag = 0;
  if (MPI_Comm_get_attr(comm, MPI_TAG_UB, &value, &flag) != MPI_SUCCESS || flag == 0)
    return 32767;  // the least upper bound the standard allows
  return *static_cast<int*>(value);
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, std::chrono::milliseconds timeout)
    : Communicator(std::move(name), timeout), comm_(comm) {
  if (comm == MPI_COMM_NULL || comm == MPI_COMM_WORLD || comm == MPI_COMM_SELF)
    throw BackendError("mpi communicator " + this->name() +
                       ": needs an owned communicator, not MPI_COMM_NULL, MPI_COMM_WORLD or "
                       "MPI_COMM_SELF (use MpiCommunicator::duplicate)");
  int rc = MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm_, &rank_);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm_, &size_);
  if (rc == MPI_SUCCESS) tag_ub_ = tag_upper_bound(comm_);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&comm_);  // the destructor will not run
    throw BackendError("mpi adopt on " + this->name() + ": " + error_text(rc));
  }
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized == 0 && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::duplicate(MPI_Comm comm, std::string name,
                                                            std::chrono::milliseconds timeout) {
  MPI_Comm dup = MPI_COMM_NULL;
  int rc = MPI_Comm_dup(comm, &dup);
  if (rc != MPI_SUCCESS) throw BackendError("mpi dup for " + name + ": " + error_text(rc));
  return std::make_unique<MpiCommunicator>(dup, std::move(name), timeout);
}

int mpi_create_group_tag(std::string_view name, int tag_upper_bound) noexcept {
  const std::size_t hash_pos = name.rfind('#');
  const std::string_view prefix =
      hash_pos == std::string_view::npos ? name : name.substr(0, hash_pos);
  const std::uint64_t h = detail::fingerprint(prefix);
  const auto range = static_cast<std::uint64_t>(std::max(tag_upper_bound, 0)) + 1;
  return static_cast<int>(h % range);
}

void MpiCommunicator::check(int rc, const char* op) const {
  if (rc != MPI_SUCCESS)
    throw BackendError("mpi " + std::string(op) + " on " + name() + ": " + error_text(rc));
}

void MpiCommunicator::check_usable(const char* op) const {
  if (broken_)
    throw BackendError("mpi " + std::string(op) + " on " + name() +
                       ": the communicator is unusable after an earlier timeout");
}

void MpiCommunicator::wait(MPI_Request& request, const char* op, MPI_Status* status) {
  const auto deadline = Clock::now() + timeout();
  for (Backoff backoff;; backoff.pause()) {
    int done = 0;
    check(MPI_Test(&request, &done, status != nullptr ? status : MPI_STATUS_IGNORE), op);
    if (done != 0) return;
    if (Clock::now() >= deadline) {
      // MPI cannot cancel a started collective or a send, so the request stays with MPI,
      // which may still use the caller's buffers; nothing on this communicator is safe now.
      broken_ = true;
      throw TimeoutError("mpi " + std::string(op) + " on " + name() + ": timed out after " +
                         std::to_string(timeout().count()) + " ms at rank " +
                         std::to_string(rank_) + " of " + std::to_string(size_) +
                         " (a rank of the group did not take part; MPI cannot tell which); the "
                         "communicator is unusable from now on");
    }
  }
}

}  // namespace commgrid
