// ProcessGroups' life: the creation strategies' names, initialize (fingerprint, then every
// kind's communicators by split, member or per-group creation, under one deadline) and
// destroy.
#include <algorithm>
#include <array>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commgrid/creation_order.hpp"
#include "commgrid/process_groups.hpp"
#include "group_label.hpp"
#include "time_text.hpp"

namespace commgrid {
namespace {

using Clock = std::chrono::steady_clock;
using detail::label_of;

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
    // A destructor must not throw: a backend that cannot re-apply the old timeout leaves the
    // world with the call's shorter one, and its next operation says so by timing out early.
    ~RestoreTimeout() {
      try {
        world.set_timeout(timeout);
      } catch (...) {  // NOLINT(bugprone-empty-catch): see above
      }
    }
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
  const auto created_from = Clock::now();
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
  creation_time_ = Clock::now() - created_from;
  if (config.vpp) virtual_rank_ = 0;
  initialized_ = true;
}

void ProcessGroups::initialize(std::shared_ptr<Communicator> world, const ParallelConfig& config,
                               InitOptions options) {
  if (!world) throw InvalidValueError("world", "ProcessGroups::initialize: world is null");
  shared_world_ = std::move(world);
  struct Forget {
    std::shared_ptr<Communicator>& world;
    ~Forget() { world.reset(); }  // the groups that reuse it hold their own reference
  } forget{shared_world_};
  initialize(*shared_world_, config, std::move(options));
}

void ProcessGroups::before_world_call(Communicator& world) const {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(init_deadline_ - Clock::now());
  world.set_timeout(std::max(std::chrono::milliseconds(1), left));
}

std::chrono::milliseconds ProcessGroups::group_timeout(const InitOptions& options) const {
  return options.timeout.value_or(world_timeout_);
}

std::vector<ProcessGroups::Made> ProcessGroups::create_members_at_once(
    Communicator& world, const std::array<std::optional<GroupKind>, kNumKinds>& parent_of,
    bool share_identical, bool reuse_world) {
  // This rank's group of every (kind, level) that is not an alias, in reference order (the
  // same relative order on every member: see Communicator::create_groups). Sharing: a
  // group whose members another group of this rank already has is not made again; every
  // member of it sees the same earlier group, so every member leaves out the same specs.
  // With reuse_world, a group of every rank is the world itself (every rank decides alike).
  constexpr std::size_t kWorld = static_cast<std::size_t>(-1);
  std::vector<GroupSpec> specs;
  std::vector<std::size_t> spec_of;  // made[i]'s group is specs[spec_of[i]], or the world
  std::vector<Made> made;
  // Every group of the layout numbered, kind after kind (GroupSpec::index), alike on
  // every rank: the kinds and the layout are the same everywhere.
  std::int64_t first_of_kind = 0;
  for (GroupKind k : kinds_) {
    if (parent_of[static_cast<int>(k)]) continue;
    for (int level = 0; level < layout_->levels(k); ++level) {
      const std::int64_t first = first_of_kind;
      first_of_kind += layout_->num_groups(k, level);
      const std::optional<GroupRef> ref = layout_->group_of(k, world_rank_, level);
      if (!ref) continue;
      std::vector<Rank> members = sorted_members(ref->members);
      if (reuse_world && static_cast<Rank>(members.size()) == world_size_) {
        spec_of.push_back(kWorld);
        made.push_back({k, level, nullptr, {}, true});
        continue;
      }
      const auto same = share_identical
                            ? std::find_if(specs.begin(), specs.end(),
                                           [&](const GroupSpec& g) { return g.members == members; })
                            : specs.end();
      const bool reuses = same != specs.end();
      spec_of.push_back(reuses ? static_cast<std::size_t>(same - specs.begin()) : specs.size());
      if (!reuses)
        specs.push_back({std::move(members), group_name(k, level, ref->index), first + ref->index});
      made.push_back({k, level, nullptr, {}, reuses});
    }
  }
  before_world_call(world);
  const auto t0 = Clock::now();
  std::vector<std::chrono::nanoseconds> usable(specs.size());
  std::vector<std::unique_ptr<Communicator>> comms =
      world.create_groups(specs, [&](std::size_t i) { usable[i] = Clock::now() - t0; });
  COMMGRID_ENFORCE(comms.size() == specs.size(),
                   "backend gave " + std::to_string(comms.size()) + " communicators for " +
                       std::to_string(specs.size()) + " groups on rank " +
                       std::to_string(world_rank_));
  const std::vector<std::shared_ptr<Communicator>> shared(std::make_move_iterator(comms.begin()),
                                                          std::make_move_iterator(comms.end()));
  for (std::size_t i = 0; i < made.size(); ++i) {
    if (spec_of[i] == kWorld) {
      made[i].comm = shared_world_;
      continue;
    }
    made[i].comm = shared[spec_of[i]];
    if (!made[i].reuses) made[i].time = usable[spec_of[i]];
  }
  return made;
}

void ProcessGroups::create_split_or_member(Communicator& world, const InitOptions& options) {
  // Kinds Megatron does not create but points at a parent's groups (creation_aliases; the
  // parent comes first in reference order) reuse the parent's communicator, as there.
  std::array<std::optional<GroupKind>, kNumKinds> parent_of;
  for (const CreationAlias& a : creation_aliases(*layout_, kinds_))
    parent_of[static_cast<int>(a.kind)] = a.parent;
  // Member creation: every group of this rank in one call (a backend makes them at once).
  std::vector<Made> at_once;
  if (options.share_identical_groups && strategy_ != CreationStrategy::member)
    throw InvalidValueError("share_identical_groups",
                            "share_identical_groups: needs the member strategy (strategy is " +
                                std::string(strategy_name(strategy_)) + ")");
  if (strategy_ == CreationStrategy::member)
    at_once = create_members_at_once(world, parent_of, options.share_identical_groups,
                                     options.share_identical_groups && shared_world_ &&
                                         group_timeout(options) == world_timeout_);
  auto next_made = at_once.begin();
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
        std::shared_ptr<Communicator> comm;
        bool reuses = false;  // share_identical_groups: an earlier kind's communicator
        before_world_call(world);
        if (strategy_ == CreationStrategy::split) {
          comm = world.split(s.ref ? std::optional<std::int64_t>(s.ref->index) : std::nullopt,
                             world_rank_, s.ref ? name : label_of(k, level) + "#none");
        } else if (s.ref) {
          COMMGRID_ENFORCE(
              next_made != at_once.end() && next_made->kind == k && next_made->level == level,
              "no communicator made for " + label_of(k, level));
          comm = next_made->comm;
          reuses = next_made->reuses;
          st.time = next_made->time;
          st.creation_calls = reuses ? 0 : 1;
          st.alias = reuses;
          ++next_made;
        }
        COMMGRID_ENFORCE(static_cast<bool>(comm) == s.ref.has_value(),
                         "backend gave " + std::string(comm ? "a" : "no") + " communicator for " +
                             label_of(k, level) + " on rank " + std::to_string(world_rank_));
        if (comm && !reuses) {
          comm->set_timeout(group_timeout(options));
          created_.push_back(comm);
        }
        s.comm = std::move(comm);
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
      if (strategy_ != CreationStrategy::member) {
        st.time = Clock::now() - t0;
        st.creation_calls = world.creation_calls() - calls0;
      }
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
  creation_time_ = {};
  world_rank_ = world_size_ = 0;
  initialized_ = false;
}

}  // namespace commgrid
