#include "resilient.hpp"

#include <signal.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "setup.hpp"

namespace train_gpt {
namespace {

using commgrid::StateBytes;

// The state of one rank as bytes: [n][n state values][m][m results x (loss, grad norm, aux
// loss)], all float64.
StateBytes pack(const std::vector<double>& state, const std::vector<StepResult>& results) {
  std::vector<double> all;
  all.reserve(2 + state.size() + 3 * results.size());
  all.push_back(static_cast<double>(state.size()));
  all.insert(all.end(), state.begin(), state.end());
  all.push_back(static_cast<double>(results.size()));
  for (const StepResult& r : results) all.insert(all.end(), {r.loss, r.grad_norm, r.aux_loss});
  StateBytes out(all.size() * sizeof(double));
  std::memcpy(out.data(), all.data(), out.size());
  return out;
}

struct Unpacked {
  std::vector<double> state;
  std::vector<StepResult> results;
};

Unpacked unpack(std::span<const std::byte> bytes) {
  if (bytes.size() % sizeof(double) != 0)
    throw commgrid::InternalError("train state: " + std::to_string(bytes.size()) +
                                  " bytes are not float64 values");
  std::vector<double> all(bytes.size() / sizeof(double));
  if (!bytes.empty()) std::memcpy(all.data(), bytes.data(), bytes.size());
  auto bad = [&] {
    return commgrid::InternalError("train state: " + std::to_string(all.size()) +
                                   " values do not hold a state and its results");
  };
  if (all.empty()) throw bad();
  const auto n = static_cast<std::size_t>(all[0]);
  if (1 + n + 1 > all.size()) throw bad();
  Unpacked out;
  out.state.assign(all.begin() + 1, all.begin() + 1 + static_cast<std::ptrdiff_t>(n));
  const auto m = static_cast<std::size_t>(all[1 + n]);
  if (2 + n + 3 * m != all.size()) throw bad();
  for (std::size_t k = 0; k < m; ++k) {
    const double* r = all.data() + 2 + n + 3 * k;
    out.results.push_back({static_cast<int>(k) + 1, r[0], r[1], r[2]});
  }
  return out;
}

// The model's state for the driver: the current epoch's Trainer and the results so far.
class TrainerState final : public commgrid::StateProvider {
 public:
  TrainerState(const TrainConfig& config, std::int64_t process,
               const std::vector<ResilienceConfig::StateFault>& faults)
      : config_(config) {
    for (const auto& f : faults)
      if (f.process == process) faults_.push_back(f);
  }

  std::unique_ptr<Trainer> trainer;
  std::vector<StepResult> results;
  int step = 0;  // the step the driver is at (for the save fault)

  StateBytes save() override {
    fault("save", step);
    return pack(trainer->state(), results);
  }
  void load(std::span<const std::byte> bytes) override {
    fault("load", -1);
    Unpacked u = unpack(bytes);
    trainer->set_state(u.state);
    results = std::move(u.results);
  }
  std::vector<commgrid::ReshardNeed> reshard_needs(const commgrid::ReshardContext& ctx) override {
    // Dense: the old rank's optimizer shard group with the distributed optimizer, else the
    // old rank or any data-parallel replica of it. Experts (MoE): an old rank with this
    // rank's new expert coordinates (its expert shard group with the distributed optimizer).
    std::vector<commgrid::ReshardNeed> needs;
    needs.push_back({config_.optimizer.dist_opt
                         ? commgrid::shard_group_alternatives(ctx.old_layout, ctx.old_rank,
                                                              commgrid::GroupKind::intra_dp_cp)
                         : commgrid::replica_alternatives(ctx.old_layout, ctx.old_rank)});
    if (config_.moe)
      needs.push_back({commgrid::expert_alternatives(
          ctx.old_layout, ctx.new_layout, ctx.rank,
          config_.optimizer.dist_opt ? std::optional(commgrid::GroupKind::intra_expt_dp)
                                     : std::nullopt)});
    return needs;
  }
  void reshard(const commgrid::ReshardContext& /*ctx*/,
               std::span<const commgrid::ReshardPart> parts) override {
    fault("reshard", -1);
    std::vector<Unpacked> dense, expert;
    for (auto s : parts[0].states) dense.push_back(unpack(s));
    if (config_.moe)
      for (auto s : parts[1].states) expert.push_back(unpack(s));
    std::vector<std::span<const double>> d, e;
    for (const auto& u : dense) d.emplace_back(u.state);
    for (const auto& u : expert) e.emplace_back(u.state);
    trainer->set_state_resharded(d, e);
    results = dense.front().results;
  }

