// The launch environment: every variable a launcher gives a process (commgrid launch and its
// --spares, torchrun, SLURM, Open MPI, Hydra) and every COMMGRID_* setting, read in one
// place by strict parsers. Every other reader (read_launch_info, detect_launcher, the
// stores' limits, the MPI backend's start-up bound, the resilience layer) takes its values
// from here.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "commgrid/axis.hpp"
#include "commgrid/error.hpp"

namespace commgrid {

/// A variable lookup (name -> value, nullopt when unset); tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

/// The launchers whose variables commgrid reads, closest to the process first.
enum class Launcher { none, commgrid_launch, torchrun, slurm, open_mpi, hydra };

/// "commgrid launch", "torchrun", "SLURM", "Open MPI", "Hydra"; "no launcher" for none.
[[nodiscard]] std::string launcher_name(Launcher launcher);

/// One launcher's rank variables, parsed and checked (rank below size, local rank below
/// local size).
struct LauncherRanks {
  Launcher launcher = Launcher::none;
  const char* rank_variable = "";  ///< e.g. "RANK"
  const char* size_variable = "";  ///< e.g. "WORLD_SIZE"
  Rank rank = 0;                   ///< 0 ... size-1
  Rank size = 1;                   ///< >= 1
  Rank local_rank = 0;             ///< its local-rank variable; 0 when unset
  /// Its local-size variable; 0 when unset (or SLURM's uneven "2(x3)").
  Rank local_size = 0;
  /// "torchrun says rank 1 of 4 (RANK, WORLD_SIZE)".
  [[nodiscard]] std::string describe() const;
};

/// What `commgrid launch --spares S` tells each of its processes.
struct SpareEnv {
  Rank process = 0;        ///< COMMGRID_PROCESS, 0 ... num_processes-1
  Rank num_processes = 1;  ///< COMMGRID_NUM_PROCESSES, W + S
  Rank spares = 0;         ///< COMMGRID_SPARES, S < num_processes
  Rank incarnation = 0;    ///< COMMGRID_INCARNATION, restarts of this process so far
  /// The world size W.
  [[nodiscard]] Rank world_size() const noexcept { return num_processes - spares; }
};

/// Every variable of the launch environment, each parsed strictly: a number with trailing
/// characters ("5abc"), a negative or zero timeout, a rank outside its world, an empty value
/// are ConfigErrors naming the variable and its value. Unset variables are nullopt.
struct LaunchEnv {
  /// Every launcher whose rank variable is set, closest to the process first: commgrid
  /// launch (COMMGRID_RANK, COMMGRID_WORLD_SIZE, COMMGRID_LOCAL_RANK,
  /// COMMGRID_LOCAL_WORLD_SIZE), torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE),
  /// SLURM (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE), Open MPI
  /// (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE), Hydra (PMI_RANK, PMI_SIZE,
  /// MPI_LOCALRANKID, MPI_LOCALNRANKS).
  std::vector<LauncherRanks> launchers;

  std::optional<std::string> store;   ///< COMMGRID_STORE: the rendezvous store's URL
  std::optional<std::string> job_id;  ///< COMMGRID_JOB_ID (no '/', spaces or newlines)
  std::optional<std::string> token;   ///< COMMGRID_TOKEN: the job's secret
  std::optional<std::string> nonce;   ///< COMMGRID_JOB_NONCE: this run of the job
  std::optional<std::chrono::milliseconds> timeout;  ///< COMMGRID_TIMEOUT, seconds > 0
  std::optional<std::string> redis_password;         ///< COMMGRID_REDIS_PASSWORD
  std::optional<std::string> gloo_hostname;          ///< COMMGRID_GLOO_HOSTNAME
  std::optional<std::size_t> store_max_connections;  ///< COMMGRID_STORE_MAX_CONNECTIONS, >= 1
  std::optional<std::size_t> store_max_bytes;        ///< COMMGRID_STORE_MAX_BYTES, >= 1
  /// COMMGRID_STORE_SERVED=launch: commgrid launch --spares serves the store, not rank 0.
  bool store_served_by_launcher = false;
  /// commgrid launch --spares: COMMGRID_PROCESS, COMMGRID_NUM_PROCESSES, COMMGRID_SPARES,
  /// COMMGRID_INCARNATION (all four, or COMMGRID_PROCESS unset).
  std::optional<SpareEnv> spares;

