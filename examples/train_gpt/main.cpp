// train_gpt: a small float64 GPT trained through commgrid's two collections, on any dense
// layout, over Gloo (rank-threads with --local N, or under `commgrid launch`) or MPI (under
// mpirun). main alone creates the world and the ProcessGroups; the model, the schedule and
// the optimizer receive only the collections.
#include <CLI/CLI.hpp>
#include <cmath>
#include <commgrid/commgrid.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "cli_errors.hpp"
#include "layout_flags.hpp"
#include "resilient.hpp"
#include "setup.hpp"
#include "trainer.hpp"
#include "world_runner.hpp"

namespace {

using commgrid::cli::parse_integer;
using train_gpt::GroupFault;
using train_gpt::StepResult;
using train_gpt::TrainConfig;

/// How long any rank waits for the others in one call unless --timeout says otherwise.
constexpr int kDefaultTimeoutSeconds = 120;

struct Flags {
  commgrid::cli::LayoutFlags layout;
  std::string backend, local, timeout;
  std::string steps = "10", global_batch = "8", micro_batches = "1", seed = "1234";
  std::string lr = "0.01", clip_grad = "1.0";
  std::string vocab = "64", hidden = "32", heads = "4", seq = "32", layers = "4";
  std::string format = "table", fault;
  bool sequence_parallel = false, dist_opt = false;
  bool moe = false, no_shrink = false, keep_connections = false;
  std::string dispatcher = "alltoall";
  std::string experts = "4", topk = "2", moe_every = "1", aux_loss_coeff = "0.01";
  std::string spares, snapshot_every = "1", state_from = "auto", fault_kill;  // docs/resilience.md
  std::string fault_state, snapshot_memory_limit = "0";
  std::string fault_pace_ms = "0";  // test-only: see --fault-pace-ms
};

double parse_double(const std::string& param, const std::string& text, double min) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
    throw commgrid::InvalidValueError(param, param + ": expected a number, got \"" + text + "\"");
  if (v < min)
    throw commgrid::InvalidValueError(
        param, param + " must be >= " + std::to_string(min) + ", got " + text);
  return v;
}

int to_int(const char* param, const std::string& text, int min) {
  return static_cast<int>(parse_integer(param, text, min, 1 << 20));
}

// Everything that does not depend on the world size, checked before any rank starts.
TrainConfig train_config(const Flags& f, std::optional<int> vpp) {
  TrainConfig c;
  c.model.vocab = to_int("vocab", f.vocab, 1);
  c.model.hidden = to_int("hidden", f.hidden, 1);
  c.model.heads = to_int("heads", f.heads, 1);
  c.model.seq = to_int("seq", f.seq, 1);
  c.model.layers = to_int("layers", f.layers, 1);
  c.model.seed = static_cast<std::uint64_t>(parse_integer("seed", f.seed, 0));
  c.steps = to_int("steps", f.steps, 1);
  c.global_batch = to_int("global_batch", f.global_batch, 1);
  c.micro_batches = to_int("micro_batches", f.micro_batches, 1);
  c.vpp = vpp.value_or(1);
  c.sequence_parallel = f.sequence_parallel;
  c.optimizer.lr = parse_double("lr", f.lr, 0.0);
  c.optimizer.clip_grad = parse_double("clip_grad", f.clip_grad, 0.0);
  c.optimizer.dist_opt = f.dist_opt;
  if (f.fault == "skip-embd-sum") c.fault_skip_embd_sum = true;
  c.moe = f.moe;
  c.experts = to_int("experts", f.experts, 1);
  c.topk = to_int("topk", f.topk, 1);
  c.moe_every = to_int("moe_every", f.moe_every, 1);
  c.aux_loss_coeff = parse_double("aux_loss_coeff", f.aux_loss_coeff, 0.0);
  if (f.fault == "skip-tp-cp-sum") c.fault_skip_tp_cp_sum = true;
  if (f.dispatcher != "alltoall" && f.dispatcher != "allgather")
    throw commgrid::InvalidValueError(
        "dispatcher", "dispatcher: expected alltoall or allgather, got \"" + f.dispatcher + "\"");
  c.allgather_dispatcher = f.dispatcher == "allgather";
  return c;
}

