#include "resilient.hpp"

#include <signal.h>

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

void check_resilient_config(const TrainConfig& config, const commgrid::ParallelConfig& layout) {
  auto why = [&]() -> std::string {
    if (layout.dp() < 2) return "dp " + std::to_string(layout.dp()) + " (no data-parallel replica)";
    if (config.optimizer.dist_opt) return "--dist-opt (the optimizer's state is sharded over dp)";
    if (config.moe && layout.ep > 1) return "--moe with ep " + std::to_string(layout.ep) + " (experts are sharded over dp)";
    return "";
  }();
  if (!why.empty())
    throw commgrid::IncompatibleError(
        "spares", "--spares: this example recovers a rank's state from a data-parallel "
                  "replica, and " + why + " leaves a rank without one (buddy copies are not "
                  "implemented: docs/resilience.md)");
}

std::optional<std::vector<StepResult>> run_resilient(const commgrid::SpareLaunch& launch,
                                                     const commgrid::ParallelConfig& layout,
                                                     const TrainConfig& config,
                                                     const ResilienceConfig& resilience) {
  check_resilient_config(config, layout);
#if !COMMGRID_HAS_GLOO
  (void)launch;
  (void)resilience;
  throw commgrid::ConfigError("spares", "--spares: this build has no Gloo backend");
#else
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
  std::vector<StepResult> results;
  int step = 0;
  bool fresh = true;  // no state of its own (a spare until it takes a rank)

  auto start_epoch = [&] {
    collections = std::make_unique<Collections>(make_collections(*g.groups));
    trainer = std::make_unique<Trainer>(collections->model, collections->grads, config);
  };
  // After a regroup: back to the latest step whose snapshot every survivor holds; each
  // data-parallel group sends its members the state of that step from a survivor (the
  // spare has none; the survivors' are equal: replicas).
  auto resync = [&] {
    const std::int64_t s = min_over(*g.world, fresh ? kNone : snapshots.back().step);
    if (s == kNone) throw BackendError("recovery: no survivor holds a snapshot");
    Communicator& dp = g.groups->group(commgrid::GroupKind::dp);
    const Snapshot* mine = nullptr;
    for (const Snapshot& snap : snapshots)
      if (snap.step == s) mine = &snap;
    if (!fresh && mine == nullptr)
      throw commgrid::InternalError("recovery: this rank kept no snapshot of step " + std::to_string(s));
    const std::int64_t source = min_over(dp, fresh ? kNone : dp.rank());
    if (source == kNone)
      throw BackendError("the state of logical rank " + std::to_string(*rec->logical_rank()) +
                         " is lost: every replica in its data-parallel group died");
    std::vector<double> buffer = fresh ? trainer->state() : mine->state;
    const std::size_t state_size = buffer.size();
    for (int k = 0; k < s; ++k) {
      const StepResult r = fresh ? StepResult{} : mine->results[static_cast<std::size_t>(k)];
      buffer.insert(buffer.end(), {r.loss, r.grad_norm, r.aux_loss});
    }
    dp.broadcast(std::span<double>(buffer), static_cast<int>(source))->wait();
    trainer->set_state(std::span<const double>(buffer).first(state_size));
    results.clear();
    for (int k = 0; k < s; ++k) {
      const double* r = buffer.data() + state_size + 3 * static_cast<std::size_t>(k);
      results.push_back({k + 1, r[0], r[1], r[2]});
    }
    step = static_cast<int>(s);
    snapshots.clear();
    snapshots.push_back({step, std::vector<double>(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(state_size)), results});
    fresh = false;
  };
  // Recovery's cost, by part, on stderr (docs/benchmarks.md reads it).
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::to_string(std::chrono::duration<double>(b - a).count()).substr(0, 6);
  };
  auto recover = [&] {
    const auto t0 = Clock::now();
    trainer.reset();
    collections.reset();
    g = commgrid::EpochGroups{};  // closes this epoch's connections: blocked peers fail now
    // Recovery::recover, timed by part: agree, then build the epoch's world and groups
    // (again from the last decision when a process dies during the build).
    Clock::time_point agreed;
    for (std::int64_t attempt = 0;; ++attempt) {
      rec->agree();
      agreed = Clock::now();
      try {
        g = rec->build(factory, layout);
        break;
      } catch (const commgrid::FencedError&) {
        throw;
      } catch (const BackendError&) {
        if (attempt + 1 >= rec->map().num_processes()) throw;
      }
    }
    const auto t1 = Clock::now();
    if (g.world) {
      start_epoch();
      const auto t2 = Clock::now();
      resync();
      std::cerr << ("train_gpt: process " + std::to_string(launch.process) + " is logical rank " +
                    std::to_string(*rec->logical_rank()) + " of epoch " + std::to_string(rec->epoch()) +
                    ", back at step " + std::to_string(step) + ": agreement " + seconds(t0, agreed) +
                    " s, groups " + seconds(agreed, t1) + " s, model " + seconds(t1, t2) +
                    " s, state " + seconds(t2, Clock::now()) + " s\n")
                << std::flush;
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
    for (const auto& kill : resilience.kills)
      if (kill.process == launch.process && kill.step == step && launch.incarnation == 0)
        ::raise(SIGKILL);
    try {
      if (step % resilience.snapshot_every == 0 &&
          (snapshots.empty() || snapshots.back().step != step)) {
        // The per-snapshot check: one store read every K steps.
        if (rec->failed()) throw BackendError("epoch " + std::to_string(rec->epoch()) + " failed: " + rec->failure_reason());
        snapshots.push_back({step, trainer->state(), results});
        if (snapshots.size() > 2) snapshots.pop_front();
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
