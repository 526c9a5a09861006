#include "commgrid/topology.hpp"

#include <algorithm>
#include <array>
#include <numeric>
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
  for (std::size_t i = 0; i < axes.size(); ++i)
    s += (i ? "-" : "") + std::string(axis_name(axes[i]));
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

// Whether every group of the kind is a run of consecutive ranks, from the grid alone: the
// masked axes of size > 1 must have strides 1, s0, s0*s1, ... (nothing else below them).
bool groups_are_runs(const Layout& layout, GroupKind k) {
  auto runs = [](const RankGrid& grid, AxisSet masked) {
    std::int64_t next = 1;
    for (Axis a : grid.order()) {
      if (!masked.contains(a) || grid.size(a) == 1) continue;
      if (grid.stride(a) != next) return false;
      next *= grid.size(a);
    }
    return true;
  };
  const RankGrid& d = layout.dense_grid();
  const RankGrid& e = layout.expert_grid();
  switch (k) {
    case GroupKind::tp: return runs(d, {Axis::tp});
    case GroupKind::cp: return runs(d, {Axis::cp});
    case GroupKind::dp: return runs(d, {Axis::dp});
    case GroupKind::pp: return runs(d, {Axis::pp});
    case GroupKind::mp: return runs(d, {Axis::tp, Axis::pp});
    case GroupKind::dp_cp:
    case GroupKind::intra_dp_cp: return runs(d, {Axis::dp, Axis::cp});
    case GroupKind::tp_cp: return runs(d, {Axis::tp, Axis::cp});
    case GroupKind::tp_dp: return runs(d, {Axis::tp, Axis::dp});
    case GroupKind::tp_dp_cp: return runs(d, {Axis::tp, Axis::dp, Axis::cp});
    case GroupKind::ep: return runs(e, {Axis::ep});
    case GroupKind::expt_tp: return runs(e, {Axis::tp});
    case GroupKind::tp_ep: return runs(e, {Axis::tp, Axis::ep});
    case GroupKind::tp_ep_pp: return runs(e, {Axis::tp, Axis::ep, Axis::pp});
    case GroupKind::expt_dp:
    case GroupKind::intra_expt_dp: return runs(e, {Axis::dp});
    case GroupKind::intra_dist_opt:
      // An instance is the ranks whose expert dp coordinate lies in a range: consecutive
      // when every other axis lies below dp. Its list starts at its smallest member.
      if (layout.config().dist_opt_instances == 1) return true;  // one group: the world
      for (Axis a : {Axis::tp, Axis::ep, Axis::pp})
        if (e.size(a) > 1 && e.stride(a) > e.stride(Axis::dp)) return false;
      return true;
    default: return false;
  }
}

// The node-local kinds crossing nodes as bits, the most important highest, so that a
// smaller value is a better layout: tp inside beats anything else, then cp, ep, expt_tp.
int crossing_mask(const Layout& layout, const NodeMap& nodes) {
  int mask = 0;
  for (GroupKind k : kNodeLocalKinds) mask = mask * 2 + (crosses_nodes(layout, k, nodes) ? 1 : 0);
  return mask;
}

int priority_bit(GroupKind k) {
  for (std::size_t i = 0; i < kNodeLocalKinds.size(); ++i)
    if (kNodeLocalKinds[i] == k) return 1 << (kNodeLocalKinds.size() - 1 - i);
  return 0;
}

// "tp·cp = 16 > 8 GPUs per node" when the kinds' group sizes together exceed a node.
std::string product_text(const Layout& layout, const std::vector<GroupKind>& kinds,
                         std::int64_t gpus_per_node) {
  std::string names;
  std::int64_t product = 1;
  for (GroupKind k : kinds) {
    names += (names.empty() ? "" : "\u00b7") + std::string(kind_name(k));
    product *= local_group_size(layout, k);
  }
  if (product <= gpus_per_node) return "";
  return names + " = " + std::to_string(product) + " > " + std::to_string(gpus_per_node) +
         " GPUs per node";
}

std::string kind_list(const std::vector<GroupKind>& kinds) {
  std::string s;
  for (std::size_t i = 0; i < kinds.size(); ++i)
    s += (i == 0 ? "" : i + 1 == kinds.size() ? " and " : ", ") + std::string(kind_name(kinds[i]));
  return s;
}

