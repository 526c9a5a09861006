#include "launch/launch_flags.hpp"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "commgrid/error.hpp"
#include "commgrid/launch_env.hpp"
#include "commgrid/rank_map.hpp"
#include "commgrid/store.hpp"
#include "launch/posix.hpp"
#include "layout_flags.hpp"

namespace commgrid::cli {
namespace {

double parse_seconds(const char* param, const std::string& text, bool allow_zero) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(begin, &end);
  if (text.empty() || end != begin + text.size() || errno != 0 || !std::isfinite(v) || v < 0 ||
      (!allow_zero && v == 0) || v > 1e9)
    throw InvalidValueError(param, std::string(param) + " must be a " +
                                       (allow_zero ? "non-negative" : "positive") +
                                       " number of seconds, got '" + text + "'");
  return v;
}

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(std::llround(seconds * 1000.0));
}

OutputMode parse_output(const std::string& text) {
  if (text == "prefixed") return OutputMode::prefixed;
  if (text == "raw") return OutputMode::raw;
  if (text == "rank0") return OutputMode::rank0;
  throw InvalidValueError("--output",
                          "--output: expected prefixed, raw or rank0, got '" + text + "'");
}

// -n, --nnodes, --node-rank, --master-addr, --master-port: where the job's processes are.
void parse_placement(const LaunchFlags& f, LaunchSettings& s) {
  JobSetup& job = s.job;
  const std::int64_t n = parse_integer("-n", f.nproc, 1, kMaxLaunchProcesses);
  s.nproc = static_cast<int>(n);
  job.nnodes = static_cast<int>(parse_integer("--nnodes", f.nnodes, 1, kMaxLaunchProcesses));
  if (n * job.nnodes > kMaxLaunchProcesses)
    throw InvalidValueError("--nnodes", "launch: -n " + std::to_string(n) + " times --nnodes " +
                                            std::to_string(job.nnodes) + " exceeds " +
                                            std::to_string(kMaxLaunchProcesses) + " ranks");
  if (f.standalone && job.nnodes > 1)
    throw IncompatibleError("--standalone",
                            "launch: --standalone is one node; it does not go "
                            "with --nnodes " +
                                std::to_string(job.nnodes));
  if (!f.node_rank.empty())
    job.node_rank = static_cast<int>(parse_integer("--node-rank", f.node_rank, 0, job.nnodes - 1));
  else if (job.nnodes > 1)
    throw ConfigError("--node-rank", "launch: --nnodes " + std::to_string(job.nnodes) +
                                         " needs --node-rank (0 ... " +
                                         std::to_string(job.nnodes - 1) + ")");
  if (!f.master_addr.empty()) job.master_addr = f.master_addr;
  if (!f.master_port.empty()) {
    // torch's store takes the next port: both must be ports.
    job.master_port = static_cast<int>(parse_integer("--master-port", f.master_port, 1, 65534));
    job.torch_port = job.master_port + 1;
  } else if (job.nnodes > 1 && f.store.empty()) {
    throw ConfigError("--master-port", "launch: --nnodes " + std::to_string(job.nnodes) +
                                           " needs --master-port (the TCP store of node 0)");
  }
}

