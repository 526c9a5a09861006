// `commgrid verify`: create the groups on real ranks (under mpirun) and prove each one.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <iostream>
#include <memory>

#include "cli_errors.hpp"
#include "command.hpp"
#include "commgrid/backends.hpp"
#include "commgrid/error.hpp"
#include "commgrid/layout.hpp"
#include "layout_flags.hpp"
#include "verify_run.hpp"
#if COMMGRID_HAS_MPI
#include "commgrid/mpi.hpp"
#endif
#if COMMGRID_HAS_GLOO
#include "verify_gloo.hpp"
#include "verify_job.hpp"
#endif
#if COMMGRID_HAS_NCCL
#include "verify_nccl.hpp"
#endif

namespace commgrid::cli {
namespace {

/// Default timeout of verify's communication: long enough for a slow launch of many ranks,
/// short enough that a missing rank is reported while someone is still watching.
constexpr std::chrono::seconds kVerifyTimeout{120};

struct VerifyFlags {
  LayoutFlags layout;
  std::string strategy, kinds, timeout, fault_rank, backend, local, job;
};

int run_verify_command(const VerifyFlags& f) {
  // Everything that does not need the world size is checked before MPI starts.
  VerifyOptions opts;
  if (!f.strategy.empty()) opts.strategy = parse_strategy(f.strategy);
  if (!f.kinds.empty()) {
    opts.kinds = parse_kinds(f.kinds);
    std::sort(opts.kinds.begin(), opts.kinds.end());
  }
  const std::chrono::milliseconds timeout =
      f.timeout.empty() ? std::chrono::milliseconds(kVerifyTimeout)
                        : std::chrono::seconds(parse_integer("timeout", f.timeout, 1, 7 * 24 * 3600));
  if (!f.fault_rank.empty())
    opts.fault_rank = static_cast<int>(parse_integer("fault_rank", f.fault_rank, 0, INT32_MAX));
  // Gloo when asked, or by default with --local or under a store launcher (COMMGRID_RANK
  // from commgrid launch, torchrun's RANK, or a store named by COMMGRID_STORE or
  // MASTER_ADDR); MPI otherwise.
  const bool store_launcher = std::getenv("COMMGRID_RANK") || std::getenv("RANK") ||
                              std::getenv("COMMGRID_STORE") || std::getenv("MASTER_ADDR");
  const std::string backend = !f.backend.empty() ? f.backend
                              : (!f.local.empty() || store_launcher || !f.job.empty()) ? "gloo"
                                                                     : "mpi";
  if (backend != "mpi" && backend != "gloo" && backend != "nccl")
    throw InvalidValueError("backend", "backend: expected mpi, gloo or nccl, got '" + backend + "'");
  if (backend == "nccl") {
#if COMMGRID_HAS_NCCL
    std::optional<int> local;
    if (!f.local.empty()) local = static_cast<int>(parse_integer("local", f.local, 1, 1024));
    return run_verify_nccl(f.layout, opts, timeout, local);
#else
    throw ConfigError("backend", "verify: this build of commgrid has no NCCL backend; install "
                                 "CUDA and NCCL and rebuild with -DCOMMGRID_WITH_NCCL=ON");
#endif
  }
  if (!f.job.empty()) {
    // A multi-module job (docs/megatron-head.md): Gloo rank-threads, no layout flags.
    for (const auto& [field, opt] : f.layout.options)
      if (opt->count() > 0)
        throw ConfigError("job", "job: --" + field + " does not apply with --job (the job file gives the layout)");
    if (backend != "gloo")
      throw ConfigError("job", "job: verify --job runs Gloo rank-threads; use --backend gloo (or --local N)");
#if COMMGRID_HAS_GLOO
    std::optional<int> local;
    if (!f.local.empty()) local = static_cast<int>(parse_integer("local", f.local, 1, 1024));
    return run_verify_job(f.job, local, timeout);
#endif
  }
  if (backend == "mpi" && !f.local.empty())
    throw ConfigError("local", "local: --local runs ranks as threads and needs --backend gloo");
  if (backend == "gloo") {
#if COMMGRID_HAS_GLOO
    std::optional<int> local;
    if (!f.local.empty()) local = static_cast<int>(parse_integer("local", f.local, 1, 1024));
    return run_verify_gloo(f.layout, opts, timeout, local);
#else
    throw ConfigError("backend", "verify: this build of commgrid has no Gloo backend; install "
                                 "libgloo-dev and rebuild with -DCOMMGRID_WITH_GLOO=ON");
#endif
  }
#if COMMGRID_HAS_MPI
  mpi::MpiEnvironment env;
  int rank = 0;
  {
    const std::unique_ptr<mpi::MpiCommunicator> world = make_mpi_world(timeout);
    rank = world->rank();
    ParallelConfig config;
    try {
      // Bad input is found here, on every rank alike (they all got the same flags) and
      // before any communication, so every rank exits 2 and none waits for another.
      config = to_config(f.layout, world->size());
      const Layout layout(config);
      for (GroupKind k : opts.kinds)
        if (!layout.has_kind(k)) (void)layout.num_groups(k);  // throws, saying why it is absent
    } catch (const ConfigError& e) {
      if (rank == 0) print_error(e.what());
      return 2;
    }
    VerifyReport report;
    try {
      report = run_verify(*world, config, opts);
    } catch (const ConfigError& e) {  // a config mismatch: raised on every rank
      if (rank == 0) print_error(e.what());
      return 2;
    } catch (const Error& e) {
      // Possibly seen by this rank alone (a timeout, a backend failure): end the job, or
      // the other ranks would wait for this one until their own timeout.
      print_error("rank " + std::to_string(rank) + ": " + e.what());
      mpi::MpiEnvironment::abort(1);
    }
    if (rank == 0) {
      std::cout << format_verify_report(report) << std::flush;
      for (const KindVerdict& v : report.kinds)
        if (!v.passed) print_error("verify failed: " + v.label + ": " + v.failure);
    }
    return report.passed() ? 0 : 1;
  }
#else
  (void)timeout;
  throw ConfigError("backend",
                    "verify: this build of commgrid has no MPI backend; install an MPI "
                    "(e.g. libopenmpi-dev) and rebuild with -DCOMMGRID_WITH_MPI=ON");
#endif
}

}  // namespace

Command add_verify_command(CLI::App& root) {
  auto flags = std::make_shared<VerifyFlags>();
  CLI::App* app = root.add_subcommand(
      "verify", "create the groups on real ranks and prove each one on the wire (run under "
                "mpirun; the world size comes from the launcher)");
  add_layout_flags(*app, flags->layout, /*with_world_size=*/true);
  app->add_option("--strategy", flags->strategy,
                  std::string("how groups are created: split, member or per-group (default ") +
                      std::string(strategy_name(kDefaultStrategy)) + ")");
  app->add_option("--kinds", flags->kinds, "only these kinds, e.g. tp,dp,pp (default: all)");
  app->add_option("--timeout", flags->timeout,
                  "seconds any rank waits for the others in one call (default 120)")->type_name("SECONDS");
  app->add_option("--backend", flags->backend,
                  "mpi (under mpirun), gloo (--local N, or under commgrid launch) or nccl "
                  "(GPUs, one per rank: --local N, commgrid launch or mpirun); default: "
                  "gloo with --local or COMMGRID_RANK set, else mpi");
  app->add_option("--local", flags->local,
                  "run N ranks as threads of this process (Gloo, no launcher needed)")->type_name("INT");
  app->add_option("--job", flags->job,
                  "verify a multi-module job file on Gloo rank-threads (see docs/megatron-head.md)")
      ->type_name("FILE");
  // Hidden (empty group): makes one rank misreport itself, to test verify's failure path.
  app->add_option("--fault-rank", flags->fault_rank)->group("");
  app->footer("Example: mpirun -np 8 commgrid verify --tp 2 --pp 2 --cp 2\n"
              "         commgrid verify --backend gloo --local 8 --tp 2 --pp 2 --ep 2\n"
              "         commgrid verify --backend nccl --local 8 --tp 2 --pp 2 (8 GPUs)\n"
              "Exit codes: 0 every group verified, 1 a check or the communication failed, "
              "2 bad input or ranks given different flags.");
  return {app, [flags] { return run_verify_command(*flags); }};
}

}  // namespace commgrid::cli
