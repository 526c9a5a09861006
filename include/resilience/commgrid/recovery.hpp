// Recovery: lose a process, keep the job. Detect (a failed epoch is marked in the store),
// agree (one decision per epoch, by set_if_absent), fence (the dead may not rejoin) and
// regroup (the next epoch's world and ProcessGroups, spares taking the dead ranks' places).
// Backend-neutral: the world of an epoch comes from a factory (make_gloo_world with the
// epoch's prefix). The driver (resilient_driver.hpp) runs it around a program's steps.
// See docs/resilience.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/process_groups.hpp"
#include "commgrid/rank_map.hpp"
#include "commgrid/resilience_keys.hpp"
#include "commgrid/store.hpp"

namespace commgrid {

/// How a job goes on when a dead rank finds no spare: with fewer data-parallel replicas
/// (replace_or_shrink: the spares fill what they can, the replicas still short of a rank
/// are dropped, their survivors become spares). docs/resilience.md, "Shrink".
struct ShrinkOptions {
  /// Epoch 0's layout: world_size is the map's world; compat seed (plan_shrink's).
  ParallelConfig config;
  /// When given, every smaller dp must divide it (the global batch stays the same, so each
  /// replica takes more micro-batches).
  std::optional<std::int64_t> global_batch;
};

/// How a process takes part in recovery.
struct RecoveryOptions {
  /// The job's timeout: bounds every wait of the agreement (re-armed per epoch).
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  /// The decision window, in timeouts: how long a deciding process waits for the others to
  /// register before it declares those missing dead (and how long each later candidate
  /// waits for a decision). Above 1: a live process learns of a failure within one timeout
  /// (every operation it may be blocked in, a collective or the next epoch's world
  /// creation, is bounded by it), so it is never declared dead for being blocked.
  double decision_window = 1.5;
  /// Every key of recovery lives under it (resilience_keys.hpp).
  std::string prefix = std::string(kResiliencePrefix);
  /// This process's incarnation (0, then 1, 2, ... for each restart by commgrid launch).
  int incarnation = 0;
  /// Opt-in: shrink the world when no spare is left. Without it a dead rank without a spare
  /// ends the job (NoSpareError on every process). Every process must give the same.
  std::optional<ShrinkOptions> shrink;
};

/// What one epoch's decision said.
struct EpochDecision {
  std::int64_t epoch = 0;                ///< the epoch it starts
  std::vector<std::int64_t> dead;        ///< processes declared dead (and fenced)
  std::vector<std::int64_t> revived;     ///< restarted processes back as spares
  std::int64_t decider = -1;             ///< the process whose write won
  std::vector<std::int64_t> process_of;  ///< the process of each logical rank of the epoch
  std::string text;                      ///< as stored (format_decision)
  /// With kept connections: the pairs of processes made anew for this epoch.
  std::vector<std::pair<std::int64_t, std::int64_t>> renew;
  /// The fingerprint every process of the epoch declared (Recovery::declare), when all
  /// declared the same: build() then skips ProcessGroups' exchange of it.
  std::optional<std::uint64_t> fingerprint;
  /// The notes (Recovery::set_note) of the processes the decision counts on, by process;
  /// a process without one is absent.
  std::map<std::int64_t, std::string> notes;
  /// Set when the epoch shrank the world: its layout (shrink->config, world_size W'), each
  /// old logical rank's new rank (shrink->new_rank) and each new rank's old one
  /// (shrink->old_ranks()), the old ranks being the previous epoch's.
  std::optional<ShrinkPlan> shrink;
};

/// The world and groups of one epoch on one process (empty on a spare). Replaced as a
/// whole by the next epoch; never changed under the code holding it.
struct EpochGroups {
  std::int64_t epoch = 0;
  std::shared_ptr<Communicator> world;
  std::shared_ptr<ProcessGroups> groups;
};

/// Creates the world of an epoch: `prefix` is the epoch's store prefix, `rank` this
/// process's logical rank, `size` the world size. E.g. make_gloo_world({.store = store,
/// .rank = rank, .size = size, .timeout = t, .prefix = prefix, .token = token}).
using WorldFactory =
    std::function<std::unique_ptr<Communicator>(const std::string& prefix, Rank rank, Rank size)>;

/// Connections kept across epochs (make_gloo_connections): each epoch's world is made over
/// them, and only the pairs that held an unfinished operation when an epoch ended are made
/// anew. docs/resilience.md, "Kept connections".
struct KeptConnections {
  /// Ends the current epoch on this process; returns the processes whose pairs with it must
  /// be made anew (GlooConnections::end_epoch).
  std::function<std::vector<std::int64_t>()> end_epoch;
  /// The world of `epoch`: rank r is process process_of[r]; the pairs with `renew` first
  /// made anew (GlooConnections::world).
  std::function<std::unique_ptr<Communicator>(const std::string& prefix, std::int64_t epoch,
                                              const std::vector<std::int64_t>& process_of,
                                              const std::vector<std::int64_t>& renew)>
      world;
};

/// One process's view of the job's epochs. Not thread-safe: one thread per process uses it.
class Recovery {
 public:
  /// `map` is epoch 0's (RankMap(world, {spares})), `process` this process (0 ... W+S-1).
  /// The store must be the job's (every process of every incarnation shares it). A
  /// restarted process (options.incarnation > 0) first finds the job's current epoch.
  Recovery(std::shared_ptr<Store> store, RankMap map, std::int64_t process,
           RecoveryOptions options = {});
  ~Recovery();
  Recovery(const Recovery&) = delete;
  Recovery& operator=(const Recovery&) = delete;

