#include "commgrid/process_groups.hpp"

#include "commgrid/creation_order.hpp"
#include "fingerprint.hpp"
#include "time_text.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <sstream>

namespace commgrid {
namespace {

using Clock = std::chrono::steady_clock;

std::string label_of(GroupKind k, int level) {
  std::string s(kind_name(k));
  if (k == GroupKind::hcp || k == GroupKind::hybrid_dp_cp) s += "[" + std::to_string(level) + "]";
  return s;
}

// Why a kind does not exist for a config.
std::string absent_reason(GroupKind k) {
  if (is_head_kind(k)) return "a Megatron-core HEAD kind: needs compat head and its option";
  return k == GroupKind::hcp ? "no hcp sizes given" : "dist_opt_instances = 1";
}

// Why a rank is in no group of a kind: the embedding policies, or (compat head) a rank
// outside the span HEAD lays out.
std::string why_no_group(GroupKind k) {
  if (k != GroupKind::embd && k != GroupKind::pos_embd)
    return "outside the ranks the layout covers (rank_offset / local_world_size)";
  return std::string("the ") + (k == GroupKind::embd ? "embedding" : "position-embedding") +
         " policy leaves it out";
}

std::string group_name(GroupKind k, int level, std::int64_t index) {
  return label_of(k, level) + "#" + std::to_string(index);
}

std::string list_text(std::span<const Rank> v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// Members as the backend wants them: ascending (a communicator numbers its ranks in
// ascending global order, as torch's new_group does).
std::vector<Rank> sorted_members(std::span<const Rank> members) {
  std::vector<Rank> out(members.begin(), members.end());
  std::sort(out.begin(), out.end());
  return out;
}

// ---- fingerprint ---------------------------------------------------------------------

std::string opt_text(const std::optional<std::int64_t>& v) {
  return v ? std::to_string(*v) : "none";
}

std::string policy_fingerprint(const ParallelConfig& config, const EmbeddingPolicies& p,
                               GroupKind k) {
  const EmbeddingPolicy& policy = k == GroupKind::embd ? p.embedding : p.position_embedding;
  if (!policy) return "default";
  // A function cannot be compared across processes, so compare what it returns on every
  // pipeline group. The groups are streamed one at a time from a layout without policies
  // (O(pp) memory, no list of the world's groups); the Layout that initialize makes after
  // the fingerprint checks the results themselves (rule 13), alike on every rank.
  try {
    const Layout plain(config);
    const std::int64_t groups = plain.num_groups(GroupKind::pp);
    const std::int64_t size = plain.group_size(GroupKind::pp).value_or(config.pp);
    std::vector<Rank> pp_group(static_cast<std::size_t>(size));
    detail::Fingerprint fp;
    for (std::int64_t g = 0; g < groups; ++g) {
      plain.members(GroupKind::pp, 0, g * size, pp_group);
      const std::vector<Rank> chosen = policy(pp_group);
      const auto n = static_cast<std::int64_t>(chosen.size());
      fp.bytes(&n, sizeof n).bytes(chosen.data(), chosen.size() * sizeof(Rank));
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fp.value()));
    return std::string("custom, results hash ") + hex;
  } catch (const std::exception& e) { return std::string("custom, fails: ") + e.what(); }
}

std::vector<std::pair<std::string, std::string>> fingerprint_fields(const ParallelConfig& c,
                                                                    const InitOptions& o) {
  std::string hcp;
  for (std::size_t i = 0; i < c.hcp.size(); ++i) hcp += (i ? "," : "") + std::to_string(c.hcp[i]);
  std::string kinds;
  for (std::size_t i = 0; i < o.kinds.size(); ++i)
    kinds += (i ? "," : "") + std::string(kind_name(o.kinds[i]));
  return {
      {"world_size", std::to_string(c.world_size)},
      {"tp", std::to_string(c.tp)},
      {"pp", std::to_string(c.pp)},
      {"cp", std::to_string(c.cp)},
      {"ep", std::to_string(c.ep)},
      {"etp", opt_text(c.etp)},
      {"hcp", hcp.empty() ? "none" : hcp},
      {"dist_opt_instances", std::to_string(c.dist_opt_instances)},
      {"vpp", opt_text(c.vpp)},
      {"order", "\"" + c.order + "\""},
      {"kinds", kinds.empty() ? "all" : kinds},
      {"strategy", std::string(strategy_name(o.strategy))},
      {"embedding policy", policy_fingerprint(c, o.policies, GroupKind::embd)},
      {"position-embedding policy", policy_fingerprint(c, o.policies, GroupKind::pos_embd)},
      // Catches any field added to ParallelConfig later but not listed above.
      {"config", c.canonical()},
  };
}

// "0-3,6,8-9", at most `limit` runs.
std::string rank_ranges(const std::vector<int>& ranks, std::size_t limit = 8) {
  std::string s;
  std::size_t runs = 0;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (runs == limit) {
      s += ",... (" + std::to_string(ranks.size()) + " ranks)";
      break;
    }
    s += (runs ? "," : "") + std::to_string(ranks[i]);
    if (j > i) s += "-" + std::to_string(ranks[j]);
    ++runs;
    i = j + 1;
  }
  return s;
}

}  // namespace