 private:
  void fault(const std::string& call, int at) {
    for (auto it = faults_.begin(); it != faults_.end(); ++it)
      if (it->call == call && (call != "save" || it->step == at)) {
        faults_.erase(it);
        throw std::runtime_error("test fault: " + call + " refused (--fault-state)");
      }
  }
  TrainConfig config_;
  std::vector<ResilienceConfig::StateFault> faults_;
};

std::string seconds(std::chrono::duration<double> d) {
  return std::to_string(d.count()).substr(0, 6);
}

// Monotonic seconds (CLOCK_MONOTONIC: the same clock in every process of this machine), for
// bench/resilience.sh to measure from a kill to the first step after it.
std::string now_text() {
  return std::to_string(
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

}  // namespace

std::string why_no_replica(const TrainConfig& config, const commgrid::ParallelConfig& layout) {
  if (layout.dp() < 2) return "dp " + std::to_string(layout.dp()) + " (no data-parallel replica)";
  if (config.optimizer.dist_opt) return "--dist-opt (the optimizer's state is sharded over dp)";
  if (config.moe && layout.ep > 1)
    return "--moe with ep " + std::to_string(layout.ep) + " (experts are sharded over dp)";
  return "";
}

void check_resilient_config(const TrainConfig& config, const commgrid::ParallelConfig& layout,
                            const ResilienceConfig& resilience) {
  const std::string why = why_no_replica(config, layout);
  if (resilience.state_from == commgrid::StateSource::replica && !why.empty())
    throw commgrid::IncompatibleError(
        "state_from",
        "--state-from replica: " + why +
            " leaves a rank without a full "
            "data-parallel replica (use --state-from buddy or auto: docs/resilience.md)");
  const std::int64_t w = layout.world_size;
  const bool buddy = resilience.state_from == commgrid::StateSource::buddy || !why.empty();
  if (buddy && (resilience.buddy_shift <= 0 || resilience.buddy_shift % w == 0))
    throw commgrid::IncompatibleError(
        "spares",
        "--spares: buddy copies need another rank to hold each rank's state, and world "
        "size " +
            std::to_string(w) + " with buddy shift " + std::to_string(resilience.buddy_shift) +
            " gives every rank itself" + (why.empty() ? "" : " (" + why + ")"));
}

std::optional<ResilientResult> run_resilient(const commgrid::SpareLaunch& launch,
                                             const commgrid::ParallelConfig& layout,
                                             const TrainConfig& config,
                                             const ResilienceConfig& resilience) {
  check_resilient_config(config, layout, resilience);
#if !COMMGRID_HAS_GLOO
  (void)launch;
  throw commgrid::ConfigError("spares", "--spares: this build has no Gloo backend");
#else
  commgrid::ResilientOptions options;
  options.layout = layout;
  options.snapshot_every = resilience.snapshot_every;
  options.state_from = resilience.state_from;
  options.replicated_over_dp = !config.optimizer.dist_opt && !(config.moe && layout.ep > 1);
  options.buddy_shift = resilience.buddy_shift;
  options.shrink = resilience.shrink;
  // dp' must divide dp x micro-batches: the micro-batch size is kept.
  options.global_batch = layout.dp() * config.micro_batches;
  options.snapshot_memory_limit = resilience.snapshot_memory_limit;
  // One thread drives every group: kinds with the same members share one communicator, so
  // each recovery makes fewer connections.
  options.init.share_identical_groups = true;
  // The driver's Recovery is made below; the factory reads it through this pointer.
  commgrid::Recovery* rec = nullptr;
  const std::string token = launch.token;
  options.factory = [&](const std::string& prefix, int rank, int size) {
    commgrid::GlooOptions o;
    o.timeout = rec->options().timeout;
    o.prefix = prefix;
    o.token = commgrid::effective_token(*rec->store(), token);
    o.store = rec->store();
    o.rank = rank;
    o.size = size;
    return commgrid::make_gloo_world(o);
  };
  auto driver = commgrid::make_resilient_driver(launch, options);
  rec = &driver->recovery();
  if (resilience.keep_connections) {
    // Every process of the job, spares included, connects to every other once.
    if (launch.incarnation > 0)
      throw commgrid::IncompatibleError(
          "keep_connections", "--keep-connections: process " + std::to_string(launch.process) +
                                  " is a restart (incarnation " +
                                  std::to_string(launch.incarnation) +
                                  "); kept connections are made once, at the job's start");
    commgrid::GlooOptions o;
    o.timeout = rec->options().timeout;
    o.prefix = rec->options().prefix + "/kept";
    o.token = commgrid::effective_token(*rec->store(), token);
    o.store = rec->store();
    o.rank = launch.process;
    o.size = launch.num_processes;
    std::shared_ptr<commgrid::GlooConnections> kept = commgrid::make_gloo_connections(o);
    rec->keep_connections({[kept] { return kept->end_epoch(); },
                           [kept](const std::string& prefix, std::int64_t epoch,
                                  const std::vector<std::int64_t>& process_of,
                                  const std::vector<std::int64_t>& renew) {
                             return kept->world(prefix, epoch, process_of, renew);
                           }});
  }

  TrainerState state(config, launch.process, resilience.state_faults);
  std::unique_ptr<Collections> collections;
  TrainConfig epoch_config = config;
  bool recovered_once = false;
  auto fault_kill = [&](int at) {
    for (const auto& kill : resilience.kills)
      if (kill.process == launch.process && kill.step == at && launch.incarnation == 0) {
        std::cerr << ("train_gpt: process " + std::to_string(launch.process) +
                      " kills itself at monotonic " + now_text() + " s\n")
                  << std::flush;
        ::raise(SIGKILL);
      }
  };
  commgrid::ResilientCallbacks callbacks;
  callbacks.start_epoch = [&](const commgrid::EpochContext& ctx) {
    // A shrink makes dp smaller and each replica's micro-batches more (the global batch and
    // the micro-batch size are kept).
    epoch_config.micro_batches =
        static_cast<int>(config.micro_batches * layout.dp() / ctx.layout.dp());
    check_train_config(epoch_config, ctx.layout);
    collections = std::make_unique<Collections>(make_collections(*ctx.groups));
    // The initial state (a new Trainer's, no results): the driver loads the state to go on
    // from, unless that is step 0's.
    state.trainer = std::make_unique<Trainer>(collections->model, collections->grads, epoch_config);
    state.results.clear();
    if (ctx.epoch > 0 && !recovered_once) {
      recovered_once = true;
      fault_kill(ResilienceConfig::kDuringRecovery);
    }
  };
  callbacks.stop_epoch = [&] {
    // The trainer before the collections before the groups.
    state.trainer.reset();
    collections.reset();
  };
  callbacks.begin_step = [&](std::int64_t step) { fault_kill(static_cast<int>(step)); };
  callbacks.step = [&](std::int64_t step) {
    const auto began = std::chrono::steady_clock::now();
    state.results.push_back(state.trainer->step(static_cast<int>(step)));
    state.step = static_cast<int>(step) + 1;
    if (resilience.pace_ms > 0)
      std::this_thread::sleep_until(began + std::chrono::milliseconds(resilience.pace_ms));
  };
  callbacks.recovered = [&](const commgrid::EpochRecord& r) {
    state.step = static_cast<int>(r.resumed_at);
    // Recovery's cost, by part, on stderr (bench/resilience.sh reads it).
    std::cerr << ("train_gpt: process " + std::to_string(launch.process) + " is logical rank " +
                  std::to_string(*rec->logical_rank()) + " of epoch " + std::to_string(r.epoch) +
                  ", back at step " + std::to_string(r.resumed_at) + ": agreement " +
                  seconds(r.agreement) + " s, groups " + seconds(r.groups) + " s, model " +
                  seconds(r.model) + " s, state " + seconds(r.state) + " s, cpu " +
                  std::to_string(r.cpu.count()) + " s, done at monotonic " + now_text() + " s\n")
              << std::flush;
  };
  callbacks.stepped = [&](std::int64_t step, bool first) {
    if (first)
      std::cerr << ("train_gpt: process " + std::to_string(launch.process) + " completed step " +
                    std::to_string(step) + ", its first since the recovery, at monotonic " +
                    now_text() + " s\n")
                << std::flush;
  };
  callbacks.decided = [&](const commgrid::EpochDecision& d) {
    if (d.shrink)
      std::cerr << ("train_gpt: epoch " + std::to_string(d.epoch) + " shrinks the world to " +
                    std::to_string(d.shrink->config.world_size) + " ranks (dp " +
                    std::to_string(d.shrink->config.dp()) + ", " +
                    std::to_string(config.micro_batches * layout.dp() / d.shrink->config.dp()) +
                    " micro-batches per replica)\n")
                << std::flush;
  };
  fault_kill(ResilienceConfig::kAtStart);
  const std::optional<commgrid::Rank> rank = driver->run(config.steps, state, callbacks);
  if (rank != 0) return std::nullopt;
  ResilientResult out;
  out.steps = state.results;
  out.layout = driver->layout();
  out.config = epoch_config;
  out.epochs = driver->epochs();
  return out;
#endif
}

}  // namespace train_gpt
