// Node topology: which groups of a layout cross machine boundaries, and which order would
// keep the bandwidth-hungry ones inside a machine.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "commgrid/config.hpp"
#include "commgrid/group_kind.hpp"
#include "commgrid/layout.hpp"

namespace commgrid {

/// The default number of ranks (GPUs) per node: an 8-GPU server.
inline constexpr std::int64_t kDefaultGpusPerNode = 8;

/// How ranks sit on nodes: rank r runs on node r / G as local device r mod G, the way
/// launchers (torchrun, srun, mpirun --map-by node:PE=...) number ranks by default. The
/// world need not be a multiple of G: the last node is then partial (a job that uses part
/// of a machine), which changes no count below.
class NodeMap {
 public:
  /// Throws InvalidValueError (parameter "gpus_per_node") unless gpus_per_node >= 1.
  explicit NodeMap(std::int64_t gpus_per_node);
  [[nodiscard]] std::int64_t gpus_per_node() const noexcept { return g_; }
  /// The node that runs rank r.
  [[nodiscard]] std::int64_t node(Rank r) const noexcept { return r / g_; }
  /// r's device index inside its node.
  [[nodiscard]] std::int64_t device(Rank r) const noexcept { return r % g_; }
  /// Number of nodes a world of W ranks occupies (the last one possibly partial).
  [[nodiscard]] std::int64_t nodes(std::int64_t world_size) const noexcept {
    return (world_size + g_ - 1) / g_;
  }
  /// Number of distinct nodes the members touch (any member order).
  [[nodiscard]] std::int64_t nodes_spanned(std::span<const Rank> members) const;

 private:
  std::int64_t g_;
};

/// How one kind (one level, for hcp) sits on the nodes.
struct KindSpan {
  GroupKind kind = GroupKind::tp;
  int level = 0;                       ///< hcp level; 0 for every other kind
  std::int64_t groups = 0;             ///< number of groups
  std::int64_t min_group_size = 0;     ///< smallest group (equal to max for grid kinds)
  std::int64_t max_group_size = 0;     ///< largest group
  std::int64_t crossing_groups = 0;    ///< groups whose members are on more than one node
  std::int64_t max_nodes_spanned = 0;  ///< the most nodes one group touches (0: no groups)
  bool operator==(const KindSpan&) const = default;
};

/// A kind that wants the fast links inside a node but whose groups cross nodes.
struct TopologyWarning {
  GroupKind kind = GroupKind::tp;
  std::int64_t crossing_groups = 0;
  std::int64_t groups = 0;
  std::int64_t max_nodes_spanned = 0;
  std::int64_t group_size = 0;
  std::int64_t gpus_per_node = 0;
  /// The order to use instead (best_order), when it keeps this kind inside; nullopt when
  /// no valid order keeps it inside without pushing a more important kind out.
  std::optional<std::string> order;
  /// Whether another order would have kept this kind inside (`order` is set): only these
  /// fail `--strict`. False when the kind cannot be inside: a group is larger than a node,
  /// or more important kinds need the node (see `reason`).
  bool avoidable = false;
  /// Without an order: why the kind must cross ("tp·cp = 16 > 8 GPUs per node: cp groups
  /// must cross nodes; keeping tp inside"). With one: the less important kinds that the
  /// order pushes out instead ("cp groups then cross"), or empty. For ep and expt_tp it
  /// ends with the usual MoE fix when that keeps them inside and the layout has etp > 1:
  /// "or --etp 1 keeps ep and expt_tp inside (expert dp 8 -> 64)".
  std::string reason;
  /// One line without a prefix: `tp groups cross nodes (8 of 8 groups span up to 2 nodes);
  /// order "tp-cp-ep-dp-pp" keeps them inside`.
  [[nodiscard]] std::string message() const;
};

/// The whole check.
struct TopologyReport {
  std::int64_t world_size = 0;
  std::int64_t gpus_per_node = 0;
  std::int64_t nodes = 0;
  std::string order;                      ///< the layout's order string
  std::vector<KindSpan> kinds;            ///< one row per requested kind and hcp level
  std::vector<TopologyWarning> warnings;  ///< in the order tp, cp, ep, expt_tp
  std::string best_order;                 ///< best_order() of the layout's config
  /// Whether some warning could have been avoided by another order (`--strict` fails).
  [[nodiscard]] bool avoidable() const noexcept {
    for (const TopologyWarning& w : warnings)
      if (w.avoidable) return true;
    return false;
  }
};

/// The kinds whose traffic is heavy and latency-bound enough that they belong inside a
/// node: tp, cp, ep and expt_tp.
[[nodiscard]] bool wants_node_local(GroupKind k) noexcept;

/// How the groups of one kind (one hcp level) sit on the nodes. O(W) time: streams the
/// kind's members in pieces, so memory stays small at any world (a kind whose groups are
/// not ascending, intra_dist_opt, needs one bit per node). Throws UnknownKindError for a
/// kind the layout does not build.
[[nodiscard]] KindSpan kind_span(const Layout& layout, GroupKind k, int level,
                                 const NodeMap& nodes);

/// Whether any group of a node-local kind (tp, cp, ep, expt_tp) crosses a node boundary.
/// Those kinds are single grid axes, so the answer follows from the axis' size and stride
/// and the residues of the group bases modulo the node size: O(min(groups, gpus_per_node)),
/// no allocation.
[[nodiscard]] bool crosses_nodes(const Layout& layout, GroupKind k, const NodeMap& nodes);

/// An order that keeps every group of kind k inside one node, or nullopt when none exists.
///
/// Search rule: the candidates are the permutations of the tokens of config.order (the
/// axes an order omits have size 1, so they never change a group) that give a valid
/// layout, i.e. constructing a Layout with them throws no ConfigError. Among the
/// candidates under which no group of k crosses a node, the answer is the one that
///   1. leaves the fewest of tp, cp, ep, expt_tp crossing nodes, then
///   2. is closest to config.order (fewest pairs of tokens in the other relative order,
///      i.e. the Kendall tau distance: the smallest change to the user's order), then
///   3. comes first as a string (so the answer is deterministic).
/// Returns config.order itself when k already stays inside. At most 120 candidates, each
/// checked in O(W / group size) per node-local kind. k must be one of tp, cp, ep, expt_tp
/// (else ConfigError). config must be valid (throws its ConfigError otherwise).
[[nodiscard]] std::optional<std::string> suggest_order(const ParallelConfig& config, GroupKind k,
                                                       const NodeMap& nodes);

/// The order that serves the node-local kinds best, by importance tp > cp > ep > expt_tp:
/// among the valid permutations of config.order's tokens, the one that keeps tp inside
/// nodes if any can, then cp, then ep, then expt_tp (each only without giving up a more
/// important one), then the closest to config.order (Kendall tau distance), then the
/// first as a string. Returns config.order when nothing better exists, so following the
/// advice never loops: the best order's best order is itself. At most 120 candidates,
/// each checked in O(min(W, gpus_per_node)) per kind.
[[nodiscard]] std::string best_order(const ParallelConfig& config, const NodeMap& nodes);

/// Checks a layout: one KindSpan per requested kind (per level for hcp; kinds the layout
/// does not build throw UnknownKindError), and one warning for each of tp, cp, ep and
/// expt_tp whose groups cross nodes, whether or not it was requested (a kind left out of
/// the table must not hide a slow layout). Every warning that names an order names
/// best_order(), so the advice is the same whichever kind it is read from.
[[nodiscard]] TopologyReport check_topology(const Layout& layout, std::span<const GroupKind> kinds,
                                            const NodeMap& nodes);

}  // namespace commgrid