std::string_view strategy_name(CreationStrategy s) noexcept {
  switch (s) {
    case CreationStrategy::split: return "split";
    case CreationStrategy::member: return "member";
    case CreationStrategy::per_group: return "per-group";
  }
  return "unknown";
}

CreationStrategy parse_strategy(std::string_view name) {
  if (name == "split") return CreationStrategy::split;
  if (name == "member") return CreationStrategy::member;
  if (name == "per-group" || name == "per_group") return CreationStrategy::per_group;
  throw InvalidValueError("strategy", "strategy: unknown creation strategy \"" + std::string(name) +
                                          "\"; valid: split, member, per-group");
}

// ---- initialize / destroy ----------------------------------------------------------

ProcessGroups::~ProcessGroups() { destroy(); }

void ProcessGroups::exchange_fingerprint(Communicator& world, const ParallelConfig& config,
                                         const InitOptions& options) {
  const auto fields = fingerprint_fields(config, options);
  const std::size_t F = fields.size();
  // One max-allreduce gives every field's max and min hash: all ranks agree iff they are
  // equal. That costs O(F) whatever the world size; only a mismatch gathers more.
  std::vector<std::int64_t> buf(2 * F);
  for (std::size_t i = 0; i < F; ++i) {
    // 63 bits, so that negating it (for the min in the max-allreduce) cannot overflow.
    buf[i] = detail::Fingerprint().text(fields[i].second).value63();
    buf[F + i] = -buf[i];
  }
  world.allreduce(buf.data(), buf.data(), buf.size(), DataType::int64, ReduceOp::max)->wait();
  bool agree = true;
  for (std::size_t i = 0; i < F; ++i) agree = agree && buf[i] == -buf[F + i];
  if (agree) return;

  // Mismatch: gather every rank's values (padded to the longest) to name the first
  // differing field and who holds what. Every rank reaches this point, so nobody hangs.
  std::string mine;
  for (const auto& f : fields) mine += f.second + '\x1f';
  std::int64_t len = static_cast<std::int64_t>(mine.size());
  world.allreduce(&len, &len, 1, DataType::int64, ReduceOp::max)->wait();
  const std::size_t words = (static_cast<std::size_t>(len) + 7) / 8;
  std::vector<std::int64_t> send(words, 0);
  std::memcpy(send.data(), mine.data(), mine.size());
  const auto W = static_cast<std::size_t>(world.size());
  std::vector<std::int64_t> all(words * W, 0);
  world.allgather(send.data(), all.data(), words, DataType::int64)->wait();
  std::vector<std::vector<std::string>> values(W);
  for (std::size_t r = 0; r < W; ++r) {
    const char* p = reinterpret_cast<const char*>(all.data() + r * words);
    std::string_view text(p, strnlen(p, words * 8));
    std::size_t start = 0;
    for (std::size_t i = 0; i < F; ++i) {
      const std::size_t end = text.find('\x1f', start);
      values[r].emplace_back(
          text.substr(start, end == std::string_view::npos ? text.npos : end - start));
      start = end == std::string_view::npos ? text.size() : end + 1;
    }
  }
  for (std::size_t i = 0; i < F; ++i) {
    std::vector<std::pair<std::string, std::vector<int>>> holders;  // in order of first rank
    for (std::size_t r = 0; r < W; ++r) {
      auto it = std::find_if(holders.begin(), holders.end(),
                             [&](const auto& h) { return h.first == values[r][i]; });
      if (it == holders.end()) holders.push_back({values[r][i], {static_cast<int>(r)}});
      else it->second.push_back(static_cast<int>(r));
    }
    if (holders.size() < 2) continue;
    std::string msg = "config mismatch: ranks were given different " + fields[i].first + ": ";
    const std::size_t shown = std::min<std::size_t>(holders.size(), 6);
    for (std::size_t h = 0; h < shown; ++h)
      msg += (h ? "; " : "") + fields[i].first + " = " + holders[h].first + " on rank" +
             (holders[h].second.size() > 1 ? "s " : " ") + rank_ranges(holders[h].second);
    if (shown < holders.size())
      msg += "; and " + std::to_string(holders.size() - shown) + " more values";
    msg += " (every rank must get the same config and options)";
    throw ConfigMismatchError(fields[i].first, msg);
  }
  // Hashes differed but the texts agree: a hash is computed differently somewhere.
  COMMGRID_ENFORCE(false, "fingerprint hashes differ across ranks but every field agrees");
}