GroupFault group_fault(const std::string& fault) {
  if (fault.empty() || fault == "skip-embd-sum" || fault == "skip-tp-cp-sum")
    return GroupFault::none;
  if (fault == "swap-tp-dp-cp") return GroupFault::swap_tp_dp_cp;
  if (fault == "dp-as-expt-dp") return GroupFault::dp_as_expt_dp;
  throw commgrid::InvalidValueError(
      "fault",
      "fault: expected swap-tp-dp-cp, skip-embd-sum, dp-as-expt-dp or skip-tp-cp-sum, got \"" +
          fault + "\"");
}

// One epoch of a resilient run: its layout and the process of each logical rank.
std::string epoch_layout_text(const commgrid::ParallelConfig& l) {
  return "world " + std::to_string(l.world_size) + ": tp " + std::to_string(l.tp) + ", pp " +
         std::to_string(l.pp) + ", cp " + std::to_string(l.cp) + ", dp " + std::to_string(l.dp());
}

void print(const std::string& format, const commgrid::ParallelConfig& layout, const TrainConfig& c,
           const std::vector<StepResult>& steps,
           const std::vector<commgrid::EpochRecord>& epochs = {}) {
  if (format == "json") {
    nlohmann::ordered_json j;
    auto& cfg = j["config"];
    cfg["world_size"] = layout.world_size;
    cfg["tp"] = layout.tp;
    cfg["pp"] = layout.pp;
    cfg["cp"] = layout.cp;
    cfg["dp"] = layout.dp();
    cfg["hcp"] = layout.hcp;
    cfg["vpp"] = c.vpp;
    cfg["order"] = layout.order;
    cfg["dist_opt"] = c.optimizer.dist_opt;
    cfg["dist_opt_instances"] = layout.dist_opt_instances;
    cfg["sequence_parallel"] = c.sequence_parallel;
    cfg["vocab"] = c.model.vocab;
    cfg["hidden"] = c.model.hidden;
    cfg["heads"] = c.model.heads;
    cfg["seq"] = c.model.seq;
    cfg["layers"] = c.model.layers;
    cfg["steps"] = c.steps;
    cfg["global_batch"] = c.global_batch;
    cfg["micro_batches"] = c.micro_batches;
    cfg["seed"] = c.model.seed;
    cfg["lr"] = c.optimizer.lr;
    cfg["clip_grad"] = c.optimizer.clip_grad;
    cfg["moe"] = c.moe;
    if (c.moe) {
      cfg["ep"] = layout.ep;
      cfg["experts"] = c.experts;
      cfg["topk"] = c.topk;
      cfg["moe_every"] = c.moe_every;
      cfg["aux_loss_coeff"] = c.aux_loss_coeff;
      cfg["dispatcher"] = c.allgather_dispatcher ? "allgather" : "alltoall";
    }
    if (!epochs.empty()) {
      // Every epoch of a resilient run: its layout, the process holding each logical rank,
      // the processes its decision declared dead, and the step training went on from.
      j["epochs"] = nlohmann::ordered_json::array();
      for (const commgrid::EpochRecord& e : epochs)
        j["epochs"].push_back({{"epoch", e.epoch},
                               {"world_size", e.layout.world_size},
                               {"tp", e.layout.tp},
                               {"pp", e.layout.pp},
                               {"cp", e.layout.cp},
                               {"dp", e.layout.dp()},
                               {"ep", e.layout.ep},
                               {"members", e.process_of},
                               {"dead", e.dead},
                               {"shrink", e.shrink},
                               {"resumed_at", e.resumed_at}});
    }
    j["steps"] = nlohmann::ordered_json::array();
    for (const StepResult& s : steps)
      j["steps"].push_back({{"step", s.step},
                            {"loss", s.loss},
                            {"grad_norm", s.grad_norm},
                            {"aux_loss", s.aux_loss}});
    std::cout << j.dump(2) << "\n" << std::flush;
    return;
  }
  std::ostringstream out;
  out << "world " << layout.world_size << ": tp " << layout.tp << ", pp " << layout.pp;
  if (c.vpp > 1) out << " (vpp " << c.vpp << ")";
  out << ", cp " << layout.cp << ", dp " << layout.dp() << ", order " << layout.order;
  if (c.sequence_parallel) out << ", sequence parallel";
  if (c.optimizer.dist_opt) out << ", dist-opt x" << layout.dist_opt_instances;
  out << "\nmodel: vocab " << c.model.vocab << ", hidden " << c.model.hidden << ", heads "
      << c.model.heads << ", seq " << c.model.seq << ", layers " << c.model.layers
      << "; global batch " << c.global_batch << " in " << c.micro_batches << " micro-batch"
      << (c.micro_batches == 1 ? "" : "es") << " per dp rank\n";
  if (epochs.size() > 1) {
    out << "epochs:\n";
    for (const commgrid::EpochRecord& e : epochs) {
      out << "  " << e.epoch << ": " << epoch_layout_text(e.layout) << "; processes";
      for (std::size_t r = 0; r < e.process_of.size(); ++r)
        out << (r ? "," : " ") << e.process_of[r];
      if (!e.dead.empty()) {
        out << "; dead";
        for (std::size_t i = 0; i < e.dead.size(); ++i) out << (i ? "," : " ") << e.dead[i];
      }
      if (e.shrink) out << " (shrunk)";
      if (e.resumed_at >= 0) out << "; from step " << e.resumed_at;
      out << "\n";
    }
  }
  out << "step              loss         grad_norm\n";
  for (const StepResult& s : steps)
    out << std::setw(4) << s.step << std::fixed << std::setprecision(12) << std::setw(18) << s.loss
        << std::setw(18) << s.grad_norm << "\n";
  std::cout << out.str() << std::flush;
}

