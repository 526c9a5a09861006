#include "commgrid/layout.hpp"

#include <algorithm>

#include "commgrid/error.hpp"

namespace commgrid {
namespace {

std::string list_text(std::span<const Rank> v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// The masked axes of each kind that is a plain grid kind, and which grid it lives on.
struct GridKind {
  bool expert = false;
  AxisSet mask;
};

std::optional<GridKind> grid_kind(GroupKind k) {
  switch (k) {
    case GroupKind::tp: return GridKind{false, {Axis::tp}};
    case GroupKind::cp: return GridKind{false, {Axis::cp}};
    case GroupKind::dp: return GridKind{false, {Axis::dp}};
    case GroupKind::pp: return GridKind{false, {Axis::pp}};
    case GroupKind::mp: return GridKind{false, {Axis::tp, Axis::pp}};
    case GroupKind::dp_cp: return GridKind{false, {Axis::dp, Axis::cp}};
    case GroupKind::tp_cp: return GridKind{false, {Axis::tp, Axis::cp}};
    case GroupKind::tp_dp: return GridKind{false, {Axis::tp, Axis::dp}};
    case GroupKind::tp_dp_cp: return GridKind{false, {Axis::tp, Axis::dp, Axis::cp}};
    case GroupKind::ep: return GridKind{true, {Axis::ep}};
    case GroupKind::expt_tp: return GridKind{true, {Axis::tp}};
    case GroupKind::tp_ep: return GridKind{true, {Axis::tp, Axis::ep}};
    case GroupKind::tp_ep_pp: return GridKind{true, {Axis::tp, Axis::ep, Axis::pp}};
    case GroupKind::expt_dp: return GridKind{true, {Axis::dp}};
    default: return std::nullopt;
  }
}

std::array<std::int64_t, kNumAxes> sizes(std::int64_t tp, std::int64_t cp, std::int64_t ep,
                                         std::int64_t dp, std::int64_t pp) {
  std::array<std::int64_t, kNumAxes> s{};
  s[static_cast<int>(Axis::tp)] = tp;
  s[static_cast<int>(Axis::cp)] = cp;
  s[static_cast<int>(Axis::ep)] = ep;
  s[static_cast<int>(Axis::dp)] = dp;
  s[static_cast<int>(Axis::pp)] = pp;
  return s;
}

const ParallelConfig& validated(const ParallelConfig& c) {
  c.validate();
  return c;
}

// u, s and l of level `level` of a hierarchical split (spec §7).
struct Level {
  std::int64_t u = 1, s = 1;
};
Level level_of(std::span<const std::int64_t> sizes, int level) {
  Level v;
  for (int i = 0; i < level; ++i) v.u *= sizes[static_cast<std::size_t>(i)];
  v.s = sizes[static_cast<std::size_t>(level)];
  return v;
}

// Rank at position p of a parent list: its level group (indices into the parent) and the
// group's index among the parent's level groups.
std::pair<std::int64_t, std::vector<std::int64_t>> split_group_of(
    std::int64_t p, std::span<const std::int64_t> sizes, int level) {
  const Level v = level_of(sizes, level);
  const std::int64_t d = (p / v.u) % v.s;
  std::vector<std::int64_t> idx(static_cast<std::size_t>(v.s));
  for (std::int64_t t = 0; t < v.s; ++t) idx[static_cast<std::size_t>(t)] = p + (t - d) * v.u;
  const std::int64_t a = p / (v.u * v.s), b = p % v.u;
  return {a * v.u + b, idx};
}

GroupRef make_ref(std::int64_t index, Rank r, std::vector<Rank> members) {
  GroupRef g;
  g.index = index;
  const auto it = std::find(members.begin(), members.end(), r);
  g.position = it - members.begin();
  g.comm_rank = std::count_if(members.begin(), members.end(), [r](Rank m) { return m < r; });
  g.members = std::move(members);
  return g;
}

}  // namespace

void hierarchical_split(std::span<const Rank> parent, std::span<const std::int64_t> sizes,
                        int level, GroupList& out) {
  const Level v = level_of(sizes, level);
  const std::int64_t L = static_cast<std::int64_t>(parent.size());
  const std::int64_t l = L / (v.u * v.s);
  std::vector<Rank> group(static_cast<std::size_t>(v.s));
  for (std::int64_t a = 0; a < l; ++a)
    for (std::int64_t b = 0; b < v.u; ++b) {
      for (std::int64_t t = 0; t < v.s; ++t)
        group[static_cast<std::size_t>(t)] =
            parent[static_cast<std::size_t>(a * v.s * v.u + t * v.u + b)];
      out.push_back(group);
    }
}

Layout::Layout(ParallelConfig config, EmbeddingPolicies policies)
    : config_(std::move(config)),
      policies_(std::move(policies)),
      dp_(validated(config_).dp()),
      edp_(config_.expert_dp()),
      dense_(sizes(config_.tp, config_.cp, 1, dp_, config_.pp), config_.resolved_order()),
      expert_(sizes(config_.expert_tp(), 1, config_.ep, edp_, config_.pp),
              config_.resolved_order()) {
  if (policies_.embedding || policies_.position_embedding) check_policy_results();
}

bool Layout::has_kind(GroupKind k) const noexcept {
  if (k == GroupKind::hcp) return !config_.hcp.empty();
  if (k == GroupKind::inter_dist_opt) return config_.dist_opt_instances > 1;
  return true;
}

std::vector<GroupKind> Layout::kinds() const {
  std::vector<GroupKind> out;
  for (GroupKind k : all_kinds())
    if (has_kind(k)) out.push_back(k);
  return out;
}

int Layout::levels(GroupKind k) const noexcept {
  return k == GroupKind::hcp ? static_cast<int>(config_.hcp.size()) : 1;
}

void Layout::check_rank(Rank r) const {
  if (r < 0 || r >= world_size())
    throw RankOutOfRangeError("rank", "rank " + std::to_string(r) + " out of range [0, " +
                                          std::to_string(world_size()) + ")");
}

void Layout::check_kind(GroupKind k, int level) const {
  if (!has_kind(k))
    throw UnknownKindError(
        "kinds", "group kind \"" + std::string(kind_name(k)) + "\" does not exist for this config (" +
                     (k == GroupKind::hcp ? "no hcp sizes given" : "dist_opt_instances = 1") + ")");
  if (level < 0 || level >= levels(k))
    throw ConfigError("level", "level " + std::to_string(level) + " out of range [0, " +
                                   std::to_string(levels(k)) + ") for group kind \"" +
                                   std::string(kind_name(k)) + "\"");
}

std::vector<Rank> Layout::embedding_members(GroupKind k, std::span<const Rank> pp_group) const {
  const EmbeddingPolicy& policy =
      k == GroupKind::embd ? policies_.embedding : policies_.position_embedding;
  if (policy) return policy(pp_group);
  if (k == GroupKind::pos_embd || pp_group.size() == 1) return {pp_group.front()};
  return {pp_group.front(), pp_group.back()};
}

GroupList Layout::default_embedding_groups(GroupKind k) const {
  // The pp groups' first members are the ranks whose pp coordinate is 0, ascending; the
  // last members are those plus (pp-1) pp strides. No pp group is materialized.
  const std::int64_t P = config_.pp, S = dense_.stride(Axis::pp);
  const std::int64_t n = world_size() / P;
  const bool two = k == GroupKind::embd && P > 1;
  GroupList out;
  Rank* dst = out.assign_uniform(static_cast<std::size_t>(n), two ? 2 : 1).data();
  const Rank last = (P - 1) * S;
  for (Rank block = 0; block < world_size(); block += S * P)
    for (Rank r = block; r < block + S; ++r) {
      *dst++ = r;
      if (two) *dst++ = r + last;
    }
  return out;
}

void Layout::check_policy_results() const {
  const GroupList pp_groups = dense_.groups({Axis::pp});
  for (GroupKind k : {GroupKind::embd, GroupKind::pos_embd}) {
    const char* what = k == GroupKind::embd ? "embedding policy" : "position-embedding policy";
    for (std::size_t i = 0; i < pp_groups.size(); ++i) {
      const auto group = pp_groups[i];
      const std::vector<Rank> got = embedding_members(k, group);
      const std::string head = std::string(what) + " returned " + list_text(got) +
                               " for pipeline group " + list_text(group) + ": ";
      if (got.empty()) throw PolicyError(what, head + "the group is empty");
      for (std::size_t j = 0; j < got.size(); ++j) {
        if (std::find(group.begin(), group.end(), got[j]) == group.end())
          throw PolicyError(what, head + "rank " + std::to_string(got[j]) +
                                      " is not in that group");
        if (std::find(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(j), got[j]) !=
            got.begin() + static_cast<std::ptrdiff_t>(j))
          throw PolicyError(what, head + "rank " + std::to_string(got[j]) + " appears twice");
      }
    }
  }
}

std::int64_t Layout::num_groups(GroupKind k, int level) const {
  check_kind(k, level);
  const std::int64_t W = world_size(), N = config_.dist_opt_instances;
  if (auto g = grid_kind(k)) return (g->expert ? expert_ : dense_).num_groups(g->mask);
  switch (k) {
    case GroupKind::embd:
    case GroupKind::pos_embd: return W / config_.pp;
    case GroupKind::hcp: return W / config_.hcp[static_cast<std::size_t>(level)];
    case GroupKind::intra_dp_cp: return N * W / (dp_ * config_.cp);
    case GroupKind::intra_expt_dp: return N * W / edp_;
    case GroupKind::inter_dist_opt: return W / N;
    case GroupKind::intra_dist_opt: return N;
    default: COMMGRID_ENFORCE(false, "unhandled kind " + std::string(kind_name(k)));
  }
}

GroupList Layout::groups(GroupKind k, int level) const {
  check_kind(k, level);
  if (auto g = grid_kind(k)) return (g->expert ? expert_ : dense_).groups(g->mask);
  const std::int64_t N = config_.dist_opt_instances;
  GroupList out;
  switch (k) {
    case GroupKind::embd:
    case GroupKind::pos_embd: {
      const EmbeddingPolicy& policy =
          k == GroupKind::embd ? policies_.embedding : policies_.position_embedding;
      if (!policy) return default_embedding_groups(k);
      const GroupList pp_groups = dense_.groups({Axis::pp});
      out.reserve(pp_groups.size(), pp_groups.size() * 2);
      for (std::size_t i = 0; i < pp_groups.size(); ++i)
        out.push_back(embedding_members(k, pp_groups[i]));
      return out;
    }
    case GroupKind::hcp: {
      const GroupList cp_groups = dense_.groups({Axis::cp});
      for (std::size_t i = 0; i < cp_groups.size(); ++i)
        hierarchical_split(cp_groups[i], config_.hcp, level, out);
      return out;
    }
    case GroupKind::intra_dp_cp:
    case GroupKind::intra_expt_dp: {
      // Level 0 of [size/N, N] is consecutive chunks of each parent: the parents' members
      // in the same order, cut N times finer.
      out = k == GroupKind::intra_dp_cp ? dense_.groups({Axis::dp, Axis::cp})
                                        : expert_.groups({Axis::dp});
      out.regroup(out.empty() ? 1 : out[0].size() / static_cast<std::size_t>(N));
      return out;
    }
    case GroupKind::inter_dist_opt: {
      const GroupList parents = expert_.groups({Axis::dp});
      const std::array<std::int64_t, 2> split = {edp_ / N, N};
      out.reserve(parents.size() * static_cast<std::size_t>(edp_ / N), parents.members().size());
      for (std::size_t i = 0; i < parents.size(); ++i) hierarchical_split(parents[i], split, 1, out);
      return out;
    }
    case GroupKind::intra_dist_opt: {
      // Runs of edp/N consecutive tp_ep_pp groups, concatenated in list order.
      const GroupList parts = expert_.groups({Axis::tp, Axis::ep, Axis::pp});
      const std::size_t run = static_cast<std::size_t>(edp_ / N);
      const std::size_t per = parts.empty() ? 0 : parts[0].size();
      std::span<Rank> buf = out.assign_uniform(static_cast<std::size_t>(N), run * per);
      std::copy(parts.members().begin(), parts.members().end(), buf.begin());
      return out;
    }
    default: COMMGRID_ENFORCE(false, "unhandled kind " + std::string(kind_name(k)));
  }
}

std::optional<GroupRef> Layout::group_of(GroupKind k, Rank r, int level) const {
  check_rank(r);
  check_kind(k, level);
  if (auto g = grid_kind(k)) {
    const RankGrid& grid = g->expert ? expert_ : dense_;
    GroupRef ref;
    ref.index = grid.group_index(g->mask, r);
    ref.position = grid.position(g->mask, r);
    ref.comm_rank = ref.position;  // grid groups are ascending
    ref.members = grid.group_of(g->mask, r);
    return ref;
  }
  const std::int64_t N = config_.dist_opt_instances;
  switch (k) {
    case GroupKind::embd:
    case GroupKind::pos_embd: {
      const AxisSet pp_mask{Axis::pp};
      std::vector<Rank> members = embedding_members(k, dense_.group_of(pp_mask, r));
      if (std::find(members.begin(), members.end(), r) == members.end()) return std::nullopt;
      return make_ref(dense_.group_index(pp_mask, r), r, std::move(members));
    }
    case GroupKind::hcp:
    case GroupKind::intra_dp_cp:
    case GroupKind::intra_expt_dp:
    case GroupKind::inter_dist_opt: {
      // A hierarchical split of r's parent group: cp for hcp, dp_cp for intra_dp_cp, the
      // expert dp group for the dist-opt kinds.
      const bool dense = k == GroupKind::hcp || k == GroupKind::intra_dp_cp;
      const AxisSet mask = k == GroupKind::hcp ? AxisSet{Axis::cp}
                           : dense            ? AxisSet{Axis::dp, Axis::cp}
                                              : AxisSet{Axis::dp};
      const RankGrid& grid = dense ? dense_ : expert_;
      const std::vector<Rank> parent = grid.group_of(mask, r);
      const std::int64_t p = grid.position(mask, r);
      const std::int64_t q = grid.group_index(mask, r);
      std::vector<std::int64_t> split;
      int lvl = level;
      if (k == GroupKind::hcp) {
        split = config_.hcp;
      } else {
        split = {static_cast<std::int64_t>(parent.size()) / N, N};
        lvl = k == GroupKind::inter_dist_opt ? 1 : 0;
      }
      auto [local, idx] = split_group_of(p, split, lvl);
      const std::int64_t per_parent =
          static_cast<std::int64_t>(parent.size()) / split[static_cast<std::size_t>(lvl)];
      std::vector<Rank> members(idx.size());
      for (std::size_t t = 0; t < idx.size(); ++t) members[t] = parent[static_cast<std::size_t>(idx[t])];
      return make_ref(q * per_parent + local, r, std::move(members));
    }
    case GroupKind::intra_dist_opt: {
      const AxisSet mask{Axis::tp, Axis::ep, Axis::pp};
      const std::int64_t run = edp_ / N;
      const std::int64_t instance = expert_.coordinate(r, Axis::dp) / run;
      const std::int64_t per = expert_.group_size(mask);
      std::vector<Rank> members(static_cast<std::size_t>(run * per));
      for (std::int64_t j = 0; j < run; ++j)
        for (std::int64_t m = 0; m < per; ++m)
          members[static_cast<std::size_t>(j * per + m)] = expert_.member(mask, instance * run + j, m);
      return make_ref(instance, r, std::move(members));
    }
    default: COMMGRID_ENFORCE(false, "unhandled kind " + std::string(kind_name(k)));
  }
}

RankCoordinates Layout::coordinates(Rank r) const {
  check_rank(r);
  RankCoordinates c;
  c.tp = dense_.coordinate(r, Axis::tp);
  c.cp = dense_.coordinate(r, Axis::cp);
  c.dp = dense_.coordinate(r, Axis::dp);
  c.pp = dense_.coordinate(r, Axis::pp);
  c.etp = expert_.coordinate(r, Axis::tp);
  c.ep = expert_.coordinate(r, Axis::ep);
  c.expert_dp = expert_.coordinate(r, Axis::dp);
  return c;
}

}  // namespace commgrid