void ProcessGroups::initialize(Communicator& world, const ParallelConfig& config,
                               InitOptions options) {
  if (initialized_)
    throw StateError(
        "ProcessGroups::initialize: parallel state is already initialized; destroy it first");
  const auto t0 = Clock::now();
  // One deadline for the whole call (see the header); the world's timeout comes back after.
  world_timeout_ = world.timeout();
  init_deadline_ = t0 + world_timeout_;
  struct RestoreTimeout {
    Communicator& world;
    std::chrono::milliseconds timeout;
    ~RestoreTimeout() { world.set_timeout(timeout); }
  } restore{world, world_timeout_};
  // A backend timeout inside says what bounded it: the whole call, not that one step.
  auto whole_call = [&](const TimeoutError& e) {
    return TimeoutError(std::string(e.what()) + " (initialize: the world's timeout of " +
                        seconds_text(world_timeout_) + " bounds the whole call)");
  };
  try {
    before_world_call(world);
    exchange_fingerprint(world, config, options);
  } catch (const TimeoutError& e) { throw whole_call(e); }
  fingerprint_time_ = Clock::now() - t0;

  // Every rank holds the same config and options now, so each check below fails on
  // every rank alike and no rank is left waiting.
  Layout layout(config, options.policies);
  if (world.size() != config.world_size)
    throw InvalidValueError(
        "world_size", "world_size: the config says " + std::to_string(config.world_size) +
                          " ranks but the world communicator has " + std::to_string(world.size()));
  std::vector<GroupKind> kinds;
  if (options.kinds.empty()) {
    kinds = layout.kinds();
  } else {
    for (GroupKind k : all_kinds()) {  // reference order, whatever order was asked
      if (std::find(options.kinds.begin(), options.kinds.end(), k) == options.kinds.end()) continue;
      if (!layout.has_kind(k))
        throw UnknownKindError("kinds", "kinds: group kind \"" + std::string(kind_name(k)) +
                                            "\" does not exist for this config (" +
                                            absent_reason(k) + ")");
      kinds.push_back(k);
    }
  }

  layout_.emplace(std::move(layout));
  strategy_ = options.strategy;
  world_rank_ = world.rank();
  world_size_ = world.size();
  kinds_ = std::move(kinds);
  for (GroupKind k : all_kinds()) {
    auto& reason = not_created_[static_cast<int>(k)];
    if (!layout_->has_kind(k))
      reason =
          std::string(kind_name(k)) + " does not exist for this config (" + absent_reason(k) + ")";
    else if (std::find(kinds_.begin(), kinds_.end(), k) == kinds_.end())
      reason = std::string(kind_name(k)) + " was not created (not in InitOptions::kinds)";
    else reason.clear();
  }
  try {
    try {
      if (strategy_ == CreationStrategy::per_group) create_per_group(world, options);
      else create_split_or_member(world, options);
    } catch (const TimeoutError& e) { throw whole_call(e); }
  } catch (...) {
    initialized_ = true;  // so that destroy() releases what was made
    destroy();
    throw;
  }
  if (config.vpp) virtual_rank_ = 0;
  initialized_ = true;
}

