// Where this process stands in its job, from whichever launcher started it: commgrid
// launch, torchrun, SLURM's srun, Open MPI's mpirun or MPICH/Hydra. Starting a world from it
// is the backend's: make_gloo_world_from_env() in <commgrid/gloo.hpp>.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "commgrid/communicator.hpp"
#include "commgrid/launch_env.hpp"
#include "commgrid/store.hpp"

namespace commgrid {

/// Where this process stands in its job, as its launcher described it: the part of
/// LaunchEnv (<commgrid/launch_env.hpp>) a launched rank needs, with the defaults applied.
struct LaunchInfo {
  /// The launcher whose variables gave rank and size, with the variables' names, e.g.
  /// "torchrun (RANK, WORLD_SIZE)".
  std::string launcher;
  Rank rank = 0;        ///< 0 ... size-1
  Rank size = 1;        ///< >= 1
  Rank local_rank = 0;  ///< this process's index on its machine (a GPU job's device)
  /// Processes of this job on this machine; 0 when the launcher does not say.
  Rank local_size = 0;
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
  /// What tells this run of the job from another with the same id (LaunchEnv::run_nonce);
  /// empty when the launcher gives nothing.
  std::string nonce;
  /// Which start of the job this is: TORCHELASTIC_RESTART_COUNT, else 0.
  Rank epoch = 0;
  /// COMMGRID_STORE_SERVED: commgrid launch --spares serves the store, so rank 0 does not.
  bool store_served_by_launcher = false;
};

/// Reads the launcher's variables (read_launch_env), in this order (the first launcher found gives
/// the world): commgrid launch (COMMGRID_RANK, COMMGRID_WORLD_SIZE, COMMGRID_LOCAL_RANK,
/// COMMGRID_LOCAL_WORLD_SIZE), torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE),
/// SLURM (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE), Open MPI
/// (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE), Hydra (PMI_RANK, PMI_SIZE,
/// MPI_LOCALRANKID, MPI_LOCALNRANKS). A later launcher that is also present must agree:
/// either the same rank and size, or be the outer launcher of a per-node job (its rank is
/// the node index rank / local_size and its size the number of nodes, as srun starting
/// one torchrun per node); otherwise ConfigError names both. Throws ConfigError for an
/// empty, malformed or out-of-range value, or when no launcher is found.
[[nodiscard]] LaunchInfo read_launch_info(const EnvLookup& lookup);
/// read_launch_info over this process's environment.
[[nodiscard]] LaunchInfo read_launch_info();
/// The LaunchInfo of an environment read already; the errors of read_launch_info.
[[nodiscard]] LaunchInfo launch_info_of(const LaunchEnv& env);

/// Whether any known launcher's rank variable is set.
[[nodiscard]] bool launched(const EnvLookup& lookup);
/// launched over this process's environment.
[[nodiscard]] bool launched();

/// Opens the job's rendezvous store as every launched rank does: info.store under
/// info.job_id with info.token, each request bounded by `timeout`; a tcp:// store is served
/// by rank 0 (it listens on its port) unless commgrid launch serves it. The rank claims its
/// place with info.nonce and info.size (StoreOptions::rank). The errors of open_store.
[[nodiscard]] std::shared_ptr<Store> open_launch_store(const LaunchInfo& info,
                                                       std::chrono::milliseconds timeout);

/// The rank, size, store and timeout that commgrid launch (or a user's own script) put in
/// COMMGRID_* variables: the store-based launcher's part of LaunchInfo.
struct WorldEnv {
  Rank rank = 0;      ///< COMMGRID_RANK, 0 ... size-1
  Rank size = 1;      ///< COMMGRID_WORLD_SIZE, >= 1
  std::string store;  ///< COMMGRID_STORE, e.g. file:///tmp/x or redis://host:6379
  /// COMMGRID_TIMEOUT in seconds (a positive decimal), when set.
  std::optional<std::chrono::milliseconds> timeout;
};

/// Reads COMMGRID_RANK, COMMGRID_WORLD_SIZE, COMMGRID_STORE and the optional
/// COMMGRID_TIMEOUT. Throws ConfigError naming the variable and its text when one is
/// missing or malformed ("COMMGRID_RANK=3 is not below COMMGRID_WORLD_SIZE=2").
[[nodiscard]] WorldEnv read_world_env();

/// Whether COMMGRID_RANK is set: the process was started by a store-based launcher
/// (commgrid launch, or a user's own script exporting the variables).
[[nodiscard]] bool world_env_present();

}  // namespace commgrid