  std::optional<std::string> master_addr;          ///< MASTER_ADDR
  std::optional<int> master_port;                  ///< MASTER_PORT, 1 ... 65535
  std::optional<std::string> torchelastic_run_id;  ///< TORCHELASTIC_RUN_ID
  std::optional<Rank> restart_count;               ///< TORCHELASTIC_RESTART_COUNT, >= 0
  std::optional<Rank> group_rank;                  ///< GROUP_RANK: torchrun's node, below:
  std::optional<Rank> group_world_size;            ///< GROUP_WORLD_SIZE: torchrun's nodes
  std::optional<std::string> slurm_job_id;         ///< SLURM_JOB_ID
  std::optional<std::string> slurm_step_id;        ///< SLURM_STEP_ID
  std::optional<Rank> slurm_nnodes;                ///< SLURM_NNODES (or SLURM_JOB_NUM_NODES), >= 1
  std::optional<std::string> ompi_job;             ///< PMIX_NAMESPACE (or OMPI_MCA_ess_base_jobid)

  /// The launcher that gives the world: the first of `launchers`, checked against every
  /// later one (the same rank and size, or the outer launcher of a per-node launch: its rank
  /// is the node index rank / local_size and its size the number of nodes, as srun
  /// starting one torchrun per node); IncompatibleError names both otherwise. nullopt when
  /// no launcher's rank variable is set.
  [[nodiscard]] std::optional<LauncherRanks> world() const;
  /// COMMGRID_JOB_ID, else "torchrun-" TORCHELASTIC_RUN_ID, else "slurm-" SLURM_JOB_ID[.step],
  /// else "default".
  [[nodiscard]] std::string effective_job_id() const;
  /// COMMGRID_STORE, else tcp://MASTER_ADDR:MASTER_PORT; nullopt when neither is given.
  [[nodiscard]] std::optional<std::string> store_uri() const;
  /// What tells this run of the job from another run with the same id: COMMGRID_JOB_NONCE,
  /// else the scheduler's own per-run id (SLURM's job and step, Open MPI's namespace); empty
  /// when the launcher gives none (torchrun, Hydra, ranks started by hand).
  [[nodiscard]] std::string run_nonce() const;
  /// Whether the job spans several machines as its launchers say: GROUP_WORLD_SIZE > 1,
  /// SLURM_NNODES > 1, or a world larger than its local size.
  [[nodiscard]] bool multi_node() const;
  /// A warning for a job that spans several machines without COMMGRID_TOKEN (see
  /// unauthenticated_job_warning); empty otherwise.
  [[nodiscard]] std::string security_warning() const;
};

/// Reads every variable of the launch environment through `lookup`. Throws ConfigError
/// (InvalidValueError, RankOutOfRangeError) naming the first malformed variable and its
/// value; unset variables are not errors here (the readers that need one say so).
[[nodiscard]] LaunchEnv read_launch_env(const EnvLookup& lookup);
/// read_launch_env over this process's environment.
[[nodiscard]] LaunchEnv read_launch_env();

/// commgrid launch --spares' variables with the store they need: nullopt when
/// COMMGRID_PROCESS is unset (the job has no spares); ConfigError when COMMGRID_STORE is
/// not set or any variable is malformed.
[[nodiscard]] std::optional<SpareEnv> read_spare_env(const LaunchEnv& env);

/// The warning a job deserves that spans `nodes` machines without a token (empty when
/// nodes <= 1 or has_token): without COMMGRID_TOKEN a tcp:// store hands the job secret to
/// anyone who connects, and the ranks do not authenticate each other beyond it.
[[nodiscard]] std::string unauthenticated_job_warning(Rank nodes, bool has_token);

}  // namespace commgrid
