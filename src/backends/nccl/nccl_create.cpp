// Creation of NCCL communicators: from a unique id, as a child of a parent, and the three
// ways a Communicator makes groups (split, create_group, create_group_collective).
#include "nccl_create.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include "commgrid/nccl.hpp"
#include "engine_int.hpp"
#include "fingerprint.hpp"

namespace commgrid {

using namespace nccl_backend;
using nccl_host::members_text;
using nccl_host::timeout_message;

nccl_host::UniqueId nccl_backend::make_unique_id() {
  ncclUniqueId id;
  const ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc != ncclSuccess) throw BackendError("ncclGetUniqueId: " + nccl_text(rc));
  nccl_host::UniqueId out{};
  static_assert(sizeof(id.internal) == nccl_host::kUniqueIdBytes);
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

// Initializes one NCCL communicator from a unique id, nonblocking, polled until the
// deadline; on timeout aborts it and throws TimeoutError naming the group and members. The
// caller keeps `cfg` (its name) for as long as the returned communicator lives.
OwnedComm nccl_backend::init_comm(int nranks, const nccl_host::UniqueId& id, int rank, int device,
                                  const std::string& op, const std::string& parent,
                                  const nccl_backend::CommConfig& cfg, Ms timeout,
                                  const std::vector<std::int64_t>& members) {
  const std::string& name = *cfg.name;
  const DeviceGuard guard(device, op, parent);
  ncclConfig_t config = cfg.config;  // NCCL copies it, but keeps config.commName's pointer
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), id.size());
  const Clock::time_point deadline = Clock::now() + timeout;
  ncclComm_t raw = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&raw, nranks, uid, rank, &config);
  OwnedComm comm(raw, CommAborter{device});  // aborted on every way out but success
  if ((rc == ncclSuccess || rc == ncclInProgress) && comm) rc = settle_own(comm.get(), deadline).rc;
  if (rc == ncclSuccess && comm) return comm;
  const std::string target = parent == name ? "" : name;
  if (rc == ncclInProgress)
    throw TimeoutError(timeout_message(op, parent, target, timeout, name, members));
  throw BackendError("nccl " + op + " on " + parent + (target.empty() ? "" : " for " + target) +
                     ": " + nccl_text(rc) + " (members " + members_text(members) + ")");
}

// The state of a communicator made from `parent`; it owns `comm` (aborted if this throws)
// and the name NCCL was given.
std::shared_ptr<State> nccl_backend::new_state(OwnedComm comm, const State& parent,
                                               const std::string& name,
                                               std::shared_ptr<const std::string> nccl_name) {
  auto state = std::make_shared<State>(std::move(comm), parent.device, name, parent.bootstrap,
                                       parent.timeout, std::move(nccl_name));
  state->owned_bootstrap = parent.owned_bootstrap;
  state->epoch = parent.epoch;
  if (state->epoch) state->epoch->add(state);  // aborted at once if the epoch was
  return state;
}

OwnedComm nccl_backend::make_child(State& s, const std::string& op, const std::string& target,
                                   const std::string& child_name, Ms timeout, bool stopping,
                                   const ChildCall& call) {
  const Clock::time_point deadline = Clock::now() + timeout;
  ncclComm_t slot = nullptr;
  bool job_ended = false;
  OwnedComm child(nullptr, CommAborter{s.device});
  OnExit unwind([&] {
    if (!job_ended)
      s.abort("nccl " + op + " on " + s.name + " for " + target + " did not complete");
    child.reset(__atomic_load_n(&slot, __ATOMIC_ACQUIRE));
  });
  auto on_parent = [&](ncclComm_t parent) { return call(parent, &slot); };
  const std::optional<ncclResult_t> called =
      stopping ? s.use_stopping(on_parent) : s.use(on_parent);
  if (!called) s.check_usable(op);
  // The parent reports ncclInProgress until the job has ended (for a rank without color too:
  // it takes part in the exchange of colors).
  Settled st{called.value_or(ncclInvalidUsage), false};
  if (st.rc == ncclSuccess || st.rc == ncclInProgress)
    st = settle(
        [&s, stopping] { return stopping ? s.use_stopping(&async_state_of) : s.async_state(); },
        deadline);
  if (st.aborted) s.check_usable(op);
  if (st.rc == ncclInProgress) {
    const std::string msg = timeout_message(op, s.name, target, timeout, s.name, s.members);
    s.abort(msg);
    throw TimeoutError(msg);
  }
  if (st.rc != ncclSuccess) s.fail(op + " for " + target, st.rc);
  job_ended = true;
  unwind.dismiss();
  child.reset(__atomic_load_n(&slot, __ATOMIC_ACQUIRE));
  if (!child) return child;
  st = settle_own(child.get(), deadline);
  if (st.rc != ncclSuccess) {
    if (st.rc == ncclInProgress)
      throw TimeoutError(timeout_message(op, s.name, target, timeout, child_name, s.members));
    throw BackendError("nccl " + op + " on " + s.name + " for " + target + ": " + nccl_text(st.rc));
  }
  return child;
}

// ---- creation -----------------------------------------------------------------------------

