// The resilient driver: runs a program's training steps under `commgrid launch --spares S`
// and keeps the job going when processes die. Around the program's steps it takes an
// in-memory snapshot of the state every K steps (and, where a rank has no full replica,
// ships it to a buddy rank), and on a failure it detects, agrees on the next epoch
// (Recovery), regroups (the epoch's world and groups from the program's WorldFactory),
// and restores: every survivor goes back to the latest snapshot they all hold, a spare
// that took a rank gets that rank's state from a data-parallel replica or from the buddy
// copy, and a shrunk world's ranks rebuild theirs from the old ranks' states
// (StateProvider::reshard). The program's losses then equal a run without failures.
// Model- and backend-agnostic; plain callbacks, bytes in and out. docs/resilience.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "commgrid/process_groups.hpp"
#include "commgrid/recovery.hpp"
#include "commgrid/state_provider.hpp"

namespace commgrid {

/// Where the state of a rank that a spare takes over comes from.
enum class StateSource : std::uint8_t {
  automatic,  ///< replica where every rank has one (dp > 1 and a replicated state), else buddy
  replica,    ///< a surviving member of its data-parallel group
  buddy,      ///< the copy its buddy, logical rank (r + buddy_shift) mod W, received
};
/// "auto", "replica" or "buddy". Throws InvalidValueError ("state_from") for anything else.
[[nodiscard]] StateSource parse_state_source(std::string_view text);
/// "auto", "replica" or "buddy".
[[nodiscard]] std::string_view state_source_name(StateSource source) noexcept;

/// How the driver runs. Every process of the job gives the same.
struct ResilientOptions {
  /// Epoch 0's layout (world_size = the launch's world size).
  ParallelConfig layout;
  /// Creates each epoch's world (and a shrink's transfer world): e.g. make_gloo_world over
  /// the Recovery's store with the given prefix. Required.
  WorldFactory factory;
  /// The options of ProcessGroups::initialize for every epoch's groups.
  InitOptions init;
  /// K: a snapshot of the state at every K-th step (>= 1).
  std::int64_t snapshot_every = 1;
  StateSource state_from = StateSource::automatic;
  /// Whether every rank's state equals that of its data-parallel replicas (false when the
  /// program shards state over dp: the distributed optimizer, experts over ep). `replica`
  /// needs it; `automatic` uses replicas only with it.
  bool replicated_over_dp = true;
  /// Buddy copies: logical rank r ships its snapshot to (r + buddy_shift) mod W
  /// (buddy_shift_for() puts the buddy on the next node). After a shrink to a world that
  /// the shift divides, 1.
  std::int64_t buddy_shift = 1;
  /// When a failure finds no spare: go on with fewer data-parallel replicas
  /// (RecoveryOptions::shrink over `layout`); needs a compat seed layout. false: the job
  /// ends (NoSpareError).
  bool shrink = true;
  /// With shrink: every smaller dp must divide it (the global batch is kept).
  std::optional<std::int64_t> global_batch;
  /// The most bytes the kept snapshots and buddy copies may hold (the last two of each);
  /// 0: the memory available when the driver starts. A snapshot that does not fit ends the
  /// job with an error naming the sizes.
  std::size_t snapshot_memory_limit = 0;
};

/// What the program gets at the start of each epoch in which this process holds a rank.
struct EpochContext {
  std::int64_t epoch = 0;
  Rank rank = 0;          ///< this process's logical rank
  ParallelConfig layout;  ///< the epoch's layout (after a shrink, the smaller one)
  std::shared_ptr<Communicator> world;
  std::shared_ptr<ProcessGroups> groups;
};

/// What one epoch was, for reports: its layout, who held which rank, and what its recovery
/// cost on this process.
struct EpochRecord {
  std::int64_t epoch = 0;
  ParallelConfig layout;
  std::vector<std::int64_t> process_of;  ///< the process of each logical rank
  std::vector<std::int64_t> dead;        ///< the processes its decision declared dead
  bool shrink = false;                   ///< the world shrank into it
  /// The step training resumed at in this epoch on this process (-1: it holds no rank).
  std::int64_t resumed_at = -1;
  /// This process's recovery into the epoch, by part (epoch 0: zeros): agreeing on it,
  /// creating its world and groups, start_epoch, and moving the state (snapshot rollback,
  /// replica or buddy transfer, a shrink's reshard).
  std::chrono::duration<double> agreement{0}, groups{0}, model{0}, state{0};
  /// The CPU time this process (all its threads) spent in the recovery into the epoch,
  /// failed attempts included: the work a recovery costs a process whatever the cores.
  std::chrono::duration<double> cpu{0};
};

/// The program's side of the loop: plain callbacks.
struct ResilientCallbacks {
  /// Builds the program's model over the epoch's groups (collective over them as the
  /// program needs), in its initial state: the driver then loads the state to go on from,
  /// except when that is step 0's (a rank then keeps the initial state). Required.
  std::function<void(const EpochContext&)> start_epoch;
  /// Releases everything that refers to the epoch's groups; the driver releases them next.
  std::function<void()> stop_epoch;
  /// At the start of each step, before its snapshot (for logs and tests: a fault injected
  /// here happens before this process could learn of another's failure).
  std::function<void(std::int64_t step)> begin_step;
  /// One training step (0-based). A BackendError (a peer died) starts a recovery; any
  /// other exception ends this process. Required.
  std::function<void(std::int64_t step)> step;
  /// After each decision this process adopts, before the epoch's world exists (for logs and
  /// tests).
  std::function<void(const EpochDecision&)> decided;
  /// After each recovery into an epoch in which this process holds a rank, once training
  /// can go on (the record's times are filled).
  std::function<void(const EpochRecord&)> recovered;
  /// After each step completed (0-based), with whether it is the first one completed since
  /// this process's last recovery.
  std::function<void(std::int64_t step, bool first_after_recovery)> stepped;
};

/// The buddy shift that puts logical rank r's buddy on another node: the processes per
/// node when the job spans several nodes and the world more than one, else 1.
[[nodiscard]] std::int64_t buddy_shift_for(std::int64_t world_size, std::int64_t local_world_size,
                                           std::int64_t nnodes);

/// One process of a resilient job. Not thread-safe: one thread runs it.
class ResilientDriver {
 public:
  /// Over this process's Recovery (make_recovery(launch), or a test's). Checks the options
  /// (ConfigError naming the field): a factory and callbacks are given, K >= 1, the layout
  /// is the map's world, `replica` has replicas, buddy copies have another rank to go to.
  /// With options.shrink the Recovery must have been made with RecoveryOptions::shrink over
  /// the same layout (make_resilient_driver does it).
  ResilientDriver(std::unique_ptr<Recovery> recovery, ResilientOptions options);
  ~ResilientDriver();
  ResilientDriver(const ResilientDriver&) = delete;
  ResilientDriver& operator=(const ResilientDriver&) = delete;