// The job's identity: --rdzv-id, the user's or scheduler's, else (one node) a fresh one.
// Several nodes must share it, so they cannot each make one up.
void parse_identity(const LaunchFlags& f, JobSetup& job) {
  // The user's COMMGRID_JOB_ID and COMMGRID_TOKEN, read and checked by the launch environment;
  // only those: an outer launcher's RANK or MASTER_PORT is launch's to replace, not to check.
  const LaunchEnv env = read_launch_env([](const char* name) -> std::optional<std::string> {
    const std::string_view n(name);
    if (n != "COMMGRID_JOB_ID" && n != "COMMGRID_TOKEN") return std::nullopt;
    const char* value = std::getenv(name);
    return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
  });
  const char* id = env.job_id ? env.job_id->c_str() : nullptr;
  const char* token = env.token ? env.token->c_str() : nullptr;
  if (!f.rdzv_id.empty()) {
    if (f.rdzv_id.find_first_of("/ \n\t") != std::string::npos || f.rdzv_id.size() > 200)
      throw InvalidValueError("--rdzv-id",
                              "--rdzv-id: a job id has at most 200 characters and no '/', "
                              "spaces or newlines");
    id = f.rdzv_id.c_str();
  }
  if (job.nnodes > 1) {
    job.job_id = id ? id : "launch-" + job.master_addr + "-" + std::to_string(job.master_port);
    job.token = token ? token : "";
    if (!token)
      write_all(STDERR_FILENO,
                "launch: warning: COMMGRID_TOKEN is not set: anyone who can connect to this "
                "job's store (tcp://" +
                    job.master_addr + ":" + std::to_string(job.master_port) +
                    ") is handed the job's secret and can join or disturb the job, and its ranks "
                    "do not prove a token to each other; set the same COMMGRID_TOKEN (and "
                    "COMMGRID_JOB_ID) on every node (docs/security.md)\n");
  } else {
    job.job_id = id ? id : "launch-" + random_secret_hex(8);
    job.token = token ? token : random_secret_hex(32);
  }
}

// --store: checked by its scheme here; the rest (hosts, ports) by open_store, in launch with
// --spares, else in each rank (both exit 2 for a malformed URI).
void parse_store(const LaunchFlags& f, JobSetup& job) {
  if (f.store.empty()) return;
  const std::string& u = f.store;
  if (!(u.starts_with("etcd://") || u.starts_with("redis://") || u.starts_with("file:///") ||
        u.starts_with("tcp://")))
    throw InvalidValueError(
        "--store", "--store: expected etcd://, redis://, file:/// or tcp://, got '" + u + "'");
  job.store_uri = u;
}

// --spares and --max-restarts; the store launch serves for them.
void parse_spares(const LaunchFlags& f, LaunchSettings& s) {
  JobSetup& job = s.job;
  if (!f.spares.empty()) {
    job.spares = static_cast<int>(parse_integer("--spares", f.spares, 0, kMaxLaunchProcesses));
    job.resilient = true;
    const std::int64_t procs = s.num_processes();
    if (job.spares >= procs)
      throw InvalidValueError("--spares", "launch: --spares " + std::to_string(job.spares) +
                                              " leaves no process for the world (" +
                                              std::to_string(procs) + " processes)");
    // The placement RankMap checks: on several nodes, spares are whole nodes.
    SparePlacement placement;
    placement.spares = job.spares;
    if (job.nnodes > 1) placement.gpus_per_node = s.nproc;
    if (job.spares > 0) (void)RankMap(procs - job.spares, placement);
  }
  if (!f.max_restarts.empty()) {
    job.max_restarts =
        static_cast<int>(parse_integer("--max-restarts", f.max_restarts, 0, kMaxLaunchProcesses));
    if (job.max_restarts > 0 && !job.resilient)
      throw IncompatibleError("--max-restarts",
                              "launch: --max-restarts " + f.max_restarts +
                                  " needs --spares (a restarted process rejoins as a spare)");
  }
  if (job.resilient && job.master_port == 0 && job.store_uri.empty()) {
    // The TCP store launch serves: on a free port of this machine.
    job.master_port = free_tcp_port();
    if (job.master_port == 0) throw Error("launch: --spares: no free TCP port for the store");
  }
}

}  // namespace

