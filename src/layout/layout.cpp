#include "commgrid/layout.hpp"

#include <algorithm>

#include "commgrid/error.hpp"
#include "edition.hpp"

namespace commgrid {
namespace {

std::string list_text(std::span<const Rank> v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// How a kind is built, over which grid and which of its axes (spec §7; HEAD's kinds follow
// docs/megatron-head.md). One table for both editions: at the seed gtp_remat has size 1,
// where adding it to a mask changes no group.
enum class Grid : std::uint8_t { dense, expert, dense_ag, expert_ag };
enum class Shape : std::uint8_t {
  grid,            ///< the groups of the masked axes
  embedding,       ///< a policy's choice from each group of the masked axes (pp)
  split,           ///< a level of a hierarchical split of each group of the masked axes
  intra_dist_opt,  ///< runs of consecutive groups of the masked axes (tp_ep_pp)
  hybrid,          ///< consecutive slices of each group of the masked axes (dp_cp)
};
struct Recipe {
  Shape shape = Shape::grid;
  Grid grid = Grid::dense;
  AxisSet mask;
};

constexpr Recipe recipe(GroupKind k) noexcept {
  using A = Axis;
  using K = GroupKind;
  constexpr Grid D = Grid::dense, E = Grid::expert;
  switch (k) {
    case K::dp_cp: return {Shape::grid, D, {A::dp, A::cp}};
    case K::intra_dp_cp: return {Shape::split, D, {A::dp, A::cp}};
    case K::dp: return {Shape::grid, D, {A::dp}};
    case K::cp: return {Shape::grid, D, {A::cp}};
    case K::hcp: return {Shape::split, D, {A::cp}};
    case K::mp: return {Shape::grid, D, {A::tp, A::gtp_remat, A::pp}};
    case K::tp: return {Shape::grid, D, {A::tp}};
    case K::pp: return {Shape::grid, D, {A::pp}};
    case K::embd:
    case K::pos_embd: return {Shape::embedding, D, {A::pp}};
    case K::tp_dp_cp: return {Shape::grid, D, {A::tp, A::gtp_remat, A::dp, A::cp}};
    case K::tp_dp: return {Shape::grid, D, {A::tp, A::gtp_remat, A::dp}};
    case K::tp_cp: return {Shape::grid, D, {A::tp, A::cp}};
    case K::ep: return {Shape::grid, E, {A::ep}};
    case K::expt_tp: return {Shape::grid, E, {A::tp}};
    case K::tp_ep: return {Shape::grid, E, {A::tp, A::ep}};
    case K::tp_ep_pp: return {Shape::grid, E, {A::tp, A::ep, A::pp}};
    case K::expt_dp: return {Shape::grid, E, {A::dp}};
    case K::intra_expt_dp:
    case K::inter_dist_opt: return {Shape::split, E, {A::dp}};
    case K::intra_dist_opt: return {Shape::intra_dist_opt, E, {A::tp, A::ep, A::pp}};
    case K::gtp_remat: return {Shape::grid, D, {A::gtp_remat}};
    case K::expt_gtp_remat: return {Shape::grid, E, {A::gtp_remat}};
    case K::dp_gtp_remat: return {Shape::grid, D, {A::gtp_remat, A::dp}};
    case K::dp_cp_gtp_remat: return {Shape::grid, D, {A::gtp_remat, A::dp, A::cp}};
    case K::expt_dp_gtp_remat: return {Shape::grid, E, {A::gtp_remat, A::dp}};
    case K::tp_ep_pp_with_egtp_remat: return {Shape::grid, E, {A::tp, A::ep, A::gtp_remat, A::pp}};
    case K::hybrid_dp_cp: return {Shape::hybrid, D, {A::dp, A::cp}};
    case K::dp_cp_ag: return {Shape::grid, Grid::dense_ag, {A::dp, A::cp}};
    case K::expt_dp_ag: return {Shape::grid, Grid::expert_ag, {A::dp}};
  }
  return {};
}

std::array<std::int64_t, kNumAxes> sizes(std::int64_t tp, std::int64_t cp, std::int64_t ep,
                                         std::int64_t dp, std::int64_t pp, std::int64_t gtp) {
  std::array<std::int64_t, kNumAxes> s{};
  s[static_cast<int>(Axis::tp)] = tp;
  s[static_cast<int>(Axis::cp)] = cp;
  s[static_cast<int>(Axis::ep)] = ep;
  s[static_cast<int>(Axis::dp)] = dp;
  s[static_cast<int>(Axis::pp)] = pp;
  s[static_cast<int>(Axis::gtp_remat)] = gtp;
  return s;
}

const ParallelConfig& validated(const ParallelConfig& c) {
  c.validate();
  return c;
}

// HEAD's create_all_gather_groups ignores --order and --rank-offset: its grids have the
// default order (gtp_remat injected) and start at rank 0.
std::array<Axis, kNumAxes> default_head_order(bool expert) {
  ParallelConfig c;
  c.compat = Compat::head;
  return c.grid_order(expert);
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

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

// One level of a hierarchical split of a parent group of P members (spec §7): u is the
// product of the sizes before the level, s the level's size; a parent has P / s groups.
struct Layout::Split {
  std::int64_t parent = 1, u = 1, s = 1;
  [[nodiscard]] std::int64_t per_parent() const noexcept { return parent / s; }
};

void hierarchical_split(std::span<const Rank> parent, std::span<const std::int64_t> sizes,
                        int level, GroupList& out) {
  std::int64_t u = 1;
  for (int i = 0; i < level; ++i) u *= sizes[static_cast<std::size_t>(i)];
  const std::int64_t s = sizes[static_cast<std::size_t>(level)];
  const auto L = static_cast<std::int64_t>(parent.size());
  const std::int64_t l = L / (u * s);
  std::vector<Rank> group(static_cast<std::size_t>(s));
  for (std::int64_t a = 0; a < l; ++a)
    for (std::int64_t b = 0; b < u; ++b) {
      for (std::int64_t t = 0; t < s; ++t)
        group[static_cast<std::size_t>(t)] =
            parent[static_cast<std::size_t>(a * s * u + t * u + b)];
      out.push_back(group);
    }
}

Layout::Layout(ParallelConfig config, EmbeddingPolicies policies)
    : config_(std::move(config)), policies_(std::move(policies)),
      edition_(&detail::edition_of(validated(config_).compat)), dp_(config_.dp()),
      edp_(config_.expert_dp()),
      dense_(sizes(config_.tp, config_.cp, 1, dp_, config_.pp, config_.gtp_remat),
             config_.grid_order(false), config_.rank_offset),
      expert_(sizes(config_.expert_tp(), 1, config_.ep, edp_, config_.pp, config_.expert_gtp_remat),
              config_.grid_order(true), config_.rank_offset) {
  // Prefix products of the hcp sizes, so that each level costs O(1) to locate (20,000
  // levels would otherwise be quadratic).
  hcp_inner_.reserve(config_.hcp.size());
  std::int64_t u = 1;
  for (std::int64_t h : config_.hcp) {
    hcp_inner_.push_back(u);
    u *= h;
  }
  if (config_.hybrid_context_parallel) {
    // n = 2, 4, ... below 2^floor(log2 |dp_cp|).
    const std::int64_t size = dp_ * config_.cp;
    std::int64_t top = 1;
    while (top <= size / 2) top *= 2;
    for (std::int64_t n = 2; n < top; n *= 2) hybrid_sizes_.push_back(n);
  }
  if (config_.all_gather_groups) {
    const ParallelConfig& c = config_;
    dense_ag_.emplace(sizes(c.tp, c.cp, 1, dp_ * c.gtp_remat, c.pp, c.gtp_remat),
                      default_head_order(false));
    if (c.ep > 1)
      expert_ag_.emplace(
          sizes(c.expert_tp(), 1, c.ep, edp_ * c.expert_gtp_remat, c.pp, c.expert_gtp_remat),
          default_head_order(true));
  }
  if (policies_.embedding || policies_.position_embedding) check_policy_results();
}

const RankGrid& Layout::grid_of_kind(GroupKind k) const noexcept {
  switch (recipe(k).grid) {
    case Grid::dense: return dense_;
    case Grid::expert: return expert_;
    case Grid::dense_ag: return *dense_ag_;
    case Grid::expert_ag: return *expert_ag_;
  }
  return dense_;
}

Layout::Split Layout::split(GroupKind k, int level) const noexcept {
  const std::int64_t N = config_.dist_opt_instances;
  switch (k) {
    case GroupKind::hcp:
      return {config_.cp, hcp_inner_[static_cast<std::size_t>(level)],
              config_.hcp[static_cast<std::size_t>(level)]};
    case GroupKind::intra_dp_cp: return {dp_ * config_.cp, 1, dp_ * config_.cp / N};
    case GroupKind::intra_expt_dp: return {edp_, 1, edp_ / N};
    case GroupKind::inter_dist_opt: return {edp_, edp_ / N, N};
    default: return {};
  }
}

bool Layout::gtp_instance() const noexcept {
  // HEAD: with a gtp size > 1 the one distributed-optimizer instance is every laid-out
  // rank, ascending (dist_opt_instances is 1 then).
  return config_.gtp_remat > 1 || config_.expert_gtp_remat > 1;
}

std::string Layout::level_name(GroupKind k, int level) const {
  if (k == GroupKind::hybrid_dp_cp && level >= 0 && level < static_cast<int>(hybrid_sizes_.size()))
    return "hybrid_dp_cp_" + std::to_string(hybrid_sizes_[static_cast<std::size_t>(level)]);
  return std::string(kind_name(k));
}

std::vector<std::int64_t> Layout::hybrid_sizes() const { return hybrid_sizes_; }

bool Layout::has_kind(GroupKind k) const noexcept {
  if (!edition_->has(k)) return false;
  switch (k) {
    case GroupKind::hcp: return !config_.hcp.empty();
    case GroupKind::inter_dist_opt: return config_.dist_opt_instances > 1;
    case GroupKind::hybrid_dp_cp: return !hybrid_sizes_.empty();
    case GroupKind::dp_cp_ag: return dense_ag_.has_value();
    case GroupKind::expt_dp_ag: return expert_ag_.has_value();
    default: return true;
  }
}

std::vector<GroupKind> Layout::kinds() const {
  std::vector<GroupKind> out;
  for (GroupKind k : all_kinds())
    if (has_kind(k)) out.push_back(k);
  return out;
}

int Layout::levels(GroupKind k) const noexcept {
  if (k == GroupKind::hcp) return static_cast<int>(config_.hcp.size());
  if (k == GroupKind::hybrid_dp_cp) return static_cast<int>(hybrid_sizes_.size());
  return 1;
}

void Layout::check_rank(Rank r) const {
  if (r < 0 || r >= world_size())
    throw RankOutOfRangeError("rank", "rank " + std::to_string(r) + " out of range [0, " +
                                          std::to_string(world_size()) + ")");
}

void Layout::check_kind(GroupKind k, int level) const {
  if (!has_kind(k))
    throw UnknownKindError(
        "kinds",
        "group kind \"" + std::string(kind_name(k)) + "\" does not exist for this config (" +
            (is_head_kind(k) && config_.compat != Compat::head ? "it exists only under compat head"
             : is_head_kind(k)                                 ? "its HEAD option is not set"
             : k == GroupKind::hcp                             ? "no hcp sizes given"
                                                               : "dist_opt_instances = 1") +
            ")");
  if (level < 0 || level >= levels(k))
    throw ConfigError("level", "level " + std::to_string(level) + " out of range [0, " +
                                   std::to_string(levels(k)) + ") for group kind \"" +
                                   std::string(kind_name(k)) + "\"");
}

const EmbeddingPolicy& Layout::policy(GroupKind k) const noexcept {
  return k == GroupKind::embd ? policies_.embedding : policies_.position_embedding;
}

std::vector<Rank> Layout::embedding_members(GroupKind k, std::span<const Rank> pp_group) const {
  if (const EmbeddingPolicy& p = policy(k)) return p(pp_group);
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
          throw PolicyError(what,
                            head + "rank " + std::to_string(got[j]) + " is not in that group");
        if (std::find(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(j), got[j]) !=
            got.begin() + static_cast<std::ptrdiff_t>(j))
          throw PolicyError(what, head + "rank " + std::to_string(got[j]) + " appears twice");
      }
    }
  }
}

std::int64_t Layout::num_groups(GroupKind k, int level) const {
  check_kind(k, level);
  const Recipe rc = recipe(k);
  const RankGrid& grid = grid_of_kind(k);
  switch (rc.shape) {
    case Shape::grid:
    case Shape::embedding: return grid.num_groups(rc.mask);
    case Shape::split: return grid.num_groups(rc.mask) * split(k, level).per_parent();
    case Shape::intra_dist_opt: return gtp_instance() ? 1 : config_.dist_opt_instances;
    case Shape::hybrid:
      return grid.num_groups(rc.mask) *
             ceil_div(grid.group_size(rc.mask), hybrid_sizes_[static_cast<std::size_t>(level)]);
  }
  return 0;
}

std::optional<std::int64_t> Layout::group_size(GroupKind k, int level) const {
  check_kind(k, level);
  const Recipe rc = recipe(k);
  const RankGrid& grid = grid_of_kind(k);
  switch (rc.shape) {
    case Shape::grid: return grid.group_size(rc.mask);
    case Shape::embedding: {
      if (!policy(k)) return k == GroupKind::embd && config_.pp > 1 ? 2 : 1;
      const GroupList all = groups(k);
      for (std::size_t i = 1; i < all.size(); ++i)
        if (all[i].size() != all[0].size()) return std::nullopt;
      return static_cast<std::int64_t>(all[0].size());
    }
    case Shape::split: return split(k, level).s;
    case Shape::intra_dist_opt:
      return gtp_instance() ? grid.world_size() : grid.world_size() / config_.dist_opt_instances;
    case Shape::hybrid: {
      const std::int64_t n = hybrid_sizes_[static_cast<std::size_t>(level)];
      return grid.group_size(rc.mask) % n == 0 ? std::optional<std::int64_t>(n) : std::nullopt;
    }
  }
  return std::nullopt;
}

std::int64_t Layout::num_members(GroupKind k, int level) const {
  if (auto g = group_size(k, level)) return *g * num_groups(k, level);
  if (recipe(k).shape == Shape::hybrid) return grid_of_kind(k).world_size();
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
  const Recipe rc = recipe(k);
  const RankGrid& grid = grid_of_kind(k);
  switch (rc.shape) {
    // Consecutive slices or runs of a parent kind: the concatenated list is the parent's.
    case Shape::grid:
    case Shape::hybrid: return grid.fill(rc.mask, first, out);
    case Shape::intra_dist_opt:
      if (gtp_instance()) {
        for (std::int64_t i = 0; i < n; ++i)
          out[static_cast<std::size_t>(i)] = grid.offset() + first + i;
        return;
      }
      return grid.fill(rc.mask, first, out);
    case Shape::split: {
      const Split v = split(k, level);
      if (v.u == 1) return grid.fill(rc.mask, first, out);  // level 0: consecutive chunks
      // Entry e: member t of level group G; G counts the parents' level groups in order.
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t e = first + i, G = e / v.s, t = e % v.s;
        const std::int64_t q = G / v.per_parent(), local = G % v.per_parent();
        const std::int64_t p = (local / v.u) * v.s * v.u + t * v.u + local % v.u;
        out[static_cast<std::size_t>(i)] = grid.member(rc.mask, q, p);
      }
      return;
    }
    case Shape::embedding: {
      if (policy(k)) {
        const GroupList all = groups(k);
        std::copy_n(all.members().begin() + first, n, out.begin());
        return;
      }
      // Group q is pp group q's first member (and its last): the ranks whose pp
      // coordinate is 0, ascending, are offset + (q / S) * S * P + q % S.
      const std::int64_t P = config_.pp, S = grid.stride(Axis::pp);
      const std::int64_t per = k == GroupKind::embd && P > 1 ? 2 : 1;
      const std::int64_t last = (P - 1) * S;
      std::int64_t q = first / per, which = first % per, j = q % S;
      Rank r = grid.offset() + (q / S) * S * P + j;
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
  }
}

GroupList Layout::groups(GroupKind k, int level) const {
  check_kind(k, level);
  const Recipe rc = recipe(k);
  GroupList out;
  if (rc.shape == Shape::embedding && policy(k)) {
    const GroupList pp_groups = dense_.groups(rc.mask);
    out.reserve(pp_groups.size(), pp_groups.size() * 2);
    for (std::size_t i = 0; i < pp_groups.size(); ++i)
      out.push_back(embedding_members(k, pp_groups[i]));
    return out;
  }
  if (const auto g = group_size(k, level)) {
    const std::int64_t n = num_groups(k, level);
    members(k, level, 0,
            out.assign_uniform(static_cast<std::size_t>(n), static_cast<std::size_t>(*g)));
    return out;
  }
  // Ragged hybrid slices: each parent group cut into slices of n, the last one shorter.
  const RankGrid& grid = grid_of_kind(k);
  const std::int64_t n = hybrid_sizes_[static_cast<std::size_t>(level)];
  const std::int64_t parent = grid.group_size(rc.mask), parents = grid.num_groups(rc.mask);
  out.reserve(static_cast<std::size_t>(parents * ceil_div(parent, n)),
              static_cast<std::size_t>(grid.world_size()));
  std::vector<Rank> members(static_cast<std::size_t>(parent));
  for (std::int64_t q = 0; q < parents; ++q) {
    grid.fill(rc.mask, q * parent, members);
    for (std::int64_t s = 0; s < parent; s += n)
      out.push_back(std::span<const Rank>(members).subspan(
          static_cast<std::size_t>(s), static_cast<std::size_t>(std::min(n, parent - s))));
  }
  return out;
}

std::optional<std::int64_t> Layout::group_index(GroupKind k, Rank r, int level) const {
  check_rank(r);
  check_kind(k, level);
  const Recipe rc = recipe(k);
  const RankGrid& grid = grid_of_kind(k);
  if (!grid.contains(r)) return std::nullopt;
  switch (rc.shape) {
    case Shape::grid: return grid.group_index(rc.mask, r);
    case Shape::embedding: {
      if (policy(k)) {
        auto ref = group_of(k, r);
        return ref ? std::optional<std::int64_t>(ref->index) : std::nullopt;
      }
      const std::int64_t c = grid.coordinate(r, Axis::pp);
      if (c != 0 && !(k == GroupKind::embd && c == config_.pp - 1)) return std::nullopt;
      return grid.group_index(rc.mask, r);
    }
    case Shape::split: {
      const Split v = split(k, level);
      const std::int64_t p = grid.position(rc.mask, r);
      return grid.group_index(rc.mask, r) * v.per_parent() + (p / (v.u * v.s)) * v.u + p % v.u;
    }
    case Shape::intra_dist_opt:
      if (gtp_instance()) return 0;
      return grid.coordinate(r, Axis::dp) / (edp_ / config_.dist_opt_instances);
    case Shape::hybrid: {
      const std::int64_t n = hybrid_sizes_[static_cast<std::size_t>(level)];
      return grid.group_index(rc.mask, r) * ceil_div(grid.group_size(rc.mask), n) +
             grid.position(rc.mask, r) / n;
    }
  }
  return std::nullopt;
}

std::optional<GroupRef> Layout::group_of(GroupKind k, Rank r, int level) const {
  check_rank(r);
  check_kind(k, level);
  const Recipe rc = recipe(k);
  const RankGrid& grid = grid_of_kind(k);
  if (!grid.contains(r)) return std::nullopt;
  switch (rc.shape) {
    case Shape::grid: {
      GroupRef ref;
      ref.index = grid.group_index(rc.mask, r);
      ref.position = grid.position(rc.mask, r);
      ref.comm_rank = ref.position;  // grid groups are ascending
      ref.members = grid.group_of(rc.mask, r);
      return ref;
    }
    case Shape::embedding: {
      std::vector<Rank> members = embedding_members(k, grid.group_of(rc.mask, r));
      if (std::find(members.begin(), members.end(), r) == members.end()) return std::nullopt;
      return make_ref(grid.group_index(rc.mask, r), r, std::move(members));
    }
    case Shape::split: {
      // Rank at position p of its parent: its level group is P[p + (t - d) u], t = 0 .. s-1.
      const Split v = split(k, level);
      const std::vector<Rank> parent = grid.group_of(rc.mask, r);
      const std::int64_t p = grid.position(rc.mask, r);
      const std::int64_t d = (p / v.u) % v.s;
      std::vector<Rank> members(static_cast<std::size_t>(v.s));
      for (std::int64_t t = 0; t < v.s; ++t)
        members[static_cast<std::size_t>(t)] = parent[static_cast<std::size_t>(p + (t - d) * v.u)];
      return make_ref(*group_index(k, r, level), r, std::move(members));
    }
    case Shape::intra_dist_opt: {
      if (gtp_instance()) {
        GroupRef ref;
        ref.members.resize(static_cast<std::size_t>(grid.world_size()));
        for (std::size_t i = 0; i < ref.members.size(); ++i)
          ref.members[i] = grid.offset() + static_cast<Rank>(i);
        ref.position = ref.comm_rank = r - grid.offset();
        return ref;
      }
      const std::int64_t run = edp_ / config_.dist_opt_instances;
      const std::int64_t instance = grid.coordinate(r, Axis::dp) / run;
      const std::int64_t per = grid.group_size(rc.mask);
      std::vector<Rank> members(static_cast<std::size_t>(run * per));
      for (std::int64_t j = 0; j < run; ++j)
        for (std::int64_t m = 0; m < per; ++m)
          members[static_cast<std::size_t>(j * per + m)] =
              grid.member(rc.mask, instance * run + j, m);
      return make_ref(instance, r, std::move(members));
    }
    case Shape::hybrid: {
      const std::int64_t n = hybrid_sizes_[static_cast<std::size_t>(level)];
      const std::vector<Rank> parent = grid.group_of(rc.mask, r);
      const std::int64_t s = grid.position(rc.mask, r) / n * n;
      const auto size = static_cast<std::int64_t>(parent.size());
      std::vector<Rank> members(parent.begin() + s, parent.begin() + std::min(s + n, size));
      return make_ref(*group_index(k, r, level), r, std::move(members));
    }
  }
  return std::nullopt;
}

RankCoordinates Layout::coordinates(Rank r) const {
  check_rank(r);
  // -1 everywhere outside the laid-out ranks (under head with a rank offset).
  if (!dense_.contains(r)) return {-1, -1, -1, -1, -1, -1, -1, -1, -1};
  RankCoordinates c;
  c.tp = dense_.coordinate(r, Axis::tp);
  c.cp = dense_.coordinate(r, Axis::cp);
  c.dp = dense_.coordinate(r, Axis::dp);
  c.pp = dense_.coordinate(r, Axis::pp);
  c.gtp_remat = dense_.coordinate(r, Axis::gtp_remat);
  c.etp = expert_.coordinate(r, Axis::tp);
  c.ep = expert_.coordinate(r, Axis::ep);
  c.expert_dp = expert_.coordinate(r, Axis::dp);
  c.expert_gtp_remat = expert_.coordinate(r, Axis::gtp_remat);
  return c;
}

}  // namespace commgrid