// The usual fix of MoE layouts whose expert groups cross nodes: expert tensor parallel 1
// (etp defaults to tp, so tp 8 with ep 4 makes tp_ep groups of 32). "--etp 1 keeps ep and
// expt_tp inside" (with "--order X" when the order must change too), or "" when no order is
// needed for it (the best order, crossing `then`, keeps both inside already), etp is
// already 1, etp 1 is not a valid layout, or it would not keep them inside without pushing
// tp or cp out (crossing `now`).
std::string etp_one_advice(const Layout& layout, const NodeMap& nodes, int now, int then) {
  const ParallelConfig& given = layout.config();
  const int dense = priority_bit(GroupKind::tp) | priority_bit(GroupKind::cp);
  const int expert = priority_bit(GroupKind::ep) | priority_bit(GroupKind::expt_tp);
  if (given.expert_tp() == 1 || (then & expert) == 0) return "";
  ParallelConfig c = given;
  c.etp = 1;
  auto serves = [&](const ParallelConfig& candidate) {
    const int mask = crossing_mask(Layout(candidate), nodes);
    return (mask & expert) == 0 && (mask & dense & ~now) == 0;
  };
  try {
    std::string order_flag;
    if (!serves(c)) {
      c.order = best_order(c, nodes);
      if (!serves(c)) return "";
      order_flag = " --order " + c.order;
    }
    return "--etp 1" + order_flag + " keeps ep and expt_tp inside (expert dp " +
           std::to_string(layout.expert_dp()) + " -> " + std::to_string(Layout(c).expert_dp()) +
           ")";
  } catch (const ConfigError&) {
    return "";  // etp 1 breaks another rule of this config
  }
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
  KindSpan s;
  s.kind = k;
  s.level = level;
  s.groups = layout.num_groups(k, level);
  const std::optional<std::int64_t> size = layout.group_size(k, level);
  if (!size) {
    // Groups of several sizes (a custom embedding policy): listed whole, as the policy's
    // own results are.
    const GroupList groups = layout.groups(k, level);
    s.min_group_size = groups.empty() ? 0 : INT64_MAX;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const auto n = static_cast<std::int64_t>(groups[i].size());
      s.min_group_size = std::min(s.min_group_size, n);
      s.max_group_size = std::max(s.max_group_size, n);
      const std::int64_t spanned = nodes.nodes_spanned(groups[i]);
      s.crossing_groups += spanned > 1 ? 1 : 0;
      s.max_nodes_spanned = std::max(s.max_nodes_spanned, spanned);
    }
    return s;
  }
  s.min_group_size = s.max_group_size = *size;
  if (s.groups == 0) return s;
  if (*size == 1) {
    s.max_nodes_spanned = 1;
    return s;
  }
  // Large groups of consecutive ranks: a group [a, a + g) spans node(a + g - 1) - node(a)
  // + 1 nodes, from its first member alone (a world of 2^31 - 1 ranks in one dp group costs
  // one step, not 2^31).
  constexpr std::int64_t kRunShortcut = 1024;
  if (*size >= kRunShortcut && groups_are_runs(layout, k)) {
    const std::int64_t G = nodes.gpus_per_node();
    Rank first = 0;
    for (std::int64_t q = 0; q < s.groups; ++q) {
      layout.members(k, level, q * *size, std::span<Rank>(&first, 1));
      const std::int64_t spanned = (first + *size - 1) / G - first / G + 1;
      s.crossing_groups += spanned > 1 ? 1 : 0;
      s.max_nodes_spanned = std::max(s.max_nodes_spanned, spanned);
    }
    return s;
  }
  // Stream the members in pieces; every kind but intra_dist_opt lists each group
  // ascending, so a group's nodes are counted as changes of node along it. intra_dist_opt
  // marks nodes in a bitmap (one bit per node), cleared after each group.
  const bool ascending = k != GroupKind::intra_dist_opt;
  const std::int64_t G = nodes.gpus_per_node();
  std::vector<std::uint64_t> seen;
  std::vector<std::int64_t> touched;
  if (!ascending)
    seen.assign(static_cast<std::size_t>(nodes.nodes(layout.world_size()) / 64 + 1), 0);
  const std::int64_t total = layout.num_members(k, level);
  constexpr std::int64_t kPiece = 1 << 16;
  std::vector<Rank> buf(static_cast<std::size_t>(std::min(total, kPiece)));
  std::int64_t pos = 0, count = 0, node = -1, next = 0;
  auto finish_group = [&] {
    s.crossing_groups += count > 1 ? 1 : 0;
    s.max_nodes_spanned = std::max(s.max_nodes_spanned, count);
    if (!ascending) {
      if (static_cast<std::int64_t>(touched.size()) * 64 < static_cast<std::int64_t>(seen.size())) {
        for (std::int64_t n : touched) seen[static_cast<std::size_t>(n / 64)] = 0;
      } else {
        std::fill(seen.begin(), seen.end(), 0);
      }
      touched.clear();
    }
    pos = count = 0;
    node = -1;
    next = 0;
  };
  for (std::int64_t first = 0; first < total; first += kPiece) {
    const std::int64_t n = std::min(kPiece, total - first);
    layout.members(k, level, first, std::span<Rank>(buf.data(), static_cast<std::size_t>(n)));
    for (std::int64_t i = 0; i < n; ++i) {
      const Rank r = buf[static_cast<std::size_t>(i)];
      if (ascending) {
        if (r >= next) {  // a node change: divide only then
          node = r / G;
          next = (node + 1) * G;
          ++count;
        }
      } else {
        const std::int64_t nd = r / G;
        std::uint64_t& word = seen[static_cast<std::size_t>(nd / 64)];
        const std::uint64_t bit = std::uint64_t{1} << (nd % 64);
        if ((word & bit) == 0) {
          if (word == 0 && touched.size() < seen.size()) touched.push_back(nd);
          word |= bit;
          ++count;
        }
      }
      if (++pos == *size) finish_group();
    }
  }
  return s;
}

