// Groups made from an MPI communicator: split, create_group and create_group_collective, each
// bounded by the process-wide watchdog (MPI has no nonblocking communicator creation).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "commgrid/mpi.hpp"
#include "deadline_watchdog.hpp"
#include "engine_int.hpp"
#include "mpi_internal.hpp"

namespace commgrid {

using namespace mpi_backend;

std::unique_ptr<Communicator> MpiCommunicator::adopt(MPI_Comm comm, std::string name) {
  if (comm == MPI_COMM_NULL) return nullptr;
  auto child = std::make_unique<MpiCommunicator>(comm, std::move(name), timeout());
  child->set_collective_calls(collective_calls());  // a new group calls MPI as its parent
  // The child's members as global ranks: its ranks translated into this communicator's
  // ranks (a local computation), then through this communicator's own members.
  GroupGuard mine, theirs;
  check(MPI_Comm_group(comm_, &mine.group), "split");
  check(MPI_Comm_group(comm, &theirs.group), "split");
  std::vector<int> child_ranks(static_cast<std::size_t>(child->size_)), here(child_ranks.size());
  for (std::size_t i = 0; i < child_ranks.size(); ++i) child_ranks[i] = static_cast<int>(i);
  check(MPI_Group_translate_ranks(theirs.group, child->size_, child_ranks.data(), mine.group,
                                  here.data()),
        "split");
  std::vector<Rank> global(here.size());
  for (std::size_t i = 0; i < here.size(); ++i) global[i] = global_rank(here[i]);
  child->set_members(std::move(global));
  return child;
}

void MpiCommunicator::group_of_members(std::span<const Rank> members, const char* op,
                                       MPI_Group& out) const {
  const std::vector<int> ranks = detail::engine_ints(members);
  GroupGuard all;
  check(MPI_Comm_group(comm_, &all.group), op);
  check(MPI_Group_incl(all.group, static_cast<int>(ranks.size()), ranks.data(), &out), op);
}

namespace {
// Communicator creation has no nonblocking form in MPI, so a rank that never arrives would
// hang every other rank forever. The process-wide watchdog (one thread for every bound of
// every backend, not one per call) bounds the call by the communicator's timeout: past it,
// the job cannot continue (the other ranks are inside the same blocking call, and MPI cannot
// tell which rank is missing), so it prints one line naming the call and the group and
// aborts the whole job, which mpirun reports and ends.
detail::WatchedDeadline bound_creation(std::chrono::milliseconds timeout, std::string what) {
  return detail::WatchedDeadline(Clock::now() + timeout, [timeout, what = std::move(what)] {
    std::fprintf(stderr,
                 "error: %s: did not complete within %.1f s (a rank did not arrive; MPI cannot "
                 "tell which); aborting the job\n",
                 what.c_str(), static_cast<double>(timeout.count()) / 1000.0);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
    return std::shared_ptr<void>();
  });
}
}  // namespace

std::unique_ptr<Communicator> MpiCommunicator::do_split(std::optional<std::int64_t> color,
                                                        std::int64_t key, std::string name) {
  check_usable("split");
  MPI_Comm out = MPI_COMM_NULL;
  const auto bound = bound_creation(timeout(), "mpi split on " + this->name() + " for " + name);
  const int rc = MPI_Comm_split(comm_, color ? static_cast<int>(*color) : MPI_UNDEFINED,
                                static_cast<int>(key), &out);
  if (rc != MPI_SUCCESS)
    throw BackendError("mpi split on " + this->name() + " for " + name + ": " + error_text(rc));
  return adopt(out, std::move(name));
}

std::unique_ptr<Communicator> MpiCommunicator::do_create_group(std::span<const Rank> members,
                                                               std::string name) {
  check_usable("create_group");
  GroupGuard group;
  group_of_members(members, "create_group", group.group);
  MPI_Comm out = MPI_COMM_NULL;
  const int tag = mpi_create_group_tag(name, tag_ub_);
  const auto bound =
      bound_creation(timeout(), "mpi create_group on " + this->name() + " for " + name);
  const int rc = MPI_Comm_create_group(comm_, group.group, tag, &out);
  if (rc != MPI_SUCCESS)
    throw BackendError("mpi create_group on " + this->name() + " for " + name + ": " +
                       error_text(rc));
  return adopt(out, std::move(name));
}

std::unique_ptr<Communicator> MpiCommunicator::do_create_group_collective(
    std::span<const Rank> members, std::string name) {
  check_usable("create_group_collective");
  GroupGuard group;
  group_of_members(members, "create_group_collective", group.group);
  MPI_Comm out = MPI_COMM_NULL;
  const auto bound =
      bound_creation(timeout(), "mpi create_group_collective on " + this->name() + " for " + name);
  const int rc = MPI_Comm_create(comm_, group.group, &out);
  if (rc != MPI_SUCCESS)
    throw BackendError("mpi create_group_collective on " + this->name() + " for " + name + ": " +
                       error_text(rc));
  return adopt(out, std::move(name));
}

}  // namespace commgrid