void ProcessGroups::before_world_call(Communicator& world) const {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(init_deadline_ - Clock::now());
  world.set_timeout(std::max(std::chrono::milliseconds(1), left));
}

std::chrono::milliseconds ProcessGroups::group_timeout(const InitOptions& options) const {
  return options.timeout.value_or(world_timeout_);
}

void ProcessGroups::create_split_or_member(Communicator& world, const InitOptions& options) {
  // Kinds Megatron does not create but points at a parent's groups (creation_aliases; the
  // parent comes first in reference order) reuse the parent's communicator, as there.
  std::array<std::optional<GroupKind>, kNumKinds> parent_of;
  for (const CreationAlias& a : creation_aliases(*layout_, kinds_))
    parent_of[static_cast<int>(a.kind)] = a.parent;
  for (GroupKind k : kinds_) {
    auto& levels = slots_[static_cast<int>(k)];
    levels.resize(static_cast<std::size_t>(layout_->levels(k)));
    for (int level = 0; level < layout_->levels(k); ++level) {
      KindCreation st;
      st.kind = k;
      st.level = level;
      st.label = label_of(k, level);
      const auto t0 = Clock::now();
      const std::int64_t calls0 = world.creation_calls();
      Slot& s = levels[static_cast<std::size_t>(level)];
      s.ref = layout_->group_of(k, world_rank_, level);
      const std::optional<GroupKind> parent = parent_of[static_cast<int>(k)];
      if (parent && !slots_[static_cast<int>(*parent)].empty()) {
        s.comm = slots_[static_cast<int>(*parent)][static_cast<std::size_t>(level)].comm;
        st.alias = true;
      } else {
        const std::string name = s.ref ? group_name(k, level, s.ref->index) : std::string();
        std::unique_ptr<Communicator> comm;
        before_world_call(world);
        if (strategy_ == CreationStrategy::split) {
          comm = world.split(s.ref ? std::optional<std::int64_t>(s.ref->index) : std::nullopt,
                             world_rank_, s.ref ? name : label_of(k, level) + "#none");
        } else if (s.ref) {
          const std::vector<Rank> members = sorted_members(s.ref->members);
          comm = world.create_group(members, name);
        }
        COMMGRID_ENFORCE(static_cast<bool>(comm) == s.ref.has_value(),
                         "backend gave " + std::string(comm ? "a" : "no") + " communicator for " +
                             label_of(k, level) + " on rank " + std::to_string(world_rank_));
        if (comm) comm->set_timeout(group_timeout(options));
        s.comm = std::shared_ptr<Communicator>(std::move(comm));
        if (s.comm) created_.push_back(s.comm);
      }
      if (s.ref) {
        COMMGRID_ENFORCE(
            s.comm->size() == static_cast<Rank>(s.ref->members.size()) &&
                s.comm->rank() == s.ref->comm_rank,
            "communicator " + s.comm->name() + " has rank " + std::to_string(s.comm->rank()) +
                " of " + std::to_string(s.comm->size()) + ", the layout says " +
                std::to_string(s.ref->comm_rank) + " of " + std::to_string(s.ref->members.size()));
      } else {
        s.no_group_reason = "rank " + std::to_string(world_rank_) + " is in no " +
                            label_of(k, level) + " group (" + why_no_group(k) + ")";
      }
      st.time = Clock::now() - t0;
      st.creation_calls = world.creation_calls() - calls0;
      stats_.push_back(std::move(st));
    }
  }
}

