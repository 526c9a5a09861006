// Where this process stands in its job, from whichever launcher started it: commgrid
// launch, torchrun, SLURM's srun, Open MPI's mpirun or MPICH/Hydra. Starting a world from it
// is the backend's: make_gloo_world_from_env() in <commgrid/gloo.hpp>.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "commgrid/communicator.hpp"
#include "commgrid/store.hpp"

namespace commgrid {

/// Where this process stands in its job, as its launcher described it.
struct LaunchInfo {
  /// The launcher whose variables gave rank and size, with the variables' names, e.g.
  /// "torchrun (RANK, WORLD_SIZE)".
  std::string launcher;
  int rank = 0;        ///< 0 ... size-1
  int size = 1;        ///< >= 1
  int local_rank = 0;  ///< this process's index on its machine (a GPU job's device)
  /// Processes of this job on this machine; 0 when the launcher does not say.
  int local_size = 0;
  /// The rendezvous store's URL: COMMGRID_STORE, else tcp://MASTER_ADDR:MASTER_PORT.
  std::string store;
  /// COMMGRID_JOB_ID, else the launcher's job id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID), else
  /// "default". Every store key of the job lives under it.
  std::string job_id;
  /// COMMGRID_TOKEN: the job's secret, proven to the store and to every peer. Empty: the
  /// job is not authenticated (see docs/security.md).
  std::string token;
  /// COMMGRID_TIMEOUT in seconds, when set.
  std::optional<std::chrono::milliseconds> timeout;
};

/// A variable lookup (name -> value, nullopt when unset); tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

/// Reads the launcher's variables, in this order (the first launcher found gives the
/// world): commgrid launch (COMMGRID_RANK, COMMGRID_WORLD_SIZE, COMMGRID_LOCAL_RANK,
/// COMMGRID_LOCAL_WORLD_SIZE), torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE),
/// SLURM (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE), Open MPI
/// (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE), Hydra (PMI_RANK, PMI_SIZE,
/// MPI_LOCALRANKID, MPI_LOCALNRANKS). A later launcher that is also present must agree:
/// either the same rank and size, or be the outer launcher of a per-node job (its rank is
/// the node index rank / local_size and its size the number of nodes, as srun starting
/// one torchrun per node); otherwise ConfigError names both. Throws ConfigError for an
/// empty, malformed or out-of-range value, or when no launcher is found.
LaunchInfo read_launch_info(const EnvLookup& lookup);
/// read_launch_info over this process's environment.
LaunchInfo read_launch_info();

/// COMMGRID_TIMEOUT in seconds when set (parsed as read_launch_info parses it), with or
/// without a launcher: e.g. the bound of MPI_Init in a program that mpirun started. Throws
/// InvalidValueError ("COMMGRID_TIMEOUT") for a value that is not a positive number.
std::optional<std::chrono::milliseconds> read_launch_timeout(const EnvLookup& lookup);
/// read_launch_timeout over this process's environment.
std::optional<std::chrono::milliseconds> read_launch_timeout();

/// Whether any known launcher's rank variable is set.
bool launched(const EnvLookup& lookup);
/// launched over this process's environment.
bool launched();

/// Opens the job's rendezvous store as every launched rank does: info.store under
/// info.job_id with info.token, each request bounded by `timeout`; a tcp:// store is served
/// by rank 0 (it listens on its port). The errors of open_store.
[[nodiscard]] std::shared_ptr<Store> open_launch_store(const LaunchInfo& info,
                                                       std::chrono::milliseconds timeout);

/// The rank, size, store and timeout that commgrid launch (or a user's own script) put in
/// COMMGRID_* variables: the store-based launcher's part of LaunchInfo.
struct WorldEnv {
  int rank = 0;       ///< COMMGRID_RANK, 0 ... size-1
  int size = 1;       ///< COMMGRID_WORLD_SIZE, >= 1
  std::string store;  ///< COMMGRID_STORE, e.g. file:///tmp/x or redis://host:6379
  /// COMMGRID_TIMEOUT in seconds (a positive decimal), when set.
  std::optional<std::chrono::milliseconds> timeout;
};

/// Reads COMMGRID_RANK, COMMGRID_WORLD_SIZE, COMMGRID_STORE and the optional
/// COMMGRID_TIMEOUT. Throws ConfigError naming the variable and its text when one is
/// missing or malformed ("COMMGRID_RANK=3 is not below COMMGRID_WORLD_SIZE=2").
WorldEnv read_world_env();

/// Whether COMMGRID_RANK is set: the process was started by a store-based launcher
/// (commgrid launch, or a user's own script exporting the variables).
bool world_env_present();

}  // namespace commgrid