// --fault-kill P:S[,P:S...]: process (or MPI rank) P kills itself with SIGKILL at the start
// of step S; P:recovery (with --spares) in its first recovery, once the new epoch's groups
// exist, before the state moves; P:start (with --spares) before the job's first groups
// exist. The way to see a recovery in one command
// (docs/resilience.md).
std::vector<train_gpt::ResilienceConfig::Kill> parse_kills(std::string kills) {
  std::vector<train_gpt::ResilienceConfig::Kill> out;
  while (!kills.empty()) {
    const std::string item = kills.substr(0, kills.find(','));
    kills.erase(0, std::min(kills.size(), item.size() + 1));
    const auto colon = item.find(':');
    if (colon == std::string::npos)
      throw commgrid::InvalidValueError(
          "fault_kill",
          "fault_kill: expected PROCESS:STEP, PROCESS:recovery or PROCESS:start, got \"" + item +
              "\"");
    const std::string when = item.substr(colon + 1);
    out.push_back({parse_integer("fault_kill", item.substr(0, colon), 0, 1 << 20),
                   when == "recovery" ? train_gpt::ResilienceConfig::kDuringRecovery
                   : when == "start"  ? train_gpt::ResilienceConfig::kAtStart
                                      : to_int("fault_kill", when, 0)});
  }
  return out;
}

