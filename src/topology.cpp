#include "commgrid/topology.hpp"

#include <algorithm>
#include <array>
#include <tuple>

#include "commgrid/error.hpp"

namespace commgrid {
namespace {

// The four node-local kinds are each one axis of one grid (spec §7).
struct LocalKind {
  bool expert = false;
  Axis axis = Axis::tp;
};

std::optional<LocalKind> local_kind(GroupKind k) noexcept {
  switch (k) {
    case GroupKind::tp: return LocalKind{false, Axis::tp};
    case GroupKind::cp: return LocalKind{false, Axis::cp};
    case GroupKind::ep: return LocalKind{true, Axis::ep};
    case GroupKind::expt_tp: return LocalKind{true, Axis::tp};
    default: return std::nullopt;
  }
}

constexpr std::array<GroupKind, 4> kNodeLocalKinds = {GroupKind::tp, GroupKind::cp, GroupKind::ep,
                                                      GroupKind::expt_tp};

std::int64_t local_group_size(const Layout& layout, GroupKind k) {
  const LocalKind lk = *local_kind(k);
  const RankGrid& grid = lk.expert ? layout.expert_grid() : layout.dense_grid();
  return grid.size(lk.axis);
}

int crossing_local_kinds(const Layout& layout, const NodeMap& nodes) {
  int n = 0;
  for (GroupKind k : kNodeLocalKinds) n += crosses_nodes(layout, k, nodes) ? 1 : 0;
  return n;
}

std::string join(const std::vector<Axis>& axes) {
  std::string s;
  for (std::size_t i = 0; i < axes.size(); ++i) s += (i ? "-" : "") + std::string(axis_name(axes[i]));
  return s;
}

// Pairs of axes that the two orders (permutations of the same tokens) put the other way
// round.
int kendall_distance(const std::vector<Axis>& from, const std::vector<Axis>& to) {
  std::array<int, kNumAxes> pos{};
  for (std::size_t i = 0; i < to.size(); ++i) pos[static_cast<int>(to[i])] = static_cast<int>(i);
  int d = 0;
  for (std::size_t i = 0; i < from.size(); ++i)
    for (std::size_t j = i + 1; j < from.size(); ++j)
      d += pos[static_cast<int>(from[i])] > pos[static_cast<int>(from[j])] ? 1 : 0;
  return d;
}

}  // namespace

NodeMap::NodeMap(std::int64_t gpus_per_node) : g_(gpus_per_node) {
  if (gpus_per_node < 1)
    throw InvalidValueError("gpus_per_node",
                            "gpus_per_node must be >= 1, got " + std::to_string(gpus_per_node));
}

std::int64_t NodeMap::nodes_spanned(std::span<const Rank> members) const {
  if (members.empty()) return 0;
  // Most kinds list members ascending, so node ids come sorted and a run count suffices;
  // only unsorted lists (intra_dist_opt, custom embedding policies) pay for a sort.
  std::vector<std::int64_t> ids;
  ids.reserve(members.size());
  for (Rank r : members) ids.push_back(node(r));
  if (!std::is_sorted(ids.begin(), ids.end())) std::sort(ids.begin(), ids.end());
  return static_cast<std::int64_t>(std::unique(ids.begin(), ids.end()) - ids.begin());
}

bool wants_node_local(GroupKind k) noexcept { return local_kind(k).has_value(); }

KindSpan kind_span(const Layout& layout, GroupKind k, int level, const NodeMap& nodes) {
  const GroupList groups = layout.groups(k, level);
  KindSpan s;
  s.kind = k;
  s.level = level;
  s.groups = static_cast<std::int64_t>(groups.size());
  s.min_group_size = groups.empty() ? 0 : INT64_MAX;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto size = static_cast<std::int64_t>(groups[i].size());
    s.min_group_size = std::min(s.min_group_size, size);
    s.max_group_size = std::max(s.max_group_size, size);
    const std::int64_t spanned = nodes.nodes_spanned(groups[i]);
    s.crossing_groups += spanned > 1 ? 1 : 0;
    s.max_nodes_spanned = std::max(s.max_nodes_spanned, spanned);
  }
  return s;
}

