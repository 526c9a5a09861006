// RankMap: the logical ranks a layout lays out, on the physical processes of a job that
// has spares, epoch after epoch as processes fail and spares take their places; and the
// smaller layout a job shrinks to when no spare is left. Pure: no communication.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "commgrid/axis.hpp"
#include "commgrid/config.hpp"
#include "commgrid/error.hpp"

namespace commgrid {

/// What a physical process does in an epoch.
enum class ProcessRole : std::uint8_t {
  active,  ///< holds a logical rank
  spare,   ///< holds none; takes a failed process's rank in a later epoch
  dead,    ///< failed (or fenced); never talks to the job again under this identity
};

/// "active", "spare" or "dead".
const char* role_name(ProcessRole r) noexcept;

/// Where a job's spare processes are.
struct SparePlacement {
  std::int64_t spares = 0;  ///< S processes beyond the world's W
  /// When given, the job runs on nodes of this many processes: W and S must be whole
  /// nodes, the spares are the last S / gpus_per_node nodes, and a failed node's ranks move
  /// together onto one spare node in their local order (so node-local groups such as tp
  /// stay inside a node).
  std::optional<std::int64_t> gpus_per_node;
  bool operator==(const SparePlacement&) const = default;
};

struct ShrinkPlan;

/// The logical ranks 0 ... W-1 on the physical processes 0 ... W+S-1 in one epoch. Epoch 0
/// puts logical rank r on process r and the spares on processes W ... W+S-1. Every later
/// epoch comes from replace() (spares take failed ranks' places), revive() (a restarted
/// process rejoins as a spare) or shrink() (a smaller world, from plan_shrink, when the
/// spares do not suffice; replace_or_shrink chooses).
class RankMap {
 public:
  /// Throws InvalidValueError ("spares", "gpus_per_node") for negative or zero values and
  /// IncompatibleError when whole nodes cannot hold the world or the spares; OverflowError
  /// when W + S exceeds kMaxWorldSize.
  explicit RankMap(std::int64_t world_size, SparePlacement placement = {});

  [[nodiscard]] std::int64_t world_size() const noexcept { return world_size_; }
  [[nodiscard]] std::int64_t num_processes() const noexcept {
    return static_cast<std::int64_t>(role_.size());
  }
  [[nodiscard]] std::int64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] const SparePlacement& placement() const noexcept { return placement_; }

  /// The role of a process. Throws RankOutOfRangeError ("process").
  [[nodiscard]] ProcessRole role(std::int64_t process) const;
  /// The logical rank a process holds, nullopt for a spare or a dead process.
  [[nodiscard]] std::optional<Rank> logical_rank(std::int64_t process) const;
  /// The process holding a logical rank. Throws RankOutOfRangeError ("rank").
  [[nodiscard]] std::int64_t process_of(Rank logical) const;
  /// The spare processes, ascending; and how many there are.
  [[nodiscard]] std::vector<std::int64_t> spare_processes() const;
  [[nodiscard]] std::int64_t spares_left() const noexcept { return spares_left_; }
  /// The node of a process (process / gpus_per_node), or nullopt without nodes.
  [[nodiscard]] std::optional<std::int64_t> node_of(std::int64_t process) const noexcept;

  /// The next epoch after the processes `failed` (any order, duplicates ignored; spares and
  /// already dead processes may be among them) died: every logical rank they held moves to
  /// a spare, and they are dead. Spares are taken lowest first; with nodes, the ranks of
  /// one failed node move together to the lowest spare node with room for all of them,
  /// each to the spare with its local index when that one is free. Throws
  /// NoSpareError naming the logical ranks that found no spare (the map is unchanged), and
  /// RankOutOfRangeError for a process outside the job.
  [[nodiscard]] RankMap replace(std::span<const std::int64_t> failed) const;
  /// The next epoch with a dead process back as a spare (a restarted process). Throws
  /// IncompatibleError unless the process is dead.
  [[nodiscard]] RankMap revive(std::int64_t process) const;
  /// The same map numbered as epoch `epoch`: a job's epoch may apply several changes (a
  /// revive, then a replace), and Recovery numbers each resulting map with the job's epoch.
  [[nodiscard]] RankMap at_epoch(std::int64_t epoch) const;
  /// The next epoch of a smaller world (`plan` from plan_shrink over this map's logical
  /// ranks) after the processes `dead` died (any order, duplicates ignored; spares and
  /// already dead processes may be among them): the world is plan.config.world_size; the
  /// process of each old rank r the plan keeps holds plan.new_rank[r], a dead one's rank
  /// going to a spare as in replace(); the surviving processes of dropped ranks become
  /// spares; the dead are dead. One epoch, like replace(). Throws IncompatibleError
  /// ("plan") when the plan is not a bijection onto its world or is for another world
  /// size, NoSpareError when a kept rank of a dead process finds no spare, and
  /// RankOutOfRangeError for a process outside the job.
  [[nodiscard]] RankMap shrink(const ShrinkPlan& plan, std::span<const std::int64_t> dead) const;

