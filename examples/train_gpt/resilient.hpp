// Training that loses a process and goes on (docs/resilience.md): under
// `commgrid launch --spares S`, train_gpt runs its steps through commgrid's resilient driver
// (<commgrid/resilient_driver.hpp>). The driver keeps in-memory snapshots every K steps,
// ships them to buddies where a rank has no full replica, and recovers from failures; this
// file gives it the model's state (TrainerState: the Trainer's parameters and optimizer
// state, and the results so far) and the model's callbacks. The losses and gradient norms
// are those of a run without failures.
#pragma once

#include <commgrid/commgrid.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer.hpp"

namespace train_gpt {

/// What the resilient loop does besides training.
struct ResilienceConfig {
  int snapshot_every = 1;  ///< K: a snapshot of the state at every K-th step
  commgrid::StateSource state_from = commgrid::StateSource::automatic;
  /// Buddy copies: logical rank r ships its state to logical rank (r + buddy_shift) mod W
  /// at every snapshot. commgrid::buddy_shift_for() puts the buddy on the next node.
  std::int64_t buddy_shift = 1;
  /// Keep the connections across epochs (commgrid::make_gloo_connections): a recovery makes
  /// anew only the pairs that held an unfinished operation.
  bool keep_connections = false;
  /// When a failure finds no spare: go on with fewer data-parallel replicas (the global
  /// batch and the micro-batch size kept, each replica taking more micro-batches), the
  /// state resharded to the smaller layout; false: the job ends (NoSpareError).
  bool shrink = true;
  /// The most bytes the kept snapshots and copies may take (0: the memory available).
  std::size_t snapshot_memory_limit = 0;
  /// --fault-kill: process `process` (incarnation 0) kills itself with SIGKILL at the start
  /// of step `step` (0-based), or, with step kDuringRecovery, in its first recovery once the
  /// new epoch's groups exist, before the state moves (in a shrink, after the transfer), or,
  /// with kAtStart, before the job's first groups exist (the others' creation fails).
  static constexpr int kDuringRecovery = -2;
  static constexpr int kAtStart = -3;
  struct Kill {
    std::int64_t process = -1;
    int step = -1;
  };
  std::vector<Kill> kills;
  /// Test-only: process `process`'s state provider throws in `call` ("save" at step `step`,
  /// "load" or "reshard" the first time).
  struct StateFault {
    std::int64_t process = -1;
    std::string call;
    int step = -1;
  };
  std::vector<StateFault> state_faults;
  /// Test-only: the least milliseconds each step lasts (the rest slept after it): keeps a
  /// short job training while a harness injects a fault from outside.
  int pace_ms = 0;
};

/// Why the layout leaves some rank's state without a full data-parallel replica (dp 1, the
/// distributed optimizer's sharded state, experts sharded over ep); empty when every rank
/// has one.
std::string why_no_replica(const TrainConfig& config, const commgrid::ParallelConfig& layout);

/// Checks that the run can recover every rank's state: `replica` needs a layout with full
/// replicas (IncompatibleError naming what is missing), `buddy` a buddy other than the rank
/// itself (IncompatibleError naming the world size and the shift).
void check_resilient_config(const TrainConfig& config, const commgrid::ParallelConfig& layout,
                            const ResilienceConfig& resilience);

/// What a resilient run reports: every step's result, the layout and run that finished
/// (after a shrink: the smaller layout, with more micro-batches per replica), and every
/// epoch's layout and members.
struct ResilientResult {
  std::vector<StepResult> steps;
  commgrid::ParallelConfig layout;
  TrainConfig config;
  std::vector<commgrid::EpochRecord> epochs;
};

/// One process of a resilient run: trains (as a spare: waits), recovering from failures.
/// Returns the run's result on the process that holds logical rank 0 at the end, nullopt on
/// the others. Throws FencedError on a process declared dead, commgrid::RecoveryError
/// (StateLostError, NoSpareError, ...) when the job cannot go on, naming the logical rank.
std::optional<ResilientResult> run_resilient(const commgrid::SpareLaunch& launch,
                                             const commgrid::ParallelConfig& layout,
                                             const TrainConfig& config,
                                             const ResilienceConfig& resilience);

}  // namespace train_gpt
