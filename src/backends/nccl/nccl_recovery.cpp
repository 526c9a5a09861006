// Recovery on NCCL: aborting a world's epoch, and shrinking a world to its survivors
// (ncclCommShrink, or a new world over a bootstrap of the survivors).
#include <nccl.h>

#include <numeric>
#include <vector>

#include "commgrid/nccl.hpp"
#include "nccl_create.hpp"
#include "nccl_cuda.hpp"
#include "nccl_host.hpp"
#include "nccl_state.hpp"
#include "nccl_types.hpp"

namespace commgrid {

using namespace nccl_backend;
using nccl_host::members_text;

std::size_t abort_nccl_epoch(NcclCommunicator& comm, const std::string& reason) noexcept {
  State& s = *NcclCommunicatorAccess::state(comm);
  try {
    if (s.epoch) return s.epoch->abort_all(reason);
  } catch (...) {  // out of memory while listing the members: at least this one goes
  }
  return s.abort_now(reason) ? 1 : 0;
}

std::size_t abort_nccl_epoch(Communicator& comm, const std::string& reason) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  if (nccl == nullptr)
    throw ConfigError("backend",
                      "abort_nccl_epoch: " + comm.name() + " is a " + std::string(comm.backend()) +
                          " communicator; only NCCL communicators have an epoch to abort");
  return abort_nccl_epoch(*nccl, reason);
}

NcclShrinkMethod nccl_shrink_method() noexcept {
#if COMMGRID_NCCL_HAS_SHRINK
  return NcclShrinkMethod::comm_shrink;
#else
  return NcclShrinkMethod::new_world;
#endif
}

const char* nccl_shrink_method_name(NcclShrinkMethod method) noexcept {
  return method == NcclShrinkMethod::comm_shrink ? "ncclCommShrink" : "new world";
}

std::unique_ptr<NcclCommunicator> shrink_nccl_world(NcclCommunicator& world,
                                                    std::span<const Rank> exclude,
                                                    const NcclShrinkOptions& options) {
  const std::shared_ptr<State> keep = NcclCommunicatorAccess::state(world);
  State& s = *keep;
  const std::string what = "nccl shrink of " + s.name;
  const Ms timeout = options.timeout.value_or(world.timeout());
  if (timeout.count() <= 0)
    throw InvalidValueError(
        "timeout", what + ": timeout must be > 0 ms, got " + std::to_string(timeout.count()));
  const nccl_host::WorldShrink plan =
      nccl_host::plan_world_shrink(world.size(), world.rank(), exclude, what);
  if (options.bootstrap &&
      (options.bootstrap->size() != plan.size || options.bootstrap->rank() != plan.rank))
    throw InvalidValueError(
        "bootstrap", what + ": the bootstrap is rank " + std::to_string(options.bootstrap->rank()) +
                         " of " + std::to_string(options.bootstrap->size()) +
                         ", and this rank is rank " + std::to_string(plan.rank) + " of " +
                         std::to_string(plan.size) + " in the shrunk world (members " +
                         members_text(plan.survivors) + ")");
  if (nccl_shrink_method() == NcclShrinkMethod::new_world && !options.bootstrap)
    throw ConfigError("bootstrap",
                      what + ": this build makes the smaller world afresh (NCCL " +
                          std::to_string(NCCL_VERSION_CODE) +
                          " headers, or COMMGRID_NCCL_NO_SHRINK: no ncclCommShrink), "
                          "which needs NcclShrinkOptions::bootstrap over the survivors");
  nccl_host::check_nccl_environment(what, true);
  // The old world has dead peers: whatever happens below, it is aborted on the way out
  // (finalizing it would wait for them), and with it its whole epoch, so that a group whose
  // creation another thread finished during the shrink (it joined the epoch after the
  // groups were aborted) is aborted too, and one that finishes later as it joins.
  OnExit abort_old([&] {
    s.abort(what + ": the world was replaced by its shrink");
    try {
      if (s.epoch) (void)s.epoch->abort_all(what + ": the world was replaced by its shrink");
    } catch (...) {  // (a destructor: only an allocation can fail here)
    }
  });
#if COMMGRID_NCCL_HAS_SHRINK
  s.check_usable("shrink");
  if (s.epoch) (void)s.epoch->abort_all(what + ": the epoch's groups are aborted", &s);
  // From here the old world is the shrink's alone: other threads' calls fail and their
  // pending operations (which NCCL_SHRINK_ABORT ends early, their events then complete) report
  // it aborted instead of complete.
  s.stop(what + ": the world is replaced by its shrink");
  const DeviceGuard guard(s.device, "shrink", s.name);
  const nccl_backend::CommConfig cfg = nccl_backend::nonblocking_config("world");
  ncclConfig_t config = cfg.config;
  std::vector<int> excluded = plan.exclude;  // NCCL takes a non-const list
  const int flags = options.abort_in_flight ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
  const std::string target =
      "world without " + members_text(std::vector<std::int64_t>(excluded.begin(), excluded.end()));
  OwnedComm child = make_child(
      s, "shrink", target, "world", timeout, true, [&](ncclComm_t parent, ncclComm_t* slot) {
        return ncclCommShrink(parent, excluded.empty() ? nullptr : excluded.data(),
                              static_cast<int>(excluded.size()), slot, &config, flags);
      });
  if (!child)
    throw BackendError(what + " for " + target +
                       ": ncclCommShrink completed without a communicator");
  auto state = std::make_shared<State>(std::move(child), s.device, "world", options.bootstrap.get(),
                                       timeout, cfg.name);
  state->owned_bootstrap = options.bootstrap;
  begin_epoch(state);
  std::vector<std::int64_t> members(static_cast<std::size_t>(plan.size));
  std::iota(members.begin(), members.end(), std::int64_t{0});
  return NcclCommunicatorAccess::adopt(std::move(state), timeout, std::move(members));
#else
  (void)abort_nccl_epoch(world, what + ": the epoch is aborted; a new world replaces it");
  NcclOptions o;
  o.bootstrap = options.bootstrap;
  o.device = s.device;
  o.timeout = timeout;
  return make_nccl_world(o);
#endif
}

}  // namespace commgrid