  /// One line: "epoch=2 world=8 processes=10 map=0,1,9,3,4,5,6,7 spare=8 dead=2": equal
  /// on two processes exactly when their maps are equal.
  [[nodiscard]] std::string canonical() const;
  bool operator==(const RankMap&) const = default;

 private:
  RankMap() = default;
  std::int64_t world_size_ = 0;
  std::int64_t epoch_ = 0;
  std::int64_t spares_left_ = 0;
  SparePlacement placement_;
  std::vector<std::int64_t> process_of_;  ///< per logical rank
  std::vector<Rank> logical_;             ///< per process: its logical rank, or -1
  std::vector<ProcessRole> role_;         ///< per process
};

/// A failure found too few spares: names the logical ranks left without a process. A
/// runtime event (RecoveryError), not bad input.
class NoSpareError : public RecoveryError {
 public:
  NoSpareError(const std::string& message, std::vector<Rank> ranks)
      : RecoveryError(message), ranks_(std::move(ranks)) {}
  [[nodiscard]] const std::vector<Rank>& ranks() const noexcept { return ranks_; }

 private:
  std::vector<Rank> ranks_;
};

/// How a job with failed ranks and no spare goes on with fewer data-parallel replicas: the
/// replicas (dense dp coordinates) that lost a rank are dropped, the config shrinks to the
/// largest dp that the survivors fill and that is valid (the distributed optimizer's
/// instances and the expert grid must still divide it), and every surviving rank of a kept
/// replica keeps its coordinates with its dp coordinate renumbered among the kept ones.
/// Ranks of dropped replicas that survived become spares.
struct ShrinkPlan {
  ParallelConfig config;                      ///< the smaller layout (world_size = its W')
  std::vector<std::int64_t> kept_dp;          ///< the old dp coordinates kept, ascending
  std::vector<std::optional<Rank>> new_rank;  ///< per old logical rank: its rank in the new
                                              ///< layout, nullopt when dropped or dead
  /// The inverse of new_rank: per new rank (0 ... config.world_size-1), the old logical
  /// rank it was.
  [[nodiscard]] std::vector<Rank> old_ranks() const;
};

/// The shrink of `config` after the logical ranks `dead` failed. When `global_batch` is
/// given, dp' must also divide it (the global batch stays the same, so each replica takes
/// more micro-batches). Throws IncompatibleError ("dp") naming the dead ranks and the reason
/// when no valid smaller layout exists (every replica lost a rank, or no dp' <= the
/// surviving replicas is valid), and RankOutOfRangeError for a dead rank outside the world.
/// Compat seed only: a HEAD config is refused (IncompatibleError "compat").
[[nodiscard]] ShrinkPlan plan_shrink(const ParallelConfig& config, std::span<const Rank> dead,
                                     std::optional<std::int64_t> global_batch = std::nullopt);

/// The next epoch of a job after the processes `dead` died, spares first: replace() when
/// the spares take every dead rank; otherwise a shrink. The data-parallel replicas that lost
/// ranks get spares in order of fewest lost ranks (then lowest dp coordinate) while the
/// spares last, and the others are dropped by plan_shrink(config, their dead ranks,
/// global_batch). `config` is the layout of `map`'s current epoch.
struct EpochChange {
  RankMap map;                       ///< the next epoch's map
  std::optional<ShrinkPlan> shrink;  ///< set when the world shrank
};
/// Deterministic: every process that calls it with the same map, dead processes and config
/// gets the same change or the same error. Throws IncompatibleError ("dp", from plan_shrink,
/// naming every dead logical rank) when no valid smaller layout exists, IncompatibleError
/// ("world_size") when config is not the map's world, and RankOutOfRangeError for a
/// process outside the job.
[[nodiscard]] EpochChange replace_or_shrink(
    const RankMap& map, std::span<const std::int64_t> dead, const ParallelConfig& config,
    std::optional<std::int64_t> global_batch = std::nullopt);

}  // namespace commgrid