  /// The current epoch: map().epoch(), the job's one epoch counter (0, then one more per
  /// decision adopted).
  [[nodiscard]] std::int64_t epoch() const noexcept { return map_.epoch(); }
  [[nodiscard]] const RankMap& map() const noexcept { return map_; }
  [[nodiscard]] std::int64_t process() const noexcept { return process_; }
  [[nodiscard]] const RecoveryOptions& options() const noexcept { return options_; }
  /// The job's store.
  [[nodiscard]] const std::shared_ptr<Store>& store() const noexcept { return store_; }
  /// The current epoch's layout with RecoveryOptions::shrink (epoch 0's, then each shrink's:
  /// world_size is map().world_size()); nullopt without it.
  [[nodiscard]] const std::optional<ParallelConfig>& config() const noexcept { return config_; }
  /// This process's logical rank in the current epoch; nullopt on a spare.
  [[nodiscard]] std::optional<Rank> logical_rank() const { return map_.logical_rank(process_); }
  /// From now on, each epoch's world is made over `kept` (build's factory is not used for
  /// it), and agree() ends the epoch on them first. Every process of the job (spares
  /// included) must do the same before epoch 0's build.
  void keep_connections(KeptConnections kept);
  /// The layout and options this process builds its epochs with (build's config and init,
  /// before any shrink): their fingerprint (ProcessGroups::fingerprint) travels with each
  /// registration, and a decision whose every process declared the same one says so; its
  /// epoch's build() then skips ProcessGroups' exchange of it over the world (one collective
  /// fewer in a recovery). A build with another config or options than declared, under such
  /// a decision, is a ConfigMismatchError. Optional: without it every epoch exchanges.
  void declare(const ParallelConfig& config, const InitOptions& init);
  /// A note (digits, ',' and '-' only; InvalidValueError otherwise) that this process's
  /// next registrations carry; the decision gathers the notes of the processes it counts on
  /// (EpochDecision::notes), so every process of the next epoch reads them all without a
  /// collective (the driver's resync rows). Empty: none.
  void set_note(std::string note);
  /// The decisions adopted so far, oldest first.
  [[nodiscard]] const std::vector<EpochDecision>& history() const noexcept { return history_; }
  /// The identity this process gives the store (StoreOptions::process), e.g. "process/3/0"
  /// (process_identity).
  [[nodiscard]] static std::string identity(std::int64_t process, int incarnation);
  /// The store prefix of the current epoch's world (and groups).
  [[nodiscard]] std::string world_prefix() const;

