#include "resilient.hpp"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <iostream>
#include <limits>
#include <memory>
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

}  // namespace

StateSource parse_state_source(const std::string& text) {
  if (text == "auto") return StateSource::automatic;
  if (text == "replica") return StateSource::replica;
  if (text == "buddy") return StateSource::buddy;
  throw commgrid::InvalidValueError("state_from", "state_from: expected auto, replica or buddy, got \"" + text + "\"");
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
        "state_from", "--state-from replica: " + why + " leaves a rank without a full "
                      "data-parallel replica (use --state-from buddy or auto: docs/resilience.md)");
  const std::int64_t w = layout.world_size;
  if (resolve_state_source(config, layout, resilience) == StateSource::buddy &&
      (resilience.buddy_shift <= 0 || resilience.buddy_shift % w == 0))
    throw commgrid::IncompatibleError(
        "spares", "--spares: buddy copies need another rank to hold each rank's state, and world "
                  "size " + std::to_string(w) + " with buddy shift " + std::to_string(resilience.buddy_shift) +
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
  const bool buddy = resolve_state_source(config, layout, resilience) == StateSource::buddy;
  std::unique_ptr<commgrid::Recovery> rec = commgrid::make_recovery(launch);
  const std::string token = launch.token;
  auto factory = [&](const std::string& prefix, int rank, int size) {
    commgrid::GlooOptions o;
    o.timeout = rec->options().timeout;
    o.prefix = prefix;
    o.token = commgrid::effective_token(*rec->store(), token);
    return commgrid::make_gloo_world(rec->store(), rank, size, o);
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
  bool fresh = true;  // no state of its own (a spare until it takes a rank)

  auto fault_kill = [&](int at) {
    for (const auto& kill : resilience.kills)
      if (kill.process == launch.process && kill.step == at && launch.incarnation == 0) ::raise(SIGKILL);
  };
  auto start_epoch = [&] {
    collections = std::make_unique<Collections>(make_collections(*g.groups));
    trainer = std::make_unique<Trainer>(collections->model, collections->grads, config);
  };
  auto buddy_of = [&](std::int64_t r) { return (r + resilience.buddy_shift) % layout.world_size; };
  auto buddy_source = [&](std::int64_t r) {
    const std::int64_t w = layout.world_size;
    return ((r - resilience.buddy_shift) % w + w) % w;
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
      const commgrid::P2POp sizes[] = {commgrid::P2POp::send(std::span<std::int64_t>(&mine, 1), to, kSizeTag),
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
  // After a regroup: back to the latest step whose snapshot every survivor holds (with
  // buddy copies: and whose copies too), and every rank without state (a spare that took
  // a rank) gets that step's state of its logical rank: from its data-parallel group's
  // lowest survivor (replicas), or from its buddy (the rank that received its copies).
  auto resync = [&] {
    Communicator& world = *g.world;
    std::int64_t latest = kNone;
    if (!fresh) {
      latest = snapshots.back().step;
      if (buddy && !copies.empty()) latest = std::min<std::int64_t>(latest, copies.back().step);
    }
    const std::int64_t s = min_over(world, latest);
    if (s == kNone) throw BackendError("recovery: no survivor holds a snapshot");
    const Snapshot* mine = fresh ? nullptr : find(snapshots, s);
    if (!fresh && mine == nullptr)
      throw commgrid::InternalError("recovery: this rank kept no snapshot of step " + std::to_string(s));
    std::vector<double> state = fresh ? trainer->state() : mine->state;
    const std::size_t state_size = state.size();
    std::vector<double> past(3 * static_cast<std::size_t>(s));  // the results of steps 1..s
    if (!fresh)
      for (std::size_t k = 0; k < static_cast<std::size_t>(s); ++k) {
        const StepResult& r = mine->results[k];
        past[3 * k] = r.loss;
        past[3 * k + 1] = r.grad_norm;
        past[3 * k + 2] = r.aux_loss;
      }
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
          throw StateLostError("the state of logical rank " + std::to_string(d) + " is lost: " +
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
      const auto root = static_cast<int>(std::find_if(all.begin(), all.end(), [](std::int64_t h) { return h != -1; }) - all.begin());
      if (s > 0) world.broadcast(std::span<double>(past), root)->wait();
      // A rank's copies of a later step than s are of a step not taken again yet.
      while (!copies.empty() && copies.back().step > s) copies.pop_back();
    }
    trainer->set_state(state);
    results.clear();
    for (std::size_t k = 0; k < static_cast<std::size_t>(s); ++k)
      results.push_back({static_cast<int>(k) + 1, past[3 * k], past[3 * k + 1], past[3 * k + 2]});
    step = static_cast<int>(s);
    snapshots.clear();
    snapshots.push_back({step, std::move(state), results});
    shipped = -1;  // ship again at step s: a spare's buddy, and a dead rank's, hold no copy
    source_size = -1;
    fresh = false;
  };
  // Recovery's cost, by part, on stderr (docs/benchmarks.md reads it).
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::to_string(std::chrono::duration<double>(b - a).count()).substr(0, 6);
  };
  // Recovery::recover, timed by part: agree, then build the epoch's world and groups, the
  // model, and move the state; all of it again from the next decision when a process dies
  // on the way (every failure ends at least one process, so the attempts are bounded).
  auto recover = [&] {
    for (std::int64_t attempt = 1;; ++attempt) {
      const auto t0 = Clock::now();
      trainer.reset();
      collections.reset();
      g = commgrid::EpochGroups{};  // closes this epoch's connections: blocked peers fail now
      rec->agree();
      const auto agreed = Clock::now();
      try {
        g = rec->build(factory, layout);  // marks the epoch failed when it fails
        const auto t1 = Clock::now();
        if (!g.world) return;  // still a spare
        start_epoch();
        const auto t2 = Clock::now();
        fault_kill(ResilienceConfig::kDuringRecovery);
        resync();
        std::cerr << ("train_gpt: process " + std::to_string(launch.process) + " is logical rank " +
                      std::to_string(*rec->logical_rank()) + " of epoch " + std::to_string(rec->epoch()) +
                      ", back at step " + std::to_string(step) + ": agreement " + seconds(t0, agreed) +
                      " s, groups " + seconds(agreed, t1) + " s, model " + seconds(t1, t2) +
                      " s, state " + seconds(t2, Clock::now()) + " s\n")
                  << std::flush;
        return;
      } catch (const commgrid::FencedError&) {
        throw;
      } catch (const StateLostError&) {
        throw;  // every rank reached the same verdict: nothing to retry
      } catch (const BackendError& e) {
        if (attempt >= rec->map().num_processes()) throw;
        rec->mark_failed(e.what());
      }
    }
  };

  g = rec->build(factory, layout);
  if (g.world) {
    start_epoch();
    fresh = false;
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
          // The per-snapshot check: one store read every K steps.
          if (rec->failed()) throw BackendError("epoch " + std::to_string(rec->epoch()) + " failed: " + rec->failure_reason());
          keep_two(snapshots, {step, trainer->state(), results});
        }
        if (buddy && shipped != step) ship();
      }
      results.push_back(trainer->step(step));
      ++step;
    } catch (const commgrid::FencedError&) {
      throw;
    } catch (const BackendError& e) {
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
