#include "commgrid/layout.hpp"

#include <algorithm>

#include "commgrid/error.hpp"
#include "head_layout.hpp"

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

// u (the product of the sizes before the level) and s (the level's size) of one level of a
// hierarchical split.
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
std::pair<std::int64_t, std::vector<std::int64_t>> split_group_of(std::int64_t p,
                                                                  const Level& v) {
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
      dense_(sizes(config_.tp, config_.cp, 1, dp_ * config_.gtp_remat, config_.pp),
             config_.resolved_order()),
      expert_(sizes(config_.expert_tp(), 1, config_.ep, edp_ * config_.expert_gtp_remat,
                    config_.pp),
              config_.resolved_order()) {
  // Prefix products of the hcp sizes, so that each level costs O(1) to locate (20,000
  // levels would otherwise be quadratic).
  hcp_inner_.reserve(config_.hcp.size());
  std::int64_t u = 1;
  for (std::int64_t h : config_.hcp) {
    hcp_inner_.push_back(u);
    u *= h;
  }
  if (policies_.embedding || policies_.position_embedding) check_policy_results();
  if (config_.compat == Compat::head)
    head_ = detail::build_head_groups(config_, [this](GroupKind k, std::span<const Rank> pp) {
      return embedding_members(k, pp);
    });
}

std::string Layout::level_name(GroupKind k, int level) const {
  if (k == GroupKind::hybrid_dp_cp && head_ && level >= 0 &&
      level < static_cast<int>(head_->hybrid_sizes.size()))
    return "hybrid_dp_cp_" + std::to_string(head_->hybrid_sizes[static_cast<std::size_t>(level)]);
  return std::string(kind_name(k));
}

std::vector<std::int64_t> Layout::hybrid_sizes() const {
  return head_ ? head_->hybrid_sizes : std::vector<std::int64_t>{};
}

bool Layout::has_kind(GroupKind k) const noexcept {
  if (head_) return !head_->kinds[static_cast<int>(k)].empty();
  if (is_head_kind(k)) return false;
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
  if (head_) return static_cast<int>(head_->kinds[static_cast<int>(k)].size());
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
                     (is_head_kind(k) && config_.compat != Compat::head
                          ? "it exists only under compat head"
                      : is_head_kind(k) ? "its HEAD option is not set"
                      : k == GroupKind::hcp ? "no hcp sizes given"
                                            : "dist_opt_instances = 1") +
                     ")");
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

namespace {
const detail::HeadLevel& head_level(const detail::HeadGroups& h, GroupKind k, int level) {
  return h.kinds[static_cast<int>(k)][static_cast<std::size_t>(level)];
}
}  // namespace

std::int64_t Layout::num_groups(GroupKind k, int level) const {
  check_kind(k, level);
  if (head_) return static_cast<std::int64_t>(head_level(*head_, k, level).groups.size());
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

std::optional<std::int64_t> Layout::group_size(GroupKind k, int level) const {
  check_kind(k, level);
  if (head_) return head_level(*head_, k, level).uniform_size;
  if (auto g = grid_kind(k)) return (g->expert ? expert_ : dense_).group_size(g->mask);
  const std::int64_t W = world_size(), N = config_.dist_opt_instances;
  switch (k) {
    case GroupKind::embd:
    case GroupKind::pos_embd: {
      const EmbeddingPolicy& policy =
          k == GroupKind::embd ? policies_.embedding : policies_.position_embedding;
      if (!policy) return k == GroupKind::embd && config_.pp > 1 ? 2 : 1;
      const GroupList all = groups(k);
      for (std::size_t i = 1; i < all.size(); ++i)
        if (all[i].size() != all[0].size()) return std::nullopt;
      return static_cast<std::int64_t>(all[0].size());
    }
    case GroupKind::hcp: return config_.hcp[static_cast<std::size_t>(level)];
    case GroupKind::intra_dp_cp: return dp_ * config_.cp / N;
    case GroupKind::intra_expt_dp: return edp_ / N;
    case GroupKind::inter_dist_opt: return N;
    case GroupKind::intra_dist_opt: return W / N;
    default: COMMGRID_ENFORCE(false, "unhandled kind " + std::string(kind_name(k)));
  }
}

std::int64_t Layout::num_members(GroupKind k, int level) const {
  if (head_) {
    check_kind(k, level);
    return head_level(*head_, k, level).num_members;
  }
  if (auto g = group_size(k, level)) return *g * num_groups(k, level);
  return static_cast<std::int64_t>(groups(k, level).members().size());
}

void Layout::members(GroupKind k, int level, std::int64_t first, std::span<Rank> out) const {
  check_kind(k, level);
  const auto n = static_cast<std::int64_t>(out.size());
  const std::int64_t total = num_members(k, level);
  if (first < 0 || first > total || n > total - first)
    throw ConfigError("first", "members: entries [" + std::to_string(first) + ", " +
                                   std::to_string(first + n) + ") outside [0, " +
                                   std::to_string(total) + ") of kind " +
                                   std::string(kind_name(k)));
  if (head_) {
    const auto all = head_level(*head_, k, level).groups.members();
    std::copy_n(all.begin() + first, n, out.begin());
    return;
  }
  if (auto g = grid_kind(k)) return (g->expert ? expert_ : dense_).fill(g->mask, first, out);
  const std::int64_t N = config_.dist_opt_instances;
  switch (k) {
    case GroupKind::intra_dp_cp: return dense_.fill({Axis::dp, Axis::cp}, first, out);
    // Level 0 of [edp/N, N] is consecutive chunks of each expert dp group, and the N
    // instances are runs of consecutive tp_ep_pp groups: both lists are their parent's.
    case GroupKind::intra_expt_dp: return expert_.fill({Axis::dp}, first, out);
    case GroupKind::intra_dist_opt: return expert_.fill({Axis::tp, Axis::ep, Axis::pp}, first, out);
    case GroupKind::embd:
    case GroupKind::pos_embd: {
      const EmbeddingPolicy& policy =
          k == GroupKind::embd ? policies_.embedding : policies_.position_embedding;
      if (policy) {
        const GroupList all = groups(k);
        std::copy_n(all.members().begin() + first, n, out.begin());
        return;
      }
      // Group q is pp group q's first member (and its last): the ranks whose pp
      // coordinate is 0, ascending, are (q / S) * S * P + q % S.
      const std::int64_t P = config_.pp, S = dense_.stride(Axis::pp);
      const std::int64_t per = k == GroupKind::embd && P > 1 ? 2 : 1;
      const std::int64_t last = (P - 1) * S;
      std::int64_t q = first / per, which = first % per, j = q % S;
      Rank r = (q / S) * S * P + j;
      for (Rank& m : out) {
        m = which == 0 ? r : r + last;
        if (++which < per) continue;
        which = 0;
        ++r;
        if (++j == S) {  // the next block of pp stage 0
          j = 0;
          r += last;
        }
      }
      return;
    }
    case GroupKind::hcp: {
      // Entry e: member t of level group G; G counts the cp groups' level groups in order.
      const std::int64_t s = config_.hcp[static_cast<std::size_t>(level)];
      const std::int64_t u = hcp_inner_[static_cast<std::size_t>(level)];
      const std::int64_t per_parent = config_.cp / s;
      const AxisSet cp_mask{Axis::cp};
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t e = first + i, G = e / s, t = e % s;
        const std::int64_t q = G / per_parent, local = G % per_parent;
        const std::int64_t p = (local / u) * s * u + t * u + local % u;
        out[static_cast<std::size_t>(i)] = dense_.member(cp_mask, q, p);
      }
      return;
    }
    case GroupKind::inter_dist_opt: {
      // Level 1 of [s0, N] over each expert dp group: group b of parent q is its members
      // b, b + s0, ..., b + (N-1) s0.
      const std::int64_t s0 = edp_ / N;
      const AxisSet dp_mask{Axis::dp};
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t e = first + i, G = e / N, t = e % N;
        out[static_cast<std::size_t>(i)] = expert_.member(dp_mask, G / s0, t * s0 + G % s0);
      }
      return;
    }
    default: COMMGRID_ENFORCE(false, "unhandled kind " + std::string(kind_name(k)));
  }
}

