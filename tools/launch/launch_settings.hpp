// What `commgrid launch` was asked to do, checked: the job's place (nodes, store), its
// identity, its spares and how its output is shown. Built from the flags by
// launch_flags.cpp; read by the supervisor, the environment of each process and the store.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace commgrid::cli {

/// The most processes one launch starts, and one job has.
inline constexpr std::int64_t kMaxLaunchProcesses = 1024;

/// How the processes' output reaches launch's own stdout and stderr (--output).
enum class OutputMode {
  prefixed,  ///< every line of every process, as "[rank i] line"
  raw,       ///< every line of every process as it is (still whole lines, never interleaved)
  rank0,     ///< logical rank 0's lines as they are; the others' stderr prefixed, stdout dropped
};

/// Where and how this launch's processes meet.
struct JobSetup {
  int nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  ///< 0: a file store in a temporary folder (one node only)
  /// torch's MASTER_PORT: never commgrid's store port, which rank 0 of a commgrid program
  /// serves at the same address (--master-port + 1, or a free port on one node).
  int torch_port = 0;
  std::string job_id, token;
  /// --spares S: the last S processes of the job hold no rank; launch keeps the job going
  /// when a process dies and posts its death to the store it serves. `resilient` whenever
  /// --spares is given, 0 included (a job that shrinks when a process dies).
  int spares = 0;
  bool resilient = false;
  int max_restarts = 0;  ///< --max-restarts R: dead processes restarted as spares
  /// --store URI: the processes meet there (an etcd cluster, Redis, a shared folder) instead
  /// of in a store of launch's or rank 0's; with --spares launch posts deaths there and
  /// serves nothing, so that no one host's loss ends the job (etcd://).
  std::string store_uri;
};

/// Everything launch runs with.
struct LaunchSettings {
  int nproc = 1;  ///< processes on this node (-n)
  JobSetup job;
  /// --timeout as given (exported as COMMGRID_TIMEOUT) and in milliseconds.
  std::optional<std::string> timeout_text;
  std::optional<std::chrono::milliseconds> timeout;
  std::chrono::milliseconds grace{5000};  ///< --grace: SIGTERM to SIGKILL
  std::vector<std::string> command;       ///< PROGRAM ARGS...
  OutputMode output = OutputMode::prefixed;
  int stop_before_exec = -1;  ///< a local process that stops itself before exec (tests), or -1

  /// The job's process number of local process `local`.
  [[nodiscard]] int process_of(int local) const noexcept { return job.node_rank * nproc + local; }
  /// Every process of the job, on every node.
  [[nodiscard]] int num_processes() const noexcept { return nproc * job.nnodes; }
  /// The ranks of epoch 0: the processes less the spares.
  [[nodiscard]] int world_size() const noexcept { return num_processes() - job.spares; }
};

}  // namespace commgrid::cli