void ProcessGroups::create_per_group(Communicator& world, const InitOptions& options) {
  const Layout& L = *layout_;
  // Per (kind, level): this rank's group from the closed form, and the cost so far.
  std::array<std::vector<KindCreation>, kNumKinds> stats;
  for (GroupKind k : kinds_) {
    auto& levels = slots_[static_cast<int>(k)];
    levels.resize(static_cast<std::size_t>(L.levels(k)));
    for (int level = 0; level < L.levels(k); ++level) {
      levels[static_cast<std::size_t>(level)].ref = L.group_of(k, world_rank_, level);
      KindCreation st;
      st.kind = k;
      st.level = level;
      st.label = label_of(k, level);
      stats[static_cast<int>(k)].push_back(std::move(st));
    }
  }
  // Every rank creates every group, members or not.
  auto create = [&](GroupKind k, int level, std::int64_t index, std::span<const Rank> members) {
    KindCreation& st = stats[static_cast<int>(k)][static_cast<std::size_t>(level)];
    const auto t0 = Clock::now();
    const std::int64_t calls0 = world.creation_calls();
    const std::vector<Rank> sorted = sorted_members(members);
    before_world_call(world);
    std::unique_ptr<Communicator> comm =
        world.create_group_collective(sorted, group_name(k, level, index));
    Slot& s = slots_[static_cast<int>(k)][static_cast<std::size_t>(level)];
    const bool mine = s.ref && s.ref->index == index;
    COMMGRID_ENFORCE(static_cast<bool>(comm) == mine,
                     "backend gave " + std::string(comm ? "a" : "no") + " communicator for " +
                         group_name(k, level, index) + " " + list_text(members) + " on rank " +
                         std::to_string(world_rank_));
    if (comm) {
      comm->set_timeout(group_timeout(options));
      s.comm = std::shared_ptr<Communicator>(std::move(comm));
      created_.push_back(s.comm);
    }
    st.time += Clock::now() - t0;
    st.creation_calls += world.creation_calls() - calls0;
  };
  // Megatron's sequence for the config's compat (creation_order.hpp): the seed's, or HEAD's.
  for_each_creation(L, kinds_, create);

  // Kinds Megatron points at another kind's groups (intra_dp_cp with one instance, the gtp
  // variants with gtp sizes of 1, ...) reuse that kind's communicators.
  for (const CreationAlias& a : creation_aliases(L, kinds_)) {
    auto& alias = slots_[static_cast<int>(a.kind)];
    const auto& parent = slots_[static_cast<int>(a.parent)];
    for (std::size_t level = 0; level < alias.size(); ++level)
      alias[level].comm = parent[level].comm;
    for (KindCreation& st : stats[static_cast<int>(a.kind)]) st.alias = true;
  }
  for (GroupKind k : kinds_) {
    for (int level = 0; level < L.levels(k); ++level) {
      Slot& s = slots_[static_cast<int>(k)][static_cast<std::size_t>(level)];
      COMMGRID_ENFORCE(static_cast<bool>(s.comm) == s.ref.has_value(),
                       "per-group creation left " + label_of(k, level) + " on rank " +
                           std::to_string(world_rank_) +
                           (s.comm ? " with an extra" : " without a") + " communicator");
      if (!s.ref)
        s.no_group_reason = "rank " + std::to_string(world_rank_) + " is in no " +
                            label_of(k, level) + " group (" + why_no_group(k) + ")";
      stats_.push_back(std::move(stats[static_cast<int>(k)][static_cast<std::size_t>(level)]));
    }
  }
}

