#include "resilient.hpp"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string>

#include "setup.hpp"

namespace train_gpt {
namespace {

using commgrid::BackendError;
using commgrid::Communicator;
using commgrid::ReduceOp;

constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();

std::int64_t min_over(Communicator& c, std::int64_t v) {
  c.allreduce(std::span<std::int64_t>(&v, 1), ReduceOp::min)->wait();
  return v;
}

// A snapshot: the state at the start of step `step` and the results of the steps before.
struct Snapshot {
  int step = 0;
  std::vector<double> state;
  std::vector<StepResult> results;
};

// The results of steps 1..s as 3 values each (loss, grad norm, aux loss) for a broadcast:
// `snap`'s, or zeros on a rank that has none (it receives them).
std::vector<double> pack_results(const Snapshot* snap, std::int64_t s) {
  std::vector<double> past(3 * static_cast<std::size_t>(s));
  if (snap != nullptr)
    for (std::size_t k = 0; k < static_cast<std::size_t>(s); ++k) {
      const StepResult& r = snap->results[k];
      past[3 * k] = r.loss;
      past[3 * k + 1] = r.grad_norm;
      past[3 * k + 2] = r.aux_loss;
    }
  return past;
}

std::vector<StepResult> unpack_results(std::span<const double> past) {
  std::vector<StepResult> out;
  for (std::size_t k = 0; 3 * k < past.size(); ++k)
    out.push_back({static_cast<int>(k) + 1, past[3 * k], past[3 * k + 1], past[3 * k + 2]});
  return out;
}

}  // namespace

StateSource parse_state_source(const std::string& text) {
  if (text == "auto") return StateSource::automatic;
  if (text == "replica") return StateSource::replica;
  if (text == "buddy") return StateSource::buddy;
  throw commgrid::InvalidValueError(
      "state_from", "state_from: expected auto, replica or buddy, got \"" + text + "\"");
}

std::int64_t buddy_shift_for(std::int64_t world_size, std::int64_t local_world_size,
                             std::int64_t nnodes) {
  if (nnodes > 1 && local_world_size > 0 && world_size > local_world_size &&
      world_size % local_world_size == 0)
    return local_world_size;
  return 1;
}

std::string why_no_replica(const TrainConfig& config, const commgrid::ParallelConfig& layout) {
  if (layout.dp() < 2) return "dp " + std::to_string(layout.dp()) + " (no data-parallel replica)";
  if (config.optimizer.dist_opt) return "--dist-opt (the optimizer's state is sharded over dp)";
  if (config.moe && layout.ep > 1)
    return "--moe with ep " + std::to_string(layout.ep) + " (experts are sharded over dp)";
  return "";
}

StateSource resolve_state_source(const TrainConfig& config, const commgrid::ParallelConfig& layout,
                                 const ResilienceConfig& resilience) {
  if (resilience.state_from != StateSource::automatic) return resilience.state_from;
  return why_no_replica(config, layout).empty() ? StateSource::replica : StateSource::buddy;
}

void check_resilient_config(const TrainConfig& config, const commgrid::ParallelConfig& layout,
                            const ResilienceConfig& resilience) {
  const std::string why = why_no_replica(config, layout);
  if (resilience.state_from == StateSource::replica && !why.empty())
    throw commgrid::IncompatibleError(
        "state_from",
        "--state-from replica: " + why +
            " leaves a rank without a full "
            "data-parallel replica (use --state-from buddy or auto: docs/resilience.md)");
  const std::int64_t w = layout.world_size;
  if (resolve_state_source(config, layout, resilience) == StateSource::buddy &&
      (resilience.buddy_shift <= 0 || resilience.buddy_shift % w == 0))
    throw commgrid::IncompatibleError(
        "spares",
        "--spares: buddy copies need another rank to hold each rank's state, and world "
        "size " +
            std::to_string(w) + " with buddy shift " + std::to_string(resilience.buddy_shift) +
            " gives every rank itself" + (why.empty() ? "" : " (" + why + ")"));
}

std::optional<std::vector<StepResult>> run_resilient(const commgrid::SpareLaunch& launch,
                                                     const commgrid::ParallelConfig& layout,
                                                     const TrainConfig& config,
                                                     const ResilienceConfig& resilience) {
  check_resilient_config(config, layout, resilience);
#if !COMMGRID_HAS_GLOO
  (void)launch;
  throw commgrid::ConfigError("spares", "--spares: this build has no Gloo backend");
#else
  commgrid::RecoveryOptions options;
  // dp' must divide dp x micro-batches: the micro-batch size is kept. (plan_shrink lays out
  // the seed edition only: a HEAD layout ends the job when no spare is left.)
  if (resilience.shrink && layout.compat == commgrid::Compat::seed)
    options.shrink = commgrid::ShrinkOptions{layout, layout.dp() * config.micro_batches};
  std::unique_ptr<commgrid::Recovery> rec = commgrid::make_recovery(launch, options);
  const std::string token = launch.token;
  auto factory = [&](const std::string& prefix, int rank, int size) {
    commgrid::GlooOptions o;
    o.timeout = rec->options().timeout;
    o.prefix = prefix;
    o.token = commgrid::effective_token(*rec->store(), token);
    o.store = rec->store();
    o.rank = rank;
    o.size = size;
    return commgrid::make_gloo_world(o);
  };
  // Declared in the order they are released: the trainer before the collections before
  // the groups (the old epoch's connections close when the groups go).
  commgrid::EpochGroups g;
  std::unique_ptr<Collections> collections;
  std::unique_ptr<Trainer> trainer;
  std::deque<Snapshot> snapshots;  // the last two: every survivor holds the older one
  // Buddy copies: the last two snapshots of logical rank (r - shift) mod W, received at
  // each snapshot (their results are not kept: every rank has the same).
  std::deque<Snapshot> copies;
  int shipped = -1;  // the step whose snapshot this rank last shipped to its buddy
  std::vector<StepResult> results;
  int step = 0;
  // No state of its own: a spare until it takes a rank. A rank of the first epoch holds
  // the initial state (a new Trainer's) before its first snapshot.
  bool fresh = true;
  std::int64_t own_rank = -1;  // the logical rank whose state this rank's snapshots hold
  // The layout and the run of the current epoch: a shrink makes dp smaller and each
  // replica's micro-batches more (the global batch and the micro-batch size are kept).
  // Taken from Recovery after every decision (a restarted process replays the shrinks
  // decided before it came), with where a replaced rank's state comes from: a shrink to
  // dp 1 leaves no replica, so buddy copies start there.
  commgrid::ParallelConfig epoch_layout = layout;
  TrainConfig epoch_config = config;
  bool buddy = false;
  auto follow_layout = [&] {
    epoch_layout = rec->config().value_or(layout);
    epoch_config.micro_batches =
        static_cast<int>(config.micro_batches * layout.dp() / epoch_layout.dp());
    buddy = resolve_state_source(config, epoch_layout, resilience) == StateSource::buddy ||
            !why_no_replica(config, epoch_layout).empty();
  };
  follow_layout();

  auto fault_kill = [&](int at) {
    for (const auto& kill : resilience.kills)
      if (kill.process == launch.process && kill.step == at && launch.incarnation == 0)
        ::raise(SIGKILL);
  };
  auto start_epoch = [&] {
    collections = std::make_unique<Collections>(make_collections(*g.groups));
    trainer = std::make_unique<Trainer>(collections->model, collections->grads, epoch_config);
  };
  // The buddy shift in the current world (a shrunk world may be a multiple of it: then 1).
  auto shift = [&] {
    const std::int64_t w = epoch_layout.world_size;
    return resilience.buddy_shift % w == 0 ? std::int64_t{1} : resilience.buddy_shift;
  };
  auto buddy_of = [&](std::int64_t r) { return (r + shift()) % epoch_layout.world_size; };
  auto buddy_source = [&](std::int64_t r) {
    const std::int64_t w = epoch_layout.world_size;
    return ((r - shift()) % w + w) % w;
  };
  auto find = [](const std::deque<Snapshot>& list, std::int64_t s) -> const Snapshot* {
    for (const Snapshot& snap : list)
      if (snap.step == s) return &snap;
    return nullptr;
  };
  auto keep_two = [](std::deque<Snapshot>& list, Snapshot snap) {
    if (!list.empty() && list.back().step == snap.step) list.pop_back();
    list.push_back(std::move(snap));
    if (list.size() > 2) list.pop_front();
  };
  // Ships this rank's latest snapshot to its buddy and receives its source's: one batch of
  // point-to-point operations on the world (the sizes first, once per epoch: a rank's
  // state has the same size in every epoch, but its source may be a new process).
  std::int64_t source_size = -1;
  auto ship = [&] {
    Communicator& world = *g.world;
    const int to = static_cast<int>(buddy_of(world.rank()));
    const int from = static_cast<int>(buddy_source(world.rank()));
    const Snapshot& own = snapshots.back();
    constexpr int kSizeTag = 7301, kStateTag = 7302;
    if (source_size < 0) {
      auto mine = static_cast<std::int64_t>(own.state.size());
      const commgrid::P2POp sizes[] = {
          commgrid::P2POp::send(std::span<std::int64_t>(&mine, 1), to, kSizeTag),
          commgrid::P2POp::recv(std::span<std::int64_t>(&source_size, 1), from, kSizeTag)};
      world.batch_isend_irecv(sizes)->wait();
    }
    std::vector<double> in(static_cast<std::size_t>(source_size));
    const commgrid::P2POp ops[] = {
        commgrid::P2POp::send(std::span<const double>(own.state), to, kStateTag),
        commgrid::P2POp::recv(std::span<double>(in), from, kStateTag)};
    world.batch_isend_irecv(ops)->wait();
    keep_two(copies, {own.step, std::move(in), {}});
    shipped = own.step;
  };
  // The step this rank can go back to: its latest snapshot's (a rank of the first epoch
  // without one: step 0, the initial state) and, with buddy copies, no later than its latest
  // copy's; kNone without state.
  auto offer_step = [&]() -> std::int64_t {
    if (fresh) return kNone;
    std::int64_t latest = snapshots.empty() ? 0 : snapshots.back().step;
    if (buddy && !copies.empty()) latest = std::min<std::int64_t>(latest, copies.back().step);
    return latest;
  };
  // Training resumes at step s of this epoch with `state` (already loaded) and the results
  // before it: the only snapshot, shipped again to the buddy (a spare's buddy, and a dead
  // rank's, hold no copy).
  auto resume_at = [&](std::int64_t s, std::vector<double> state, std::vector<StepResult> past) {
    step = static_cast<int>(s);
    results = std::move(past);
    snapshots.clear();
    snapshots.push_back({step, std::move(state), results});
    shipped = -1;
    source_size = -1;
    fresh = false;
    own_rank = g.world->rank();
  };
  // After a regroup: back to the latest step whose snapshot every survivor holds (with
  // buddy copies: and whose copies too), and every rank without state (a spare that took
  // a rank) gets that step's state of its logical rank: from its data-parallel group's
  // lowest survivor (replicas), or from its buddy (the rank that received its copies).
  auto resync = [&] {
    Communicator& world = *g.world;
    // A rank of the first epoch that failed before its first snapshot: the initial state
    // is its new Trainer's (the same logical rank).
    if (!fresh && snapshots.empty()) snapshots.push_back({0, trainer->state(), {}});
    const std::int64_t s = min_over(world, offer_step());
    if (s == kNone) throw BackendError("recovery: no survivor holds a snapshot");
    const Snapshot* mine = fresh ? nullptr : find(snapshots, s);
    if (!fresh && mine == nullptr)
      throw commgrid::InternalError("recovery: this rank kept no snapshot of step " +
                                    std::to_string(s));
    std::vector<double> state = fresh ? trainer->state() : mine->state;
    const std::size_t state_size = state.size();
    std::vector<double> past = pack_results(mine, s);
    if (!buddy) {
      // Replicas: each data-parallel group broadcasts the state and the results from its
      // lowest surviving member (the survivors' are equal).
      Communicator& dp = g.groups->group(commgrid::GroupKind::dp);
      const std::int64_t source = min_over(dp, fresh ? kNone : dp.rank());
      // The verdict over the world, so that every rank ends alike.
      const std::int64_t lost = min_over(world, source == kNone ? world.rank() : kNone);
      if (lost != kNone)
        throw StateLostError("the state of logical rank " + std::to_string(lost) +
                             " is lost: every replica in its data-parallel group died");
      state.insert(state.end(), past.begin(), past.end());
      dp.broadcast(std::span<double>(state), static_cast<int>(source))->wait();
      past.assign(state.begin() + static_cast<std::ptrdiff_t>(state_size), state.end());
      state.resize(state_size);
    } else {
      // Buddy copies: who has no state (-1), and who holds its source's copy of step s (1).
      const auto w = static_cast<std::size_t>(world.size());
      std::int64_t has = fresh ? -1 : (find(copies, s) != nullptr ? 1 : 0);
      std::vector<std::int64_t> all(w);
      world.allgather(std::span<const std::int64_t>(&has, 1), std::span<std::int64_t>(all))->wait();
      std::vector<commgrid::P2POp> ops;
      for (std::size_t d = 0; d < w; ++d) {
        if (all[d] != -1 || s == 0) continue;  // step 0's state is the initial one: a new Trainer's
        const auto b = static_cast<std::size_t>(buddy_of(static_cast<std::int64_t>(d)));
        if (all[b] != 1)
          throw StateLostError(
              "the state of logical rank " + std::to_string(d) + " is lost: " +
              (all[b] == -1 ? "it and its buddy, logical rank " + std::to_string(b) + ", died"
                            : "its buddy, logical rank " + std::to_string(b) +
                                  ", holds no copy of step " + std::to_string(s)));
        if (static_cast<int>(b) == world.rank())
          ops.push_back(commgrid::P2POp::send(std::span<const double>(find(copies, s)->state),
                                              static_cast<int>(d), 7303));
        if (static_cast<int>(d) == world.rank())
          ops.push_back(commgrid::P2POp::recv(std::span<double>(state), static_cast<int>(b), 7303));
      }
      if (!ops.empty()) world.batch_isend_irecv(ops)->wait();
      // The results so far, from the lowest rank that has them.
      const auto root = static_cast<int>(
          std::find_if(all.begin(), all.end(), [](std::int64_t h) { return h != -1; }) -
          all.begin());
      if (s > 0) world.broadcast(std::span<double>(past), root)->wait();
      // A rank's copies of a later step than s are of a step not taken again yet.
      while (!copies.empty() && copies.back().step > s) copies.pop_back();
    }
    trainer->set_state(state);
    resume_at(s, std::move(state), unpack_results(past));
  };
  // A shrink (no spare left): every live process, the new world's ranks and the spares
  // (the survivors of dropped replicas among them), meets in a transfer world of the
  // epoch and offers the states it holds of the step every one of them can go back to:
  // its own snapshot and its buddy copy, each with the logical rank it belongs to. Each
  // rank of the shrunk world takes the states of its old rank's optimizer shard group
  // (the old rank alone, or a replica of it, without the distributed optimizer) and, with
  // MoE, those of an old rank with its new expert coordinates (the experts it now holds);
  // once its Trainer exists, it reshards them (Trainer::set_state_resharded). Everything
  // is offered to everyone (an allgather): simple, and sized for this example's models.
  struct Resharded {
    std::int64_t step = 0;
    // The old states a new rank reshards from (empty on a process left without a rank):
    // its dense optimizer shard group's, and (MoE) its expert one's.
    std::vector<std::vector<double>> dense, expert;
    std::vector<StepResult> results;
  };
  auto reshard = [&](const commgrid::ShrinkPlan& plan) -> Resharded {
    const commgrid::RankMap& map = rec->map();
    std::vector<std::int64_t> live;
    for (std::int64_t p = 0; p < map.num_processes(); ++p)
      if (map.role(p) != commgrid::ProcessRole::dead) live.push_back(p);
    const auto me =
        static_cast<int>(std::find(live.begin(), live.end(), launch.process) - live.begin());
    if (me == static_cast<int>(live.size())) return {};  // declared dead by this decision
    auto transfer =
        factory(rec->options().prefix + "/epoch/" + std::to_string(rec->epoch()) + "/reshard", me,
                static_cast<int>(live.size()));
    Resharded out;
    const std::int64_t s = min_over(*transfer, offer_step());
    if (s == kNone) throw BackendError("recovery: no survivor holds a snapshot");
    out.step = s;
    if (s == 0) return out;  // the initial state: every new rank's new Trainer has it
    // What this process offers: [owner, length, values...] per state it holds of step s.
    std::vector<double> offer;
    auto add = [&](std::int64_t owner, const std::vector<double>& state) {
      offer.push_back(static_cast<double>(owner));
      offer.push_back(static_cast<double>(state.size()));
      offer.insert(offer.end(), state.begin(), state.end());
    };
    const Snapshot* mine = fresh ? nullptr : find(snapshots, s);
    if (mine != nullptr) add(own_rank, mine->state);
    if (const Snapshot* copy = (fresh || !buddy) ? nullptr : find(copies, s))
      add(buddy_source(own_rank), copy->state);
    const auto n = static_cast<std::size_t>(transfer->size());
    auto length = static_cast<std::int64_t>(offer.size());
    std::vector<std::int64_t> lengths(n);
    transfer->allgather(std::span<const std::int64_t>(&length, 1), std::span<std::int64_t>(lengths))
        ->wait();
    std::vector<std::size_t> counts(lengths.begin(), lengths.end());
    std::vector<double> all(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
    transfer
        ->allgatherv(offer.data(), offer.size(), all.data(), counts, commgrid::DataType::float64)
        ->wait();
    std::map<std::int64_t, std::vector<double>> held;  // old logical rank -> its state at step s
    for (std::size_t at = 0; at < all.size();) {
      const auto owner = static_cast<std::int64_t>(all[at]);
      const auto len = static_cast<std::size_t>(all[at + 1]);
      held.emplace(owner,
                   std::vector<double>(all.begin() + static_cast<std::ptrdiff_t>(at + 2),
                                       all.begin() + static_cast<std::ptrdiff_t>(at + 2 + len)));
      at += 2 + len;
    }
    // Which old states the new rank needs, and whether every rank of the new world finds
    // them: the verdict is the transfer world's, so that every process ends alike.
    const commgrid::Layout old_layout(epoch_layout);
    const commgrid::Layout new_layout(plan.config);
    const std::optional<commgrid::Rank> rank = rec->logical_rank();
    std::int64_t missing = kNone;
    // The states of `shard_group` (the old optimizer shard group) of one of `candidates`
    // (old ranks whose states are equal outside the optimizer's shards), the first whose
    // every member is held; `shard_group` is empty without the distributed optimizer (the
    // candidate's own state then). Notes the first missing rank otherwise.
    auto gather = [&](const std::vector<commgrid::Rank>& candidates,
                      commgrid::GroupKind shard_group, std::vector<std::vector<double>>& into) {
      for (commgrid::Rank c : candidates) {
        std::vector<commgrid::Rank> need{c};
        if (config.optimizer.dist_opt) {
          need = old_layout.group_of(shard_group, c)->members;
          std::sort(need.begin(), need.end());  // the communicator's rank order
        }
        std::vector<std::vector<double>> found;
        for (commgrid::Rank r : need)
          if (auto it = held.find(r); it != held.end()) found.push_back(it->second);
        if (found.size() == need.size()) {
          into = std::move(found);
          return;
        }
      }
      if (missing == kNone) missing = candidates.front();
    };
    if (rank) {
      const commgrid::Rank old = plan.old_ranks()[static_cast<std::size_t>(*rank)];
      // Dense: the old rank itself or, where its data-parallel replicas hold the same dense
      // state (no distributed optimizer), any of them.
      std::vector<commgrid::Rank> dense{old};
      if (!config.optimizer.dist_opt) {
        const std::optional<commgrid::GroupRef> replicas =
            old_layout.group_of(commgrid::GroupKind::dp, old);
        for (commgrid::Rank r : replicas->members)
          if (r != old) dense.push_back(r);
      }
      gather(dense, commgrid::GroupKind::intra_dp_cp, out.dense);
      if (config.moe) {
        // Experts: an old rank with this rank's new expert coordinates (pp, expert-tp, ep);
        // its expert-data-parallel peers hold the same experts.
        const commgrid::RankCoordinates want = new_layout.coordinates(*rank);
        std::vector<commgrid::Rank> experts;
        for (commgrid::Rank r = 0; r < old_layout.world_size(); ++r) {
          const commgrid::RankCoordinates c = old_layout.coordinates(r);
          if (c.pp == want.pp && c.etp == want.etp && c.ep == want.ep) experts.push_back(r);
        }
        gather(experts, commgrid::GroupKind::intra_expt_dp, out.expert);
      }
    }
    const std::int64_t lost = min_over(*transfer, missing);
    if (lost != kNone)
      throw StateLostError("the state of logical rank " + std::to_string(lost) +
                           " is lost: no live process "
                           "holds it to reshard to the shrunk layout of epoch " +
                           std::to_string(rec->epoch()));
    // The results so far, from the lowest process that has them.
    std::vector<double> past = pack_results(mine, s);
    const std::int64_t root = min_over(*transfer, mine != nullptr ? transfer->rank() : kNone);
    transfer->broadcast(std::span<double>(past), static_cast<int>(root))->wait();
    out.results = unpack_results(past);
    return out;
  };
  // Recovery's cost, by part, on stderr (docs/benchmarks.md reads it).
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::duration d) {
    return std::to_string(std::chrono::duration<double>(d).count()).substr(0, 6);
  };
  // Recovery::recover, timed by part: agree, then build the epoch's world and groups, the
  // model, and move the state; all of it again from the next decision when a process dies
  // on the way (every failure ends at least one process, so the attempts are bounded).
  // A shrink's epoch is not retried: once the ranks are renumbered, the states held are
  // of the old layout's ranks (a failure while resharding ends the job).
  auto recover = [&] {
    for (std::int64_t attempt = 1;; ++attempt) {
      const auto t0 = Clock::now();
      trainer.reset();
      collections.reset();
      g = commgrid::EpochGroups{};  // closes this epoch's connections: blocked peers fail now
      std::optional<Resharded> resharded;
      Clock::time_point agreed;
      try {
        const commgrid::EpochDecision& decision = rec->agree();
        agreed = Clock::now();
        if (decision.shrink) {
          const commgrid::ParallelConfig next = decision.shrink->config;
          resharded = reshard(*decision.shrink);  // (over the old layout: before follow_layout)
          follow_layout();
          check_train_config(epoch_config, epoch_layout);
          std::cerr << ("train_gpt: epoch " + std::to_string(rec->epoch()) +
                        " shrinks the world to " + std::to_string(next.world_size) + " ranks (dp " +
                        std::to_string(next.dp()) + ", " +
                        std::to_string(epoch_config.micro_batches) +
                        " micro-batches per replica)\n")
                    << std::flush;
        } else {
          follow_layout();
        }
      } catch (const commgrid::FencedError&) { throw; } catch (const commgrid::ConfigError& e) {
        // No smaller layout, or none this run fits: the job cannot go on (every process alike).
        throw BackendError(std::string("recovery: cannot go on without a spare: ") + e.what());
      }
      const auto moved = Clock::now();  // after a shrink's transfer (counted as state)
      try {
        g = rec->build(factory, epoch_layout);  // marks the epoch failed when it fails
        const auto t1 = Clock::now();
        if (!g.world) {  // a spare (again, or a survivor of a dropped replica)
          if (resharded) {
            fresh = true;
            snapshots.clear();
            copies.clear();
            results.clear();
          }
          return;
        }
        start_epoch();
        const auto t2 = Clock::now();
        fault_kill(ResilienceConfig::kDuringRecovery);
        if (resharded) {
          const std::vector<std::span<const double>> dense(resharded->dense.begin(),
                                                           resharded->dense.end());
          const std::vector<std::span<const double>> expert(resharded->expert.begin(),
                                                            resharded->expert.end());
          if (resharded->step > 0) trainer->set_state_resharded(dense, expert);
          copies.clear();  // of the old layout's ranks
          resume_at(resharded->step, trainer->state(), std::move(resharded->results));
        } else {
          resync();
        }
        std::cerr << ("train_gpt: process " + std::to_string(launch.process) + " is logical rank " +
                      std::to_string(*rec->logical_rank()) + " of epoch " +
                      std::to_string(rec->epoch()) + ", back at step " + std::to_string(step) +
                      ": agreement " + seconds(agreed - t0) + " s, groups " + seconds(t1 - moved) +
                      " s, model " + seconds(t2 - t1) + " s, state " +
                      seconds((moved - agreed) + (Clock::now() - t2)) + " s\n")
                  << std::flush;
        return;
      } catch (const commgrid::FencedError&) { throw; } catch (const StateLostError&) {
        throw;  // every rank reached the same verdict: nothing to retry
      } catch (const BackendError& e) {
        if (resharded || attempt >= rec->map().num_processes()) throw;
        rec->mark_failed(e.what());
      }
    }
  };

  fresh = !rec->logical_rank().has_value();
  own_rank = rec->logical_rank().value_or(-1);
  try {
    g = rec->build(factory, epoch_layout);
    if (g.world) start_epoch();
  } catch (const commgrid::FencedError&) {
    throw;
  } catch (const BackendError& e) {  // a process died while the job started
    rec->mark_failed(e.what());
    recover();
  }
  while (step < config.steps) {
    if (!g.world) {
      if (!rec->wait_for_failure()) return std::nullopt;  // finished without this spare
      recover();
      continue;
    }
    fault_kill(step);
    try {
      if (step % resilience.snapshot_every == 0) {
        if (snapshots.empty() || snapshots.back().step != step) {
          keep_two(snapshots, {step, trainer->state(), results});
          // The per-snapshot check: one store read every K steps.
          if (rec->failed())
            throw BackendError("epoch " + std::to_string(rec->epoch()) +
                               " failed: " + rec->failure_reason());
        }
        if (buddy && shipped != step) ship();
      }
      results.push_back(trainer->step(step));
      ++step;
    } catch (const commgrid::FencedError&) { throw; } catch (const BackendError& e) {
      rec->mark_failed(e.what());
      recover();
    }
  }
  // Every rank has its results before logical rank 0 lets the spares go.
  g.world->barrier()->wait();
  if (*rec->logical_rank() != 0) return std::nullopt;
  rec->mark_done();
  return results;
#endif
}

}  // namespace train_gpt