std::unique_ptr<Communicator> NcclCommunicator::do_split(std::optional<std::int64_t> color,
                                                         std::int64_t key, std::string name) {
  State& s = *state_;
  s.check_usable("split");
  nccl_host::check_nccl_environment("nccl split on " + s.name + " for " + name);
  const DeviceGuard guard(s.device, "split", s.name);
  const nccl_backend::CommConfig cfg =
      nccl_backend::nonblocking_config(name);  // outlives the child
  ncclConfig_t config = cfg.config;
  const int c = color ? static_cast<int>(*color) : NCCL_SPLIT_NOCOLOR;
  const std::string target =
      name + (color ? " (color " + std::to_string(*color) + ")" : " (no color)");
  OwnedComm child = make_child(
      s, "split", target, name, timeout(), false, [&](ncclComm_t parent, ncclComm_t* slot) {
        return ncclCommSplit(parent, c, static_cast<int>(key), slot, &config);
      });
  if (!color) {
    COMMGRID_ENFORCE(child == nullptr, "ncclCommSplit gave a communicator to a rank without color");
    return nullptr;
  }
  if (!child)
    throw BackendError("nccl split on " + s.name + " for " + target +
                       ": ncclCommSplit completed without a communicator");
  auto out = adopt(new_state(std::move(child), s, name, cfg.name), timeout(), {});
  // NCCL does not say which parent ranks joined; the members tell each other.
  const std::int64_t me = global_rank(rank());
  std::vector<std::int64_t> got(static_cast<std::size_t>(out->size()), -1);
  out->allgather(&me, got.data(), 1, DataType::int64)->wait();
  out->state_->members = got;
  out->set_members(std::move(got));
  return out;
}

std::unique_ptr<Communicator> NcclCommunicator::do_create_group(std::span<const Rank> members,
                                                                std::string name) {
  State& s = *state_;
  s.check_usable("create_group");
  nccl_host::check_nccl_environment("nccl create_group on " + s.name + " for " + name);
  if (s.bootstrap == nullptr)
    throw BackendError("nccl create_group on " + s.name + " for " + name +
                       ": no bootstrap communicator");
  std::vector<Rank> global;
  for (Rank m : members) global.push_back(global_rank(m));
  const nccl_host::UniqueId id =
      nccl_host::distribute_unique_id(*s.bootstrap, global, name, make_unique_id);
  const int mine =
      static_cast<int>(std::lower_bound(members.begin(), members.end(), rank()) - members.begin());
  const nccl_backend::CommConfig cfg = nccl_backend::nonblocking_config(name);
  OwnedComm comm = init_comm(static_cast<int>(members.size()), id, mine, s.device, "create_group",
                             s.name, cfg, timeout(), global);
  return adopt(new_state(std::move(comm), s, name, cfg.name), timeout(), std::move(global));
}

std::unique_ptr<Communicator> NcclCommunicator::do_create_group_collective(
    std::span<const Rank> members, std::string name) {
  State& s = *state_;
  s.check_usable("create_group_collective");
  nccl_host::check_nccl_environment("nccl create_group_collective on " + s.name + " for " + name);
  // One record per rank: [fingerprint, ok, id..., text...]; only the first member's id and
  // text are read.
  constexpr std::size_t kIdWords = nccl_host::kUniqueIdBytes / 8, kTextWords = 25;
  constexpr std::size_t kWords = 2 + kIdWords + kTextWords;
  std::array<std::int64_t, kWords> mine{};
  mine[0] = static_cast<std::int64_t>(detail::group_fingerprint(members, name));
  mine[1] = 1;
  if (rank() == members.front()) {
    try {
      const nccl_host::UniqueId id = make_unique_id();
      std::memcpy(&mine[2], id.data(), id.size());
    } catch (const Error& e) {
      mine[1] = 0;
      std::strncpy(reinterpret_cast<char*>(&mine[2 + kIdWords]), e.what(), kTextWords * 8 - 1);
    }
  }
  const auto n = static_cast<std::size_t>(size());
  std::vector<std::int64_t> all(kWords * n);
  allgather(mine.data(), all.data(), kWords, DataType::int64)->wait();
  std::string differ;
  for (std::size_t r = 0; r < n; ++r)
    if (all[r * kWords] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (!differ.empty())
    throw BackendError("nccl create_group_collective on " + s.name + " for " + name + ": ranks " +
                       differ + " passed different members or name than rank 0");
  const std::int64_t* leader = &all[static_cast<std::size_t>(members.front()) * kWords];
  if (leader[1] != 1)
    throw BackendError(
        "nccl create_group_collective on " + s.name + " for " + name + ": rank " +
        std::to_string(members.front()) + " could not make the NCCL unique id: " +
        std::string(reinterpret_cast<const char*>(&leader[2 + kIdWords]),
                    strnlen(reinterpret_cast<const char*>(&leader[2 + kIdWords]), kTextWords * 8)));
  if (!std::binary_search(members.begin(), members.end(), rank())) return nullptr;
  nccl_host::UniqueId id{};
  std::memcpy(id.data(), &leader[2], id.size());
  std::vector<Rank> global;
  for (Rank m : members) global.push_back(global_rank(m));
  const int me =
      static_cast<int>(std::lower_bound(members.begin(), members.end(), rank()) - members.begin());
  const nccl_backend::CommConfig cfg = nccl_backend::nonblocking_config(name);
  OwnedComm comm = init_comm(static_cast<int>(members.size()), id, me, s.device,
                             "create_group_collective", s.name, cfg, timeout(), global);
  return adopt(new_state(std::move(comm), s, name, cfg.name), timeout(), std::move(global));
}

}  // namespace commgrid