  /// Marks the current epoch failed (the first reason is kept); idempotent, never blocks.
  void mark_failed(const std::string& reason);
  /// Whether the current epoch is marked failed: one store read (the per-step check). (It
  /// also tells this process that the job has not moved on since it last ran: see agree().)
  [[nodiscard]] bool failed();
  /// The reason the current epoch was marked failed; empty when it was not.
  [[nodiscard]] std::string failure_reason();
  /// Marks the job finished (every active process is done): spares then stop waiting.
  void mark_done();
  /// Whether mark_done() was called by any process.
  [[nodiscard]] bool done();
  /// A spare's wait: true when the current epoch failed, false when the job is done;
  /// the wait is re-armed every timeout, so a spare waits as long as the job runs. Throws
  /// RecoveryError with the job's reason when the job ended (job_ended()).
  bool wait_for_failure();
  /// Ends the job: posts `reason` as the job's end (job_ended_key, the first reason is kept)
  /// and marks the current epoch failed with it, so that every process, blocked or not,
  /// learns of it. Returns whether this process's reason was the one kept.
  bool end_job(const std::string& reason);
  /// Why the job ended (end_job, or a decision after which it cannot go on); nullopt while
  /// it goes on. One store read.
  [[nodiscard]] std::optional<std::string> job_ended();

  /// Agrees with every live process on the next epoch and adopts it: registers, then the
  /// lowest registered process (or, when it does not decide within the window, the next)
  /// writes the decision with set_if_absent; every process reads the one that won. Returns
  /// it. Spares take the dead ranks; with RecoveryOptions::shrink, when they do not suffice,
  /// the world shrinks (replace_or_shrink: every process computes the same change from the
  /// same decision). Throws FencedError when this process is declared dead in it,
  /// NoSpareError ("recovery: cannot go on without a spare: ...", naming the logical ranks)
  /// when a dead rank finds no spare and no valid smaller layout exists (or shrink is off),
  /// RecoveryError with the job's reason when the job ended (job_ended()), BackendError when
  /// the decision's shrink differs from this process's (different ShrinkOptions),
  /// TimeoutError when no decision comes within the timeout. The job's end is posted
  /// (end_job) by the first process to find it.
  ///
  /// A process that did not run for longer than the timeout (stopped, SIGSTOP; a thread
  /// watches for such gaps) and finds, when it runs again, that the job went on without it
  /// (its epoch failed) is dead to the job, by the failure model: it posts its own death,
  /// fences its identity and throws FencedError, however soon it could have registered.
  const EpochDecision& agree();

  /// Creates the current epoch's world and groups (nothing on a spare). Once the world has
  /// shrunk, the groups follow config() (the current epoch's layout), not `config`. A
  /// failure (a peer that died during recovery) marks the epoch failed and is rethrown.
  EpochGroups build(const WorldFactory& factory, const ParallelConfig& config,
                    const InitOptions& init = {});
  /// agree() and build() until a world is built (a failure during recovery starts the next
  /// epoch from the last decision): the new epoch's groups, empty on a spare.
  EpochGroups recover(const WorldFactory& factory, const ParallelConfig& config,
                      const InitOptions& init = {});