GroupList Layout::groups(GroupKind k, int level) const {
  check_kind(k, level);
  if (head_) return head_level(*head_, k, level).groups;
  if (auto g = grid_kind(k)) return (g->expert ? expert_ : dense_).groups(g->mask);
  GroupList out;
  if (k == GroupKind::embd || k == GroupKind::pos_embd) {
    const EmbeddingPolicy& policy =
        k == GroupKind::embd ? policies_.embedding : policies_.position_embedding;
    if (policy) {
      const GroupList pp_groups = dense_.groups({Axis::pp});
      out.reserve(pp_groups.size(), pp_groups.size() * 2);
      for (std::size_t i = 0; i < pp_groups.size(); ++i)
        out.push_back(embedding_members(k, pp_groups[i]));
      return out;
    }
  }
  const std::int64_t g = *group_size(k, level);
  const std::int64_t n = num_groups(k, level);
  members(k, level, 0, out.assign_uniform(static_cast<std::size_t>(n), static_cast<std::size_t>(g)));
  return out;
}

std::optional<std::int64_t> Layout::group_index(GroupKind k, Rank r, int level) const {
  check_rank(r);
  check_kind(k, level);
  if (head_) {
    const std::int32_t q = head_level(*head_, k, level).group_of_rank[static_cast<std::size_t>(r)];
    return q < 0 ? std::nullopt : std::optional<std::int64_t>(q);
  }
  if (auto g = grid_kind(k)) return (g->expert ? expert_ : dense_).group_index(g->mask, r);
  const std::int64_t N = config_.dist_opt_instances;
  switch (k) {
    case GroupKind::embd:
    case GroupKind::pos_embd: {
      const EmbeddingPolicy& policy =
          k == GroupKind::embd ? policies_.embedding : policies_.position_embedding;
      if (policy) {
        auto ref = group_of(k, r);
        return ref ? std::optional<std::int64_t>(ref->index) : std::nullopt;
      }
      const std::int64_t c = dense_.coordinate(r, Axis::pp);
      if (c != 0 && !(k == GroupKind::embd && c == config_.pp - 1)) return std::nullopt;
      return dense_.group_index({Axis::pp}, r);
    }
    case GroupKind::hcp: {
      const AxisSet m{Axis::cp};
      const std::int64_t s = config_.hcp[static_cast<std::size_t>(level)];
      const std::int64_t u = hcp_inner_[static_cast<std::size_t>(level)];
      const std::int64_t p = dense_.position(m, r);
      return dense_.group_index(m, r) * (config_.cp / s) + (p / (u * s)) * u + p % u;
    }
    case GroupKind::intra_dp_cp: {
      const AxisSet m{Axis::dp, Axis::cp};
      return dense_.group_index(m, r) * N + dense_.position(m, r) / (dp_ * config_.cp / N);
    }
    case GroupKind::intra_expt_dp: {
      const AxisSet m{Axis::dp};
      return expert_.group_index(m, r) * N + expert_.position(m, r) / (edp_ / N);
    }
    case GroupKind::inter_dist_opt: {
      const AxisSet m{Axis::dp};
      const std::int64_t s0 = edp_ / N;
      return expert_.group_index(m, r) * s0 + expert_.position(m, r) % s0;
    }
    case GroupKind::intra_dist_opt: return expert_.coordinate(r, Axis::dp) / (edp_ / N);
    default: COMMGRID_ENFORCE(false, "unhandled kind " + std::string(kind_name(k)));
  }
}