void add_launch_flags(CLI::App& app, LaunchFlags& f) {
  // torchrun's flag names, with its underscore spellings too (--nproc_per_node).
  app.add_option("-n,--nproc,--nproc-per-node,--nproc_per_node", f.nproc,
                 "Number of processes (ranks) on this node, 1-1024")
      ->required()
      ->type_name("INT");
  app.add_option("--nnodes", f.nnodes, "Number of nodes (launches) of the job (default 1)")
      ->type_name("INT");
  app.add_option("--node-rank,--node_rank", f.node_rank,
                 "This node's index, 0 ... nnodes-1: its ranks are node_rank*n ... "
                 "node_rank*n+n-1 (required with --nnodes > 1)")
      ->type_name("INT");
  app.add_option("--master-addr,--master_addr", f.master_addr,
                 "Address of node 0 (default 127.0.0.1): rank 0 serves the TCP store there "
                 "and torch's MASTER_ADDR is it");
  app.add_option("--master-port,--master_port", f.master_port,
                 "Port of commgrid's TCP store on node 0 (required with --nnodes > 1); torch's "
                 "MASTER_PORT is the next port (without it, on one node: a free port)")
      ->type_name("INT");
  app.add_option("--rdzv-id,--rdzv_id", f.rdzv_id,
                 "The job's id (COMMGRID_JOB_ID, TORCHELASTIC_RUN_ID); the same on every node "
                 "(default: COMMGRID_JOB_ID, else a fresh one on one node)")
      ->type_name("ID");
  app.add_flag("--standalone", f.standalone,
               "torchrun's one-node mode: the default without --nnodes (accepted for torchrun "
               "command lines)");
  app.add_option("--output", f.output,
                 "prefixed (default: every line as \"[rank i] line\"), raw (every line as it "
                 "is) or rank0 (rank 0's lines as they are, the other ranks' stderr prefixed "
                 "and their stdout dropped: one rank's JSON pipes cleanly)")
      ->type_name("MODE");
  app.add_option("--timeout", f.timeout,
                 "Seconds: bound of every rendezvous and collective of the ranks (exported as "
                 "COMMGRID_TIMEOUT) and, one second later, of the whole job (exit 124)")
      ->type_name("SECONDS");
  app.add_option("--grace", f.grace,
                 "Seconds between SIGTERM and SIGKILL when stopping the ranks (default 5)");
  app.add_option("--spares", f.spares,
                 "Hot spares: the last S of the job's processes hold no rank; when a process "
                 "dies the job goes on (the program recovers: docs/resilience.md) and launch "
                 "serves the TCP store itself; --spares 0: the job goes on without spares "
                 "(a program that shrinks)")
      ->type_name("S");
  app.add_option("--max-restarts,--max_restarts", f.max_restarts,
                 "With --spares: restart up to R dead processes, which rejoin as spares "
                 "(torchrun's name for the budget; default 0)")
      ->type_name("R");
  app.add_option("--store", f.store,
                 "Where the ranks meet instead (the same on every node): "
                 "etcd://host:port[,host:port...][/prefix] (an etcd cluster: no single point "
                 "of failure, also with --spares), redis://..., file:///shared/folder or "
                 "tcp://host:port; with etcd and COMMGRID_ETCD_ROOT_PASSWORD, launch first "
                 "grants the job's etcd user (docs/launching.md)")
      ->type_name("URI");
  // Hidden (empty group): a rank stops itself between fork and exec, to test launch's bound.
  app.add_option("--stop-before-exec", f.stop_before_exec)->group("");
  app.add_option("command", f.command, "-- PROGRAM ARGS...")->required();
}

LaunchSettings parse_launch_flags(const LaunchFlags& f) {
  LaunchSettings s;
  parse_placement(f, s);
  s.output = parse_output(f.output);
  parse_identity(f, s.job);
  if (!f.timeout.empty()) {
    s.timeout = to_ms(parse_seconds("--timeout", f.timeout, false));
    s.timeout_text = f.timeout;
  }
  s.grace = to_ms(parse_seconds("--grace", f.grace, true));
  if (!f.stop_before_exec.empty())
    s.stop_before_exec =
        static_cast<int>(parse_integer("--stop-before-exec", f.stop_before_exec, 0, s.nproc - 1));
  if (f.command.empty() || f.command.front().empty())
    throw ConfigError("command",
                      "launch: no program given (usage: commgrid launch -n N -- PROGRAM ARGS...)");
  s.command = f.command;
  parse_store(f, s.job);
  parse_spares(f, s);
  if (s.job.torch_port == 0) s.job.torch_port = free_tcp_port();
  return s;
}

}  // namespace commgrid::cli
