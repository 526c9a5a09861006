// `commgrid verify`: create the groups on real ranks (under mpirun) and prove each one.
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "cli_errors.hpp"
#include "command.hpp"
#include "commgrid/backends.hpp"
#include "commgrid/error.hpp"
#include "commgrid/layout.hpp"
#include "layout_flags.hpp"
#include "verify/verify_run.hpp"
#include "world_runner.hpp"
#if COMMGRID_HAS_GLOO
#include "verify/verify_job.hpp"
#endif
#if COMMGRID_HAS_NCCL
#include "nccl_world.hpp"
#endif

namespace commgrid::cli {
namespace {

/// Default timeout of verify's communication: long enough for a slow launch of many ranks,
/// short enough that a missing rank is reported while someone is still watching.
constexpr std::chrono::seconds kVerifyTimeout{120};

struct VerifyFlags {
  LayoutFlags layout;
  std::string strategy, kinds, timeout, fault_rank, backend, local, job;
  bool share_identical_groups = false;
};

int run_verify_command(const VerifyFlags& f) {
  // Everything that does not need the world size is checked before MPI starts.
  VerifyOptions opts;
  if (!f.strategy.empty()) opts.strategy = parse_strategy(f.strategy);
  opts.share_identical_groups = f.share_identical_groups;
  if (opts.share_identical_groups && opts.strategy != CreationStrategy::member)
    throw InvalidValueError("share_identical_groups",
                            "share_identical_groups: --share-identical-groups needs the member "
                            "strategy (--strategy " +
                                std::string(strategy_name(opts.strategy)) + ")");
  if (!f.kinds.empty()) {
    opts.kinds = parse_kinds(f.kinds);
    std::sort(opts.kinds.begin(), opts.kinds.end());
  }
  const std::chrono::milliseconds timeout =
      f.timeout.empty()
          ? std::chrono::milliseconds(kVerifyTimeout)
          : std::chrono::seconds(parse_integer("timeout", f.timeout, 1, 7 * 24 * 3600));
  if (!f.fault_rank.empty())
    opts.fault_rank = static_cast<int>(parse_integer("fault_rank", f.fault_rank, 0, INT32_MAX));
  if (!f.job.empty()) {
    // A multi-module job (docs/megatron-head.md): Gloo rank-threads, no layout flags.
    for (const auto& [field, opt] : f.layout.options)
      if (opt->count() > 0)
        throw ConfigError("job", "job: --" + field +
                                     " does not apply with --job (the job file gives the layout)");
    if (!f.backend.empty() && f.backend != "gloo")
      throw ConfigError(
          "job", "job: verify --job runs Gloo rank-threads; use --backend gloo (or --local N)");
#if COMMGRID_HAS_GLOO
    std::optional<int> local;
    if (!f.local.empty()) local = static_cast<int>(parse_integer("local", f.local, 1, 1024));
    return run_verify_job(f.job, local, timeout);
#else
    throw ConfigError("job",
                      "job: verify --job runs Gloo rank-threads, and this build of "
                      "commgrid has no Gloo backend");
#endif
  }
  RunnerOptions runner;
  runner.backend = f.backend;
  runner.local = f.local;
  runner.timeout = timeout;
#if COMMGRID_HAS_NCCL
  runner.device_world = nccl_device_world(timeout);
#endif
  // Bad input is found in prepare, on every rank alike (they all got the same flags) and
  // before any communication, so every rank exits 2 and none waits for another.
  ParallelConfig config;
  WorldJob job;
  job.prepare = [&](const WorldPlan& plan) {
    config = checked_verify_config(f.layout, opts, plan.size);
  };
  job.run = [&](Communicator& world, const WorldPlan&) {
    const VerifyReport report = run_verify(world, config, opts);
    if (world.rank() == 0) return print_verify_report(report);
    return report.passed() ? 0 : 1;
  };
  return run_world(runner, job);
}

}  // namespace

Command add_verify_command(CLI::App& root) {
  auto flags = std::make_shared<VerifyFlags>();
  CLI::App* app = root.add_subcommand(
      "verify",
      "create the groups on real ranks and prove each one on the wire (--local N, or "
      "under mpirun or commgrid launch: the world size comes from the launcher)");
  add_layout_flags(*app, flags->layout, /*with_world_size=*/true);
  app->add_option("--strategy", flags->strategy,
                  std::string("how groups are created: split, member or per-group (default ") +
                      std::string(strategy_name(kDefaultStrategy)) + ")");
  app->add_flag("--share-identical-groups", flags->share_identical_groups,
                "kinds whose groups have the same members share one communicator (member "
                "strategy; shown as alias, with no creation call)");
  app->add_option("--kinds", flags->kinds, "only these kinds, e.g. tp,dp,pp (default: all)");
  app->add_option("--timeout", flags->timeout,
                  "seconds any rank waits for the others in one call (default 120)")
      ->type_name("SECONDS");
  app->add_option("--backend", flags->backend,
                  "mpi (under mpirun), gloo (--local N, or under commgrid launch) or nccl "
                  "(GPUs, one per rank: --local N, commgrid launch or mpirun); default: "
                  "gloo with --local or under commgrid launch or torchrun, else mpi");
  app->add_option("--local", flags->local,
                  "run N ranks as threads of this process (Gloo, no launcher needed)")
      ->type_name("INT");
  app->add_option("--job", flags->job,
                  "verify a multi-module job file on Gloo rank-threads (see docs/megatron-head.md)")
      ->type_name("FILE");
  // Hidden (empty group): makes one rank misreport itself, to test verify's failure path.
  app->add_option("--fault-rank", flags->fault_rank)->group("");
  app->footer(
      "Example: mpirun -np 8 commgrid verify --tp 2 --pp 2 --cp 2\n"
      "         commgrid verify --backend gloo --local 8 --tp 2 --pp 2 --ep 2\n"
      "         commgrid verify --backend nccl --local 8 --tp 2 --pp 2 (8 GPUs)\n"
      "Exit codes: 0 every group verified, 1 a check or the communication failed, "
      "2 bad input or ranks given different flags.");
  return {app, [flags] { return run_verify_command(*flags); }};
}

}  // namespace commgrid::cli