std::optional<GroupRef> Layout::group_of(GroupKind k, Rank r, int level) const {
  check_rank(r);
  check_kind(k, level);
  if (head_) {
    const detail::HeadLevel& l = head_level(*head_, k, level);
    const std::int32_t q = l.group_of_rank[static_cast<std::size_t>(r)];
    if (q < 0) return std::nullopt;
    const auto g = l.groups[static_cast<std::size_t>(q)];
    return make_ref(q, r, std::vector<Rank>(g.begin(), g.end()));
  }
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
      const auto L = static_cast<std::int64_t>(parent.size());
      Level v;
      if (k == GroupKind::hcp) {
        v = {hcp_inner_[static_cast<std::size_t>(level)], config_.hcp[static_cast<std::size_t>(level)]};
      } else if (k == GroupKind::inter_dist_opt) {
        v = {L / N, N};
      } else {
        v = {1, L / N};
      }
      auto [local, idx] = split_group_of(p, v);
      const std::int64_t per_parent = L / v.s;
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
  if (head_) {
    // HEAD's grids (gtp_remat is an axis of its own); -1 outside the laid-out ranks.
    RankCoordinates c{-1, -1, -1, -1, -1, -1, -1};
    const std::int64_t local = r - config_.rank_offset;
    if (local < 0 || local >= config_.layout_world_size()) return c;
    auto coord = [&](const std::vector<std::string>& order,
                     const std::vector<std::int64_t>& sz, std::string_view axis) {
      std::int64_t stride = 1;
      for (std::size_t i = 0; i < order.size(); ++i) {
        if (order[i] == axis) return (local / stride) % sz[i];
        stride *= sz[i];
      }
      return std::int64_t{0};
    };
    c.tp = coord(head_->dense_order, head_->dense_sizes, "tp");
    c.cp = coord(head_->dense_order, head_->dense_sizes, "cp");
    c.dp = coord(head_->dense_order, head_->dense_sizes, "dp");
    c.pp = coord(head_->dense_order, head_->dense_sizes, "pp");
    c.etp = coord(head_->expert_order, head_->expert_sizes, "tp");
    c.ep = coord(head_->expert_order, head_->expert_sizes, "ep");
    c.expert_dp = coord(head_->expert_order, head_->expert_sizes, "dp");
    return c;
  }
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