void ProcessGroups::destroy() noexcept {
  if (!initialized_) return;
  for (auto& levels : slots_) levels.clear();
  // Release in reverse creation order: the last reference of each goes here unless a
  // collection still holds it.
  while (!created_.empty()) created_.pop_back();
  for (auto& r : not_created_) r.clear();
  kinds_.clear();
  stats_.clear();
  layout_.reset();
  virtual_rank_.reset();
  fingerprint_time_ = {};
  world_rank_ = world_size_ = 0;
  initialized_ = false;
}

// ---- getters -----------------------------------------------------------------------

void ProcessGroups::require(const char* call) const {
  if (!initialized_)
    throw StateError(std::string("ProcessGroups::") + call +
                     ": parallel state is not initialized; call initialize() first");
}

const ProcessGroups::Slot& ProcessGroups::slot(GroupKind k, int level, const char* call) const {
  require(call);
  const auto& levels = slots_[static_cast<int>(k)];
  if (levels.empty())
    throw NoGroupError(std::string("ProcessGroups::") + call + "(" + std::string(kind_name(k)) +
                       "): " + not_created_[static_cast<int>(k)]);
  if (level < 0 || level >= static_cast<int>(levels.size()))
    throw ConfigError("level", std::string("ProcessGroups::") + call + "(" +
                                   std::string(kind_name(k)) + "): level " + std::to_string(level) +
                                   " out of range [0, " + std::to_string(levels.size()) + ")");
  return levels[static_cast<std::size_t>(level)];
}

const ProcessGroups::Slot& ProcessGroups::member_slot(GroupKind k, int level,
                                                      const char* call) const {
  const Slot& s = slot(k, level, call);
  if (!s.ref)
    throw NoGroupError(std::string("ProcessGroups::") + call + "(" + label_of(k, level) +
                       "): " + s.no_group_reason);
  return s;
}

const Layout& ProcessGroups::layout() const {
  require("layout");
  return *layout_;
}
const ParallelConfig& ProcessGroups::config() const {
  require("config");
  return layout_->config();
}
CreationStrategy ProcessGroups::strategy() const {
  require("strategy");
  return strategy_;
}
Rank ProcessGroups::world_rank() const {
  require("world_rank");
  return world_rank_;
}
Rank ProcessGroups::world_size() const {
  require("world_size");
  return world_size_;
}
const std::vector<GroupKind>& ProcessGroups::kinds() const {
  require("kinds");
  return kinds_;
}

bool ProcessGroups::has_group(GroupKind k, int level) const {
  require("has_group");
  const auto& levels = slots_[static_cast<int>(k)];
  if (level < 0 || level >= static_cast<int>(levels.size())) return false;
  return levels[static_cast<std::size_t>(level)].ref.has_value();
}

std::string ProcessGroups::no_group_reason(GroupKind k, int level) const {
  require("no_group_reason");
  const auto& levels = slots_[static_cast<int>(k)];
  if (levels.empty()) return not_created_[static_cast<int>(k)];
  if (level < 0 || level >= static_cast<int>(levels.size()))
    return label_of(k, level) + " does not exist (hcp has " + std::to_string(levels.size()) +
           " levels)";
  return levels[static_cast<std::size_t>(level)].no_group_reason;
}

Communicator& ProcessGroups::group(GroupKind k, int level) const {
  return *member_slot(k, level, "group").comm;
}

std::shared_ptr<Communicator> ProcessGroups::group_handle(GroupKind k, int level) const {
  require("group_handle");
  const auto& levels = slots_[static_cast<int>(k)];
  if (level < 0 || level >= static_cast<int>(levels.size())) return nullptr;
  return levels[static_cast<std::size_t>(level)].comm;
}

Rank ProcessGroups::size(GroupKind k, int level) const {
  return static_cast<Rank>(member_slot(k, level, "size").ref->members.size());
}