bool crosses_nodes(const Layout& layout, GroupKind k, const NodeMap& nodes) {
  const std::optional<LocalKind> lk = local_kind(k);
  if (!lk)
    throw ConfigError("kind", "crosses_nodes: kind " + std::string(kind_name(k)) +
                                  " is not one of tp, cp, ep, expt_tp");
  const RankGrid& grid = lk->expert ? layout.expert_grid() : layout.dense_grid();
  const std::int64_t s = grid.size(lk->axis), G = nodes.gpus_per_node();
  if (s == 1 || grid.world_size() <= G) return false;
  // A group is base + j*t (j < s). Its bases are x + y*T with x < t (every value of the
  // axes below) and y < m, T = t*s. It crosses when base mod G + e reaches G, e = (s-1)*t.
  // Over x, base mod G reaches min(rho + t - 1, G - 1) for rho = y*T mod G, so some group
  // crosses exactly when max(rho) + t - 1 + e >= G.
  const std::int64_t t = grid.stride(lk->axis), e = (s - 1) * t;
  if (e >= G) return true;
  const std::int64_t need = G - (t - 1 + e);  // some rho must reach it
  if (need <= 0) return true;
  const std::int64_t T = t * s, m = grid.world_size() / T;
  const std::int64_t g = std::gcd(T, G);
  if (m >= G / g) return G - g >= need;  // the residues are every multiple of g
  const std::int64_t step = T % G;
  std::int64_t rho = 0;
  for (std::int64_t y = 0; y < m; ++y, rho = (rho + step) % G)
    if (rho >= need) return true;
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

std::string best_order(const ParallelConfig& config, const NodeMap& nodes) {
  const std::vector<Axis> given = parse_order(config.order);
  std::vector<Axis> perm = given;
  std::sort(perm.begin(), perm.end());
  using Score = std::tuple<int, int, std::string>;
  Score best{crossing_mask(Layout(config), nodes), 0, config.order};
  do {
    ParallelConfig candidate = config;
    candidate.order = join(perm);
    std::optional<Layout> layout;
    try {
      layout.emplace(candidate);
    } catch (const ConfigError&) {
      continue;  // e.g. the pp strides of the two grids disagree (rule 11)
    }
    Score score{crossing_mask(*layout, nodes), kendall_distance(given, perm), candidate.order};
    if (score < best) best = std::move(score);
  } while (std::next_permutation(perm.begin(), perm.end()));
  return std::get<2>(best);
}

std::string TopologyWarning::message() const {
  std::string s = std::string(kind_name(kind)) + " groups cross nodes (" +
                  std::to_string(crossing_groups) + " of " + std::to_string(groups) +
                  " groups span up to " + std::to_string(max_nodes_spanned) + " nodes); ";
  if (order)
    return s + "order \"" + *order + "\" keeps them inside" + (reason.empty() ? "" : "; " + reason);
  if (group_size > gpus_per_node)
    return s + "no order keeps them inside: a group has " + std::to_string(group_size) +
           " ranks, a node " + std::to_string(gpus_per_node) + " GPUs" +
           (reason.empty() ? "" : "; " + reason);
  if (!reason.empty()) return s + reason;
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
    for (int l = 0; l < layout.levels(k); ++l)
      report.kinds.push_back(kind_span(layout, k, l, nodes));
  }
  const int now = crossing_mask(layout, nodes);
  report.best_order = now == 0 ? layout.config().order : best_order(layout.config(), nodes);
  ParallelConfig best_config = layout.config();
  best_config.order = report.best_order;
  const Layout best(best_config);
  const int then = crossing_mask(best, nodes);
  for (GroupKind k : kNodeLocalKinds) {
    if ((now & priority_bit(k)) == 0) continue;
    const KindSpan s = kind_span(layout, k, 0, nodes);
    TopologyWarning w;
    w.kind = k;
    w.crossing_groups = s.crossing_groups;
    w.groups = s.groups;
    w.max_nodes_spanned = s.max_nodes_spanned;
    w.group_size = s.max_group_size;
    w.gpus_per_node = nodes.gpus_per_node();
    if ((then & priority_bit(k)) == 0) {
      // The best order keeps k inside: advise it, and say what it pushes out instead.
      w.order = report.best_order;
      w.avoidable = true;
      std::vector<GroupKind> pushed;
      for (GroupKind o : kNodeLocalKinds)
        if ((then & priority_bit(o)) != 0 && (now & priority_bit(o)) == 0) pushed.push_back(o);
      if (!pushed.empty()) {
        std::vector<GroupKind> both = {k};
        both.insert(both.end(), pushed.begin(), pushed.end());
        const std::string why = product_text(layout, both, nodes.gpus_per_node());
        w.reason = kind_list(pushed) + " groups then cross" + (why.empty() ? "" : " (" + why + ")");
      }
    } else if (w.group_size <= nodes.gpus_per_node()) {
      // k fits a node, but not beside the more important kinds the best order keeps
      // inside: name them, with their sizes when together they exceed a node.
      std::vector<GroupKind> kept;
      if (const auto alone = suggest_order(layout.config(), k, nodes)) {
        ParallelConfig c = layout.config();
        c.order = *alone;
        const int mask = crossing_mask(Layout(c), nodes);
        for (GroupKind o : kNodeLocalKinds) {
          if (o == k) break;
          if ((then & priority_bit(o)) == 0 && (mask & priority_bit(o)) != 0) kept.push_back(o);
        }
      }
      if (!kept.empty()) {
        std::vector<GroupKind> all = kept;
        all.push_back(k);
        const std::string why = product_text(layout, all, nodes.gpus_per_node());
        const std::string name(kind_name(k));
        w.reason = (why.empty() ? "no valid order keeps " + name + " inside together with " +
                                      kind_list(kept)
                                : why + ": " + name + " groups must cross nodes") +
                   "; keeping " + kind_list(kept) + " inside";
      }
    }
    if (k == GroupKind::ep || k == GroupKind::expt_tp) {
      if (const std::string etp = etp_one_advice(layout, nodes, now, then); !etp.empty())
        w.reason += (w.reason.empty() ? (w.order ? "or " : "") : "; or ") + etp;
    }
    report.warnings.push_back(std::move(w));
  }
  return report;
}

}  // namespace commgrid