bool crosses_nodes(const Layout& layout, GroupKind k, const NodeMap& nodes) {
  const std::optional<LocalKind> lk = local_kind(k);
  if (!lk)
    throw ConfigError("kind", "crosses_nodes: kind " + std::string(kind_name(k)) +
                                  " is not one of tp, cp, ep, expt_tp");
  const RankGrid& grid = lk->expert ? layout.expert_grid() : layout.dense_grid();
  const std::int64_t size = grid.size(lk->axis);
  if (size == 1 || grid.world_size() <= nodes.gpus_per_node()) return false;
  const AxisSet mask{lk->axis};
  const std::int64_t last = (size - 1) * grid.stride(lk->axis);
  const std::int64_t n = grid.num_groups(mask);
  for (std::int64_t q = 0; q < n; ++q) {
    const Rank first = grid.member(mask, q, 0);
    if (nodes.node(first) != nodes.node(first + last)) return true;
  }
  return false;
}

std::optional<std::string> suggest_order(const ParallelConfig& config, GroupKind k,
                                         const NodeMap& nodes) {
  if (!wants_node_local(k))
    throw ConfigError("kind", "suggest_order: kind " + std::string(kind_name(k)) +
                                  " is not one of tp, cp, ep, expt_tp");
  const Layout current(config);
  if (!crosses_nodes(current, k, nodes)) return config.order;
  // A group larger than a node crosses under every order.
  if (local_group_size(current, k) > nodes.gpus_per_node()) return std::nullopt;

  const std::vector<Axis> given = parse_order(config.order);
  std::vector<Axis> perm = given;
  std::sort(perm.begin(), perm.end());
  using Score = std::tuple<int, int, std::string>;
  std::optional<Score> best;
  do {
    ParallelConfig candidate = config;
    candidate.order = join(perm);
    std::optional<Layout> layout;
    try {
      layout.emplace(candidate);
    } catch (const ConfigError&) {
      continue;  // e.g. the pp strides of the two grids disagree (rule 11)
    }
    if (crosses_nodes(*layout, k, nodes)) continue;
    Score score{crossing_local_kinds(*layout, nodes), kendall_distance(given, perm),
                candidate.order};
    if (!best || score < *best) best = std::move(score);
  } while (std::next_permutation(perm.begin(), perm.end()));
  if (!best) return std::nullopt;
  return std::get<2>(*best);
}

std::string TopologyWarning::message() const {
  std::string s = std::string(kind_name(kind)) + " groups cross nodes (" +
                  std::to_string(crossing_groups) + " of " + std::to_string(groups) +
                  " groups span up to " + std::to_string(max_nodes_spanned) + " nodes); ";
  if (order) return s + "order \"" + *order + "\" keeps them inside";
  if (group_size > gpus_per_node)
    return s + "no order keeps them inside: a group has " + std::to_string(group_size) +
           " ranks, a node " + std::to_string(gpus_per_node) + " GPUs";
  return s + "no valid order keeps them inside";
}

TopologyReport check_topology(const Layout& layout, std::span<const GroupKind> kinds,
                              const NodeMap& nodes) {
  TopologyReport report;
  report.world_size = layout.world_size();
  report.gpus_per_node = nodes.gpus_per_node();
  report.nodes = nodes.nodes(layout.world_size());
  report.order = layout.config().order;
  for (GroupKind k : kinds) {
    if (!layout.has_kind(k)) (void)layout.num_groups(k);  // throws, naming why it is absent
    for (int l = 0; l < layout.levels(k); ++l) report.kinds.push_back(kind_span(layout, k, l, nodes));
  }
  for (GroupKind k : kNodeLocalKinds) {
    if (!crosses_nodes(layout, k, nodes)) continue;
    const KindSpan s = kind_span(layout, k, 0, nodes);
    TopologyWarning w;
    w.kind = k;
    w.crossing_groups = s.crossing_groups;
    w.groups = s.groups;
    w.max_nodes_spanned = s.max_nodes_spanned;
    w.group_size = s.max_group_size;
    w.gpus_per_node = nodes.gpus_per_node();
    w.order = suggest_order(layout.config(), k, nodes);
    report.warnings.push_back(std::move(w));
  }
  return report;
}

}  // namespace commgrid