Rank ProcessGroups::rank(GroupKind k, int level) const {
  return member_slot(k, level, "rank").ref->comm_rank;
}

const std::vector<Rank>& ProcessGroups::global_ranks(GroupKind k, int level) const {
  return member_slot(k, level, "global_ranks").ref->members;
}

std::int64_t ProcessGroups::group_index(GroupKind k, int level) const {
  return member_slot(k, level, "group_index").ref->index;
}

Rank ProcessGroups::tensor_model_parallel_src_rank() const {
  return member_slot(GroupKind::tp, 0, "tensor_model_parallel_src_rank").ref->members.front();
}

Rank ProcessGroups::model_parallel_src_rank() const {
  return member_slot(GroupKind::mp, 0, "model_parallel_src_rank").ref->members.front();
}

Rank ProcessGroups::data_parallel_src_rank(bool with_cp) const {
  return member_slot(with_cp ? GroupKind::dp_cp : GroupKind::dp, 0, "data_parallel_src_rank")
      .ref->members.front();
}

namespace {
GroupKind dp_kind(bool with_cp, bool partial, const char* call) {
  if (partial && !with_cp)
    throw InvalidValueError("partial_data_parallel",
                            std::string("ProcessGroups::") + call +
                                ": partial data parallel needs with_context_parallel (the "
                                "distributed optimizer's partial groups include cp)");
  return partial ? GroupKind::intra_dp_cp : with_cp ? GroupKind::dp_cp : GroupKind::dp;
}
}  // namespace

Rank ProcessGroups::data_parallel_rank(bool with_cp, bool partial) const {
  const GroupKind k = dp_kind(with_cp, partial, "data_parallel_rank");
  return member_slot(k, 0, "data_parallel_rank").ref->comm_rank;
}

Rank ProcessGroups::data_parallel_size(bool with_cp, bool partial) const {
  const GroupKind k = dp_kind(with_cp, partial, "data_parallel_size");
  return static_cast<Rank>(member_slot(k, 0, "data_parallel_size").ref->members.size());
}

Rank ProcessGroups::expert_data_parallel_rank(bool partial) const {
  const GroupKind k = partial ? GroupKind::intra_expt_dp : GroupKind::expt_dp;
  return member_slot(k, 0, "expert_data_parallel_rank").ref->comm_rank;
}

Rank ProcessGroups::expert_data_parallel_size(bool partial) const {
  const GroupKind k = partial ? GroupKind::intra_expt_dp : GroupKind::expt_dp;
  return static_cast<Rank>(member_slot(k, 0, "expert_data_parallel_size").ref->members.size());
}

Rank ProcessGroups::pipeline_first_rank() const {
  return member_slot(GroupKind::pp, 0, "pipeline_first_rank").ref->members.front();
}

Rank ProcessGroups::pipeline_last_rank() const {
  return member_slot(GroupKind::pp, 0, "pipeline_last_rank").ref->members.back();
}

Rank ProcessGroups::pipeline_next_rank() const {
  const GroupRef& g = *member_slot(GroupKind::pp, 0, "pipeline_next_rank").ref;
  const auto n = static_cast<std::int64_t>(g.members.size());
  return g.members[static_cast<std::size_t>((g.position + 1) % n)];
}

Rank ProcessGroups::pipeline_prev_rank() const {
  const GroupRef& g = *member_slot(GroupKind::pp, 0, "pipeline_prev_rank").ref;
  const auto n = static_cast<std::int64_t>(g.members.size());
  return g.members[static_cast<std::size_t>((g.position + n - 1) % n)];
}

void ProcessGroups::check_stage(std::optional<Rank> vstage, const char* call) const {
  if (!vstage) return;
  const auto& vpp = layout_->config().vpp;
  if (!vpp)
    throw InvalidValueError("vstage", std::string("ProcessGroups::") + call + ": virtual stage " +
                                          std::to_string(*vstage) + " given but vpp is not set");
  if (*vstage < 0 || *vstage >= *vpp)
    throw InvalidValueError("vstage", std::string("ProcessGroups::") + call + ": virtual stage " +
                                          std::to_string(*vstage) + " out of range [0, " +
                                          std::to_string(*vpp) + ")");
}

