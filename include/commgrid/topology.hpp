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
  /// An order that keeps every group of this kind inside one node (see suggest_order),
  /// or nullopt when no valid order does.
  std::optional<std::string> order;
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
};

/// The kinds whose traffic is heavy and latency-bound enough that they belong inside a
/// node: tp, cp, ep and expt_tp.
[[nodiscard]] bool wants_node_local(GroupKind k) noexcept;

/// How the groups of one kind (one hcp level) sit on the nodes. O(W): enumerates the kind.
/// Throws UnknownKindError for a kind the layout does not build.
[[nodiscard]] KindSpan kind_span(const Layout& layout, GroupKind k, int level,
                                 const NodeMap& nodes);

/// Whether any group of a node-local kind (tp, cp, ep, expt_tp) crosses a node boundary.
/// O(number of groups), no allocation: those kinds are single grid axes whose members are
/// ascending, so a group crosses exactly when its first and last members differ in node.
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
[[nodiscard]] std::optional<std::string> suggest_order(const ParallelConfig& config,
                                                       GroupKind k, const NodeMap& nodes);

/// Checks a layout: one KindSpan per requested kind (per level for hcp; kinds the layout
/// does not build throw UnknownKindError), and one warning for each of tp, cp, ep and
/// expt_tp whose groups cross nodes, whether or not it was requested (a kind left out of
/// the table must not hide a slow layout).
[[nodiscard]] TopologyReport check_topology(const Layout& layout, std::span<const GroupKind> kinds,
                                            const NodeMap& nodes);

}  // namespace commgrid