// --fault-state P:save:S|P:load|P:reshard (test-only): process P's state provider throws in
// that call (save: the snapshot of step S; load, reshard: the first one).
std::vector<train_gpt::ResilienceConfig::StateFault> parse_state_faults(std::string faults) {
  std::vector<train_gpt::ResilienceConfig::StateFault> out;
  while (!faults.empty()) {
    const std::string item = faults.substr(0, faults.find(','));
    faults.erase(0, std::min(faults.size(), item.size() + 1));
    const auto colon = item.find(':');
    const std::string rest = colon == std::string::npos ? "" : item.substr(colon + 1);
    const std::string call = rest.substr(0, rest.find(':'));
    const bool save = call == "save" && rest.find(':') != std::string::npos;
    if (colon == std::string::npos || (!save && call != "load" && call != "reshard") ||
        (call != "save" && rest != call))
      throw commgrid::InvalidValueError(
          "fault_state",
          "fault_state: expected PROCESS:save:STEP, PROCESS:load or PROCESS:reshard, got \"" +
              item + "\"");
    out.push_back({parse_integer("fault_state", item.substr(0, colon), 0, 1 << 20), call,
                   save ? to_int("fault_state", rest.substr(rest.find(':') + 1), 0) : -1});
  }
  return out;
}

// --spares S under commgrid launch --spares S: the resilient loop (resilient.hpp).
template <class Checked>
int run_with_spares(const Flags& f, const Checked& checked) {
  const auto launch = commgrid::read_spare_launch();
  const std::int64_t spares = parse_integer("spares", f.spares, 0, 1 << 20);
  if (!launch)
    throw commgrid::IncompatibleError("spares", "--spares " + f.spares +
                                                    " runs under commgrid launch --spares " +
                                                    f.spares + " (COMMGRID_PROCESS is not set)");
  if (launch->spares != spares)
    throw commgrid::IncompatibleError("spares", "--spares " + f.spares +
                                                    " but commgrid launch started " +
                                                    std::to_string(launch->spares) + " spares");
  train_gpt::ResilienceConfig resilience;
  resilience.snapshot_every = to_int("snapshot_every", f.snapshot_every, 1);
  resilience.state_from = commgrid::parse_state_source(f.state_from);
  resilience.shrink = !f.no_shrink;
  resilience.kills = parse_kills(f.fault_kill);
  resilience.state_faults = parse_state_faults(f.fault_state);
  resilience.keep_connections = f.keep_connections;
  resilience.pace_ms = to_int("fault_pace_ms", f.fault_pace_ms, 0);
  resilience.snapshot_memory_limit = static_cast<std::size_t>(
      parse_integer("snapshot_memory_limit", f.snapshot_memory_limit, 0, std::int64_t{1} << 50));
  const auto [layout, config] = checked(launch->world_size());
  // The buddy on the next node: commgrid launch gives the processes per node and the nodes
  // in torchrun's variables.
  auto env_integer = [](const char* name) -> std::int64_t {
    const char* v = std::getenv(name);
    return v == nullptr ? 0 : parse_integer(name, v, 0, std::int64_t{1} << 40);
  };
  resilience.buddy_shift = commgrid::buddy_shift_for(
      layout.world_size, env_integer("LOCAL_WORLD_SIZE"), env_integer("GROUP_WORLD_SIZE"));
  train_gpt::check_resilient_config(config, layout, resilience);
  // The layout and run that finished (after a shrink, the smaller one) and every epoch.
  const auto result = train_gpt::run_resilient(*launch, layout, config, resilience);
  if (result) print(f.format, result->layout, result->config, result->steps, result->epochs);
  return 0;
}