bool ProcessGroups::is_pipeline_first_stage(std::optional<Rank> vstage) const {
  require("is_pipeline_first_stage");
  check_stage(vstage, "is_pipeline_first_stage");
  // The pp coordinate comes from the layout, so this works without the pp kind created.
  if (layout_->coordinates(world_rank_).pp != 0) return false;
  return !vstage || *vstage == 0;
}

bool ProcessGroups::is_pipeline_last_stage(std::optional<Rank> vstage) const {
  require("is_pipeline_last_stage");
  check_stage(vstage, "is_pipeline_last_stage");
  if (layout_->coordinates(world_rank_).pp != layout_->config().pp - 1) return false;
  return !vstage || *vstage == *layout_->config().vpp - 1;
}

bool ProcessGroups::is_rank_in_embedding_group(std::optional<Rank> vstage) const {
  require("is_rank_in_embedding_group");
  check_stage(vstage, "is_rank_in_embedding_group");
  const auto g = layout_->group_of(GroupKind::embd, world_rank_);
  if (!g) return false;
  if (!vstage) return true;
  if (world_rank_ == g->members.front()) return is_pipeline_first_stage(vstage);
  if (world_rank_ == g->members.back()) return is_pipeline_last_stage(vstage);
  return true;
}

bool ProcessGroups::is_rank_in_position_embedding_group() const {
  require("is_rank_in_position_embedding_group");
  return layout_->group_of(GroupKind::pos_embd, world_rank_).has_value();
}

std::optional<Rank> ProcessGroups::virtual_pipeline_rank() const {
  require("virtual_pipeline_rank");
  return virtual_rank_;
}

void ProcessGroups::set_virtual_pipeline_rank(Rank vrank) {
  require("set_virtual_pipeline_rank");
  const auto& vpp = layout_->config().vpp;
  if (!vpp)
    throw InvalidValueError("vrank",
                            "ProcessGroups::set_virtual_pipeline_rank: vpp is not set, "
                            "so there is no virtual pipeline rank");
  if (vrank < 0 || vrank >= *vpp)
    throw InvalidValueError("vrank",
                            "ProcessGroups::set_virtual_pipeline_rank: " + std::to_string(vrank) +
                                " out of range [0, " + std::to_string(*vpp) + ")");
  virtual_rank_ = vrank;
}

std::optional<Rank> ProcessGroups::virtual_pipeline_size() const {
  require("virtual_pipeline_size");
  const auto& vpp = layout_->config().vpp;
  return vpp ? std::optional<Rank>(*vpp) : std::nullopt;
}

Communicator& ProcessGroups::amax_reduction_group(bool with_cp, bool tp_only) const {
  const GroupKind k = with_cp ? (tp_only ? GroupKind::tp_cp : GroupKind::tp_dp_cp)
                              : (tp_only ? GroupKind::tp : GroupKind::tp_dp);
  return *member_slot(k, 0, "amax_reduction_group").comm;
}

std::string ProcessGroups::all_ranks() const {
  require("all_ranks");
  // From the layout, so that it answers whichever kinds were created.
  std::string s;
  for (GroupKind k : {GroupKind::tp, GroupKind::dp, GroupKind::cp, GroupKind::pp, GroupKind::ep})
    s += (s.empty() ? "" : "_") + std::to_string(layout_->group_of(k, world_rank_)->comm_rank);
  return s;
}

const std::vector<KindCreation>& ProcessGroups::creation_stats() const {
  require("creation_stats");
  return stats_;
}

std::chrono::nanoseconds ProcessGroups::fingerprint_time() const {
  require("fingerprint_time");
  return fingerprint_time_;
}

}  // namespace commgrid