 private:
  void adopt(const std::string& text);
  /// Forgets a stall that ended before `observed`, when this process saw the epoch healthy.
  void saw_healthy(std::chrono::steady_clock::time_point observed);
  /// Throws RecoveryError when the job ended.
  void check_ended();
  /// What agree() reads of the registrations it waited for: the candidates to decide (the
  /// others are appended to `dead`) and the pairs they asked to make anew, once each. The
  /// registrations are read in order only until candidate `round` is known: a process that
  /// is not that candidate stops there (`complete` false: the lists hold what was read),
  /// the one that is reads them all; so a round costs the deciding process W reads and every
  /// other process about one, not W each.
  struct Registered {
    std::vector<std::int64_t> candidates;
    std::set<std::pair<std::int64_t, std::int64_t>> renew;
    bool complete = true;
    /// The fingerprint every candidate registered with; nullopt when one has none or two
    /// differ.
    std::optional<std::uint64_t> fingerprint;
    std::map<std::int64_t, std::string> notes;  ///< the candidates' (set_note)
  };
  /// Whether at least `round + 1` processes numbered below this one registered for epoch
  /// `next` (with the incarnation the map knows) and are not posted dead: candidate `round`
  /// is then one of them, and this process need only wait for the decision, without
  /// waiting for every registration (which costs the decider alone W reads). Waits, until
  /// `until`, for the lowest such processes in turn: one key per request, slices from 5 to
  /// 200 ms, a posted death skipping the process. False when it cannot tell by `until`,
  /// or a decision or the job's end came first (the full reading, within the same window,
  /// decides then).
  bool decided_below(std::int64_t next, std::size_t round,
                     const std::vector<std::int64_t>& expected,
                     std::chrono::steady_clock::time_point until);
  Registered registered(const std::vector<std::int64_t>& waiting,
                        const std::vector<std::string>& keys, const std::set<std::string>& missing,
                        const std::vector<std::int64_t>& own_renew, std::vector<std::int64_t>& dead,
                        std::size_t round);
  std::string decide(const std::vector<std::int64_t>& dead,
                     const std::vector<std::int64_t>& revived,
                     const std::set<std::pair<std::int64_t, std::int64_t>>& renew,
                     std::optional<std::uint64_t> fingerprint,
                     std::map<std::int64_t, std::string> notes);
  [[nodiscard]] EpochChange change(const RankMap& map, const std::vector<std::int64_t>& dead) const;
  /// Which of `processes` (but this one) the store knows dead: one store request for all.
  [[nodiscard]] std::set<std::int64_t> deaths_known(const std::vector<std::int64_t>& processes);

  std::shared_ptr<Store> store_;
  RankMap map_;
  std::int64_t process_;
  RecoveryOptions options_;
  std::vector<int> incarnation_;  ///< per process, as the decisions said
  std::vector<EpochDecision> history_;
  std::optional<ParallelConfig> config_;  ///< with options_.shrink: the current epoch's
  bool shrunk_ = false;                   ///< whether some epoch shrank the world
  std::optional<KeptConnections> kept_;
  std::optional<std::uint64_t> declared_;  ///< declare()'s fingerprint
  std::string note_;                       ///< set_note()'s
  struct StallWatch;                       ///< the thread that notices this process stopped
  std::unique_ptr<StallWatch> stall_;
};

/// What `commgrid launch --spares S` tells each of its processes (COMMGRID_PROCESS,
/// COMMGRID_NUM_PROCESSES, COMMGRID_SPARES, COMMGRID_WORLD_SIZE, COMMGRID_INCARNATION,
/// COMMGRID_STORE, COMMGRID_JOB_ID, COMMGRID_TOKEN, COMMGRID_TIMEOUT).
struct SpareLaunch {
  std::int64_t process = 0;        ///< this process, 0 ... num_processes-1
  std::int64_t num_processes = 1;  ///< W + S
  std::int64_t spares = 0;         ///< S
  int incarnation = 0;             ///< restarts of this process so far
  std::string store, job_id, token;
  std::optional<std::chrono::milliseconds> timeout;
  [[nodiscard]] std::int64_t world_size() const noexcept { return num_processes - spares; }
};
/// Reads them; nullopt when COMMGRID_PROCESS is unset (the job has no spares). Throws
/// ConfigError naming a missing or malformed variable.
[[nodiscard]] std::optional<SpareLaunch> read_spare_launch();
/// Opens the job's store as this process (its fencing identity, never serving: launch
/// serves it) and the Recovery of this process over epoch 0's RankMap(W, {S}); S may be 0
/// (a job that only shrinks, with options.shrink).
[[nodiscard]] std::unique_ptr<Recovery> make_recovery(const SpareLaunch& launch,
                                                      RecoveryOptions options = {});

}  // namespace commgrid
