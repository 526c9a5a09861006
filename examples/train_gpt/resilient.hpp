// Training that loses a process and goes on (issue 21, docs/resilience.md): under
// `commgrid launch --spares S`, each rank keeps in-memory snapshots of its state every K
// steps; after a failure the survivors and a spare agree on the next epoch, regroup, roll
// back to the last snapshot every survivor holds, and the spare fetches the state of the
// rank it replaces from a data-parallel replica. The losses and gradient norms are those
// of a run without failures.
#pragma once

#include <commgrid/commgrid.hpp>
#include <optional>
#include <vector>

#include "trainer.hpp"

namespace train_gpt {

/// What the resilient loop does besides training.
struct ResilienceConfig {
  int snapshot_every = 1;  ///< K: a snapshot of the state at every K-th step
  /// Test-only faults: process `process` (incarnation 0) kills itself with SIGKILL at the
  /// start of step `step` (0-based).
  struct Kill {
    std::int64_t process = -1;
    int step = -1;
  };
  std::vector<Kill> kills;
};

/// Checks that the layout keeps every rank's state on a replica (dp > 1, no distributed
/// optimizer, no expert parallelism: the state recovery this example implements); throws
/// IncompatibleError naming what is missing.
void check_resilient_config(const TrainConfig& config, const commgrid::ParallelConfig& layout);

/// One process of a resilient run: trains (as a spare: waits), recovering from failures.
/// Returns every step's result on the process that holds logical rank 0 at the end,
/// nullopt on the others. Throws FencedError on a process declared dead, BackendError when
/// the state of a rank is lost (every replica died) naming the logical rank.
std::optional<std::vector<StepResult>> run_resilient(const commgrid::SpareLaunch& launch,
                                                     const commgrid::ParallelConfig& layout,
                                                     const TrainConfig& config,
                                                     const ResilienceConfig& resilience);

}  // namespace train_gpt
