// Training that loses a process and goes on (issue 21, docs/resilience.md): under
// `commgrid launch --spares S`, each rank keeps in-memory snapshots of its state every K
// steps; after a failure the survivors and a spare agree on the next epoch, regroup, roll
// back to the last snapshot every survivor holds, and the spare fetches the state of the
// rank it replaces: from a data-parallel replica where every rank has one, else from the
// buddy copy that each rank ships to another rank at every snapshot. The losses and
// gradient norms are those of a run without failures.
#pragma once

#include <commgrid/commgrid.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer.hpp"

namespace train_gpt {

/// The state of a logical rank is lost: every process that held it (its data-parallel
/// replicas, or it and its buddy) died. Every rank of the epoch throws it alike.
class StateLostError : public commgrid::BackendError {
 public:
  using commgrid::BackendError::BackendError;
};

/// Where the state of a replaced rank comes from.
enum class StateSource : std::uint8_t {
  automatic,  ///< replica where the layout gives every rank one, else buddy
  replica,    ///< a surviving member of its data-parallel group (a full replica)
  buddy,      ///< the copy its buddy received at the last snapshot
};

/// "auto", "replica" or "buddy"; throws InvalidValueError ("state_from") for other text.
StateSource parse_state_source(const std::string& text);

/// What the resilient loop does besides training.
struct ResilienceConfig {
  int snapshot_every = 1;  ///< K: a snapshot of the state at every K-th step
  StateSource state_from = StateSource::automatic;
  /// Buddy copies: logical rank r ships its state to logical rank (r + buddy_shift) mod W
  /// at every snapshot. buddy_shift_for() puts the buddy on the next node.
  std::int64_t buddy_shift = 1;
  /// When a failure finds no spare: go on with fewer data-parallel replicas (the global
  /// batch and the micro-batch size kept, each replica taking more micro-batches), the
  /// state resharded to the smaller layout; false: the job ends (NoSpareError).
  bool shrink = true;
  /// Test-only faults: process `process` (incarnation 0) kills itself with SIGKILL at the
  /// start of step `step` (0-based), or, with step kDuringRecovery, when its first recovery
  /// has built the new epoch's groups and is about to move the state.
  static constexpr int kDuringRecovery = -2;
  struct Kill {
    std::int64_t process = -1;
    int step = -1;
  };
  std::vector<Kill> kills;
};

/// The buddy shift that puts logical rank r's buddy on another node: the processes per
/// node when the job spans several nodes and the world more than one, else 1 (one node:
/// the next rank). `world_size` W, `local_world_size` the processes per node, `nnodes`.
std::int64_t buddy_shift_for(std::int64_t world_size, std::int64_t local_world_size,
                             std::int64_t nnodes);

/// Why the layout leaves some rank's state without a full data-parallel replica (dp 1, the
/// distributed optimizer's sharded state, experts sharded over ep); empty when every rank
/// has one.
std::string why_no_replica(const TrainConfig& config, const commgrid::ParallelConfig& layout);

/// The source the run uses: `automatic` resolved against the layout.
StateSource resolve_state_source(const TrainConfig& config, const commgrid::ParallelConfig& layout,
                                 const ResilienceConfig& resilience);

/// Checks that the run can recover every rank's state: `replica` needs a layout with full
/// replicas (IncompatibleError naming what is missing), `buddy` a buddy other than the rank
/// itself (IncompatibleError naming the world size and the shift).
void check_resilient_config(const TrainConfig& config, const commgrid::ParallelConfig& layout,
                            const ResilienceConfig& resilience);

/// One process of a resilient run: trains (as a spare: waits), recovering from failures.
/// Returns every step's result on the process that holds logical rank 0 at the end,
/// nullopt on the others. Throws FencedError on a process declared dead, StateLostError when
/// the state of a rank is lost (every replica, or the rank and its buddy, died) naming the
/// logical rank.
std::optional<std::vector<StepResult>> run_resilient(const commgrid::SpareLaunch& launch,
                                                     const commgrid::ParallelConfig& layout,
                                                     const TrainConfig& config,
                                                     const ResilienceConfig& resilience);

}  // namespace train_gpt