int run(const Flags& f) {
  if (f.format != "table" && f.format != "json")
    throw commgrid::InvalidValueError("format",
                                      "format: expected table or json, got \"" + f.format + "\"");
  const GroupFault fault = group_fault(f.fault);
  commgrid::cli::RunnerOptions runner;
  runner.backend = f.backend;
  runner.local = f.local;
  runner.accepted = {"gloo", "mpi"};
  runner.timeout = std::chrono::seconds(
      f.timeout.empty() ? kDefaultTimeoutSeconds
                        : parse_integer("timeout", f.timeout, 1, 7 * 24 * 3600));

  // The layout and the run are checked before the world exists, identically on every
  // rank, so that bad input is exit 2 everywhere and no rank waits for another.
  auto checked = [&](std::int64_t world_size) {
    const commgrid::ParallelConfig layout = commgrid::cli::to_config(f.layout, world_size);
    TrainConfig c = train_config(
        f, layout.vpp ? std::optional<int>(static_cast<int>(*layout.vpp)) : std::nullopt);
    train_gpt::check_train_config(c, layout);
    return std::pair{layout, c};
  };
  if (!f.spares.empty()) return run_with_spares(f, checked);
  if (f.keep_connections)
    throw commgrid::IncompatibleError("keep_connections",
                                      "--keep-connections keeps connections across recoveries: "
                                      "it needs --spares");
  commgrid::ParallelConfig layout;
  TrainConfig config;
  commgrid::cli::WorldJob job;
  job.prepare = [&](const commgrid::WorldPlan& plan) {
    layout = commgrid::cli::to_config(f.layout, plan.size);
    config = train_config(
        f, layout.vpp ? std::optional<int>(static_cast<int>(*layout.vpp)) : std::nullopt);
    train_gpt::check_train_config(config, layout);
  };
  job.run = [&](commgrid::Communicator& world, const commgrid::WorldPlan&) {
    // Without --spares a dead rank ends the job: under mpirun (Open MPI 4.1 has no ULFM)
    // with mpirun's error naming it (docs/resilience.md; tested with --fault-kill).
    for (const auto& kill : parse_kills(f.fault_kill))
      if (kill.process == world.rank())
        config.on_step = [step = kill.step](int s) {
          if (s == step) ::raise(SIGKILL);
        };
    const std::vector<StepResult> results = train_gpt::run_rank(world, layout, config, fault);
    if (world.rank() == 0) print(f.format, layout, config, results);
    return 0;
  };
  return commgrid::cli::run_world(runner, job);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "commgrid-train-gpt: a small float64 GPT trained through commgrid's collections; "
      "every layout gives the losses of one rank"};
  Flags f;
  commgrid::cli::add_layout_flags(app, f.layout, /*with_world_size=*/true);
  app.add_option("--backend", f.backend,
                 "gloo (--local N, or under commgrid launch) or mpi (under mpirun); default: "
                 "gloo with --local or under commgrid launch or torchrun, else mpi");
  app.add_option("--local", f.local, "run N ranks as threads of this process (Gloo)");
  app.add_option("--timeout", f.timeout, "seconds any rank waits for the others in one call (120)");
  app.add_option("--steps,--train-iters", f.steps, "training steps (10)");
  app.add_option("--global-batch,--global-batch-size", f.global_batch, "samples per step (8)");
  app.add_option("--micro-batches", f.micro_batches,
                 "micro-batches per data-parallel rank and step (1)");
  app.add_option("--seed", f.seed, "seed of the parameters and the data (1234)");
  app.add_option("--lr", f.lr, "Adam learning rate (0.01)");
  app.add_option("--clip-grad", f.clip_grad, "clip the global gradient norm to this; 0: off (1.0)");
  app.add_option("--vocab,--vocab-size", f.vocab, "vocabulary size (64)");
  app.add_option("--hidden,--hidden-size", f.hidden, "hidden size (32)");
  app.add_option("--heads,--num-attention-heads", f.heads, "attention heads (4)");
  app.add_option("--seq,--seq-length", f.seq, "sequence length (32)");
  app.add_option("--layers,--num-layers", f.layers, "transformer layers (4)");
  app.add_flag("--sequence-parallel", f.sequence_parallel,
               "split activations along the sequence in the tp regions");
  app.add_flag("--dist-opt,--use-distributed-optimizer", f.dist_opt,
               "shard Adam's state over intra_dp_cp (the distributed optimizer)");
  app.add_flag("--moe", f.moe, "mixture of experts: the MLPs become MoE layers over ep");
  app.add_option("--experts,--num-experts", f.experts,
                 "experts per MoE layer, a multiple of ep (4)");
  app.add_option("--topk,--moe-router-topk", f.topk, "experts per token (2)");
  app.add_option("--moe-every,--moe-layer-freq", f.moe_every, "every k-th layer is MoE (1)");
  app.add_option("--dispatcher,--moe-token-dispatcher-type", f.dispatcher,
                 "alltoall (over ep) or allgather (over tp_ep) (alltoall)");
  app.add_option("--aux-loss-coeff,--moe-aux-loss-coeff", f.aux_loss_coeff,
                 "weight of the load-balancing loss (0.01)");
  app.add_option("--format", f.format, "table or json (table)");
  app.add_option("--spares", f.spares,
                 "run under commgrid launch --spares S: survive the loss of processes (state "
                 "from data-parallel replicas or buddy copies; docs/resilience.md)");
  app.add_option("--state-from", f.state_from,
                 "with --spares: where a replaced rank's state comes from: replica (its "
                 "data-parallel group), buddy (a copy shipped to another rank at every "
                 "snapshot), or auto: replica where every rank has a full one (auto)");
  app.add_flag("--keep-connections", f.keep_connections,
               "with --spares: connect every two processes once and keep those connections "
               "across recoveries; a recovery makes anew only the ones that held an "
               "unfinished operation (docs/resilience.md)");
  app.add_flag("--no-shrink", f.no_shrink,
               "with --spares: when a failure finds no spare, end the job instead of going on "
               "with fewer data-parallel replicas");
  app.add_option("--snapshot-every", f.snapshot_every,
                 "with --spares: keep an in-memory snapshot of the state every K steps (1)");
  app.add_option("--snapshot-memory-limit", f.snapshot_memory_limit,
                 "with --spares: the most bytes the kept snapshots and buddy copies may take; "
                 "0: the memory available at the start (0)");
  app.add_option("--fault-kill", f.fault_kill,
                 "P:S[,P:S...]: process P kills itself (SIGKILL) at the start of step S, or "
                 "P:recovery in its first recovery, or P:start before the job's first groups "
                 "exist: with --spares, the way to see a recovery (docs/resilience.md)");
  // Hidden (empty group): test-only faults that a comparison with one rank must catch.
  app.add_option("--fault", f.fault)->group("");
  app.add_option("--fault-state", f.fault_state)->group("");
  // Test-only: every step of the resilient loop lasts at least MS milliseconds, so that a
  // short job is still training when a harness injects a fault from outside (tests/hosts).
  app.add_option("--fault-pace-ms", f.fault_pace_ms)->group("");
  app.footer(
      "Examples: commgrid-train-gpt --local 8 --tp 2 --pp 2 --sequence-parallel\n"
      "          mpirun -np 4 commgrid-train-gpt --cp 2 --dist-opt --format json\n"
      "          commgrid launch -n 4 -- commgrid-train-gpt --pp 2 --vpp 2 --micro-batches 2\n"
      "          commgrid launch -n 5 --spares 1 -- commgrid-train-gpt --tp 2 --spares 1 "
      "--fault-kill 1:3\n"
      "Exit codes: 0 trained, 1 a communication failure, 2 bad input.");
  try {
    app.parse(argc, argv);
    return run(f);
  } catch (const CLI::Success& e) { return app.exit(e); } catch (const commgrid::RecoveryError&) {
    // The job cannot go on after a failure: every process raises the same error, and
    // commgrid launch, which started them, says it once (Recovery::end_job).
    return 1;
  } catch (const CLI::ParseError& e) {
    commgrid::cli::print_error(
        commgrid::cli::explain_parse_error(app, e, argc, argv, "commgrid-train-gpt"));
    return 2;
  } catch (...) {  // ConfigError: 2, any other failure: 1 (the commgrid command's mapping)
    return commgrid::cli::report_error(std::current_exception());
  }
}
