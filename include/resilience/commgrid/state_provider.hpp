// StateProvider: what a program gives the resilient driver so that a job can lose a
// process and go on: its state as bytes (a snapshot saved, a snapshot loaded) and, when
// the world shrinks, how a rank of the smaller layout rebuilds its state from the old
// ranks' states. Model-agnostic: the driver keeps, ships and moves the bytes; only the
// program knows what they mean. docs/resilience.md, "The driver".
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "commgrid/axis.hpp"
#include "commgrid/config.hpp"
#include "commgrid/group_kind.hpp"
#include "commgrid/rank_map.hpp"

namespace commgrid {

/// A state as bytes: what StateProvider::save returns and load receives.
using StateBytes = std::vector<std::byte>;

/// What a rank of a shrunk layout rebuilds its state from (StateProvider::reshard_needs and
/// reshard): the old layout, the new one, and which rank was which.
struct ReshardContext {
  ParallelConfig old_layout;  ///< the layout of the epoch that failed
  ParallelConfig new_layout;  ///< the shrunk layout
  Rank rank = 0;              ///< this process's logical rank in new_layout
  Rank old_rank = 0;          ///< the old logical rank that became `rank` (plan.old_ranks())
  ShrinkPlan plan;            ///< every old rank's new rank
};

/// One state a new rank needs, with alternatives: each alternative is a set of old logical
/// ranks whose states together make it (one rank, or an optimizer shard group); the driver
/// gives the first alternative whose every member's state some live process holds.
struct ReshardNeed {
  std::vector<std::vector<Rank>> alternatives;
};

/// The states the driver found for one ReshardNeed: the ranks of the alternative used and
/// each one's state, in the same order.
struct ReshardPart {
  std::vector<Rank> ranks;
  std::vector<std::span<const std::byte>> states;
};

/// The program's state, as the driver sees it. Called by the driver's thread only, and only
/// on a process that holds a logical rank, between start_epoch and stop_epoch (the driver's
/// callbacks). An exception from any of these ends the job: every process then fails with
/// StateProviderError naming this process, the call and the exception's message.
class StateProvider {
 public:
  virtual ~StateProvider() = default;
  /// This rank's whole state now (at the start of the step the driver is at): everything a
  /// rank with the same logical coordinates needs to go on from here, results so far
  /// included when the program keeps them.
  [[nodiscard]] virtual StateBytes save() = 0;
  /// Replaces this rank's state with what save() returned on this rank or on a rank with the
  /// same logical coordinates (a data-parallel replica, or the rank whose buddy copy it is).
  virtual void load(std::span<const std::byte> state) = 0;
  /// After a shrink: which old states this rank (context.rank of the new layout) needs.
  /// The default: the state of its own old rank (context.old_rank), for a state that a
  /// shrink does not change (nothing sharded over data-parallel ranks).
  [[nodiscard]] virtual std::vector<ReshardNeed> reshard_needs(const ReshardContext& context);
  /// Rebuilds this rank's state from `parts` (one per need, in the order of
  /// reshard_needs()). Called only when the job goes back to a step after 0 (at step 0 the
  /// state start_epoch gave is the initial one). The default loads the first part's first
  /// state.
  virtual void reshard(const ReshardContext& context, std::span<const ReshardPart> parts);
};

/// Alternatives for a state that every data-parallel replica holds equally: `old_rank`
/// itself, then each other member of its old dp group (ascending).
[[nodiscard]] std::vector<std::vector<Rank>> replica_alternatives(const ParallelConfig& old_layout,
                                                                  Rank old_rank);
/// Alternatives for a state sharded over a group of the old layout (the distributed
/// optimizer's intra_dp_cp, say): the members of `old_rank`'s group of `shard_group`,
/// ascending (the communicator's rank order).
[[nodiscard]] std::vector<std::vector<Rank>> shard_group_alternatives(
    const ParallelConfig& old_layout, Rank old_rank, GroupKind shard_group);
/// Alternatives for the experts a new rank holds (MoE): the old ranks with its new expert
/// coordinates (pipeline stage, expert-tp, ep), each alone, or, with `shard_group`
/// (intra_expt_dp under the distributed optimizer), each one's group of that kind.
[[nodiscard]] std::vector<std::vector<Rank>> expert_alternatives(
    const ParallelConfig& old_layout, const ParallelConfig& new_layout, Rank new_rank,
    std::optional<GroupKind> shard_group = std::nullopt);

}  // namespace commgrid