  /// Runs steps [0, steps) with `state` and `callbacks`, recovering from failures; a spare
  /// waits until it takes a rank or the job is done. Returns this process's logical rank at
  /// the end (logical rank 0 also marks the job done), nullopt on a process that holds
  /// none then. Throws FencedError when this process was declared dead, RecoveryError (its
  /// subclasses NoSpareError, StateLostError, StateProviderError) when the job cannot go
  /// on: the same message on every process, posted once (Recovery::job_ended).
  std::optional<Rank> run(std::int64_t steps, StateProvider& state,
                          const ResilientCallbacks& callbacks);

  [[nodiscard]] Recovery& recovery() noexcept { return *recovery_; }
  [[nodiscard]] const Recovery& recovery() const noexcept { return *recovery_; }
  /// The current epoch's layout.
  [[nodiscard]] const ParallelConfig& layout() const noexcept;
  /// Where a replaced rank's state comes from in the current epoch (replica or buddy).
  [[nodiscard]] StateSource source() const noexcept;
  /// Every epoch this process has seen, oldest first (epoch 0 included).
  [[nodiscard]] const std::vector<EpochRecord>& epochs() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Recovery> recovery_;
  std::unique_ptr<Impl> impl_;
};

/// The driver of a process started by `commgrid launch --spares S`: opens the job's store as
/// this process (make_recovery), with RecoveryOptions::shrink over options.layout when
/// options.shrink and the layout is compat seed (a HEAD layout then ends the job with
/// NoSpareError when no spare is left).
[[nodiscard]] std::unique_ptr<ResilientDriver> make_resilient_driver(const SpareLaunch& launch,
                                                                     ResilientOptions options,
                                                                     RecoveryOptions recovery = {});

}  // namespace commgrid
