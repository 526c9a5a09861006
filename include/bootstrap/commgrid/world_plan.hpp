// How a program's world will start, decided before any world exists: which launcher
// started this process (if any), which engine brings the ranks together (rank-threads,
// ranks meeting in the launcher's store, or MPI) and how many ranks there are. The one
// place where `verify`, `bench`, `train_gpt` and the examples read the launcher's variables;
// creating the world is then the backend's (make_gloo_world_from_env, make_mpi_world).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "commgrid/error.hpp"
#include "commgrid/launch_info.hpp"

namespace commgrid {

/// The launcher found in the environment, without opening anything.
struct DetectedLauncher {
  Launcher launcher = Launcher::none;
  /// The variables that gave rank and size, e.g. "RANK=1, WORLD_SIZE=4"; "" for none.
  std::string variables;
  Rank rank = 0;  ///< 0 ... size-1
  Rank size = 1;  ///< 1 when no launcher was found
  /// COMMGRID_STORE or MASTER_ADDR is set: launched ranks can meet in a store.
  bool store = false;
  /// The launcher starts ranks that meet in a store (commgrid launch, torchrun), as
  /// opposed to MPI launchers (mpirun, Hydra, srun), whose ranks meet through MPI unless a
  /// store is given.
  [[nodiscard]] bool store_launcher() const {
    return launcher == Launcher::commgrid_launch || launcher == Launcher::torchrun;
  }
  /// "torchrun (RANK=1, WORLD_SIZE=4)", or "no launcher variables".
  [[nodiscard]] std::string describe() const;
};

/// The first launcher of read_launch_info's order whose rank variable is set, with the rank
/// and size its variables give. Throws ConfigError for a malformed value (the errors of
/// read_launch_info: "WORLD_SIZE='x' is not a whole decimal number", rank not below size);
/// no launcher at all is not an error (Launcher::none, size 1).
[[nodiscard]] DetectedLauncher detect_launcher(const EnvLookup& lookup);
/// detect_launcher over this process's environment.
[[nodiscard]] DetectedLauncher detect_launcher();

/// How the ranks of a world come together.
enum class WorldEngine {
  rank_threads,  ///< N ranks as threads of this process over an in-memory store (Gloo)
  store_ranks,   ///< this process is one launched rank; the ranks meet in the launcher's store
                 ///< (Gloo)
  mpi,           ///< this process is one rank of an MPI job (or an MPI singleton)
};

/// What a program asks for: its --backend and --local flags, and what this build has.
struct WorldRequest {
  /// "mpi", "gloo", "nccl", or "" to choose from the launcher: gloo with `local` or under a
  /// store launcher (or a given store), else mpi (else gloo when MPI is not built).
  std::string backend;
  /// --local N: N ranks as threads of this process.
  std::optional<int> local;
  /// The backends the program accepts, in the order its --help names them.
  std::vector<std::string> accepted = {"mpi", "gloo", "nccl"};
  bool mpi_built = false;   ///< the MPI backend is part of this build
  bool gloo_built = false;  ///< the Gloo backend is part of this build
  bool nccl_built = false;  ///< the NCCL backend is part of this build
};

/// The decision: which backend carries the collectives, which engine starts the ranks
/// (for nccl: the bootstrap world's engine), and the world size when it is known before
/// the world exists.
struct WorldPlan {
  std::string backend;  ///< "mpi", "gloo" or "nccl"
  WorldEngine engine = WorldEngine::mpi;
  /// Ranks: --local N, the launcher's size, or 1 without a launcher. An MPI job's size is
  /// MPI's own once it has started (it agrees with the launcher's variables).
  Rank size = 1;
  DetectedLauncher launcher;
  /// The ranks are the --local N threads of this process.
  bool local = false;
  /// This process's rank as far as known before the world exists (0 for rank-threads).
  [[nodiscard]] Rank rank() const {
    return engine == WorldEngine::rank_threads ? 0 : launcher.rank;
  }
  /// No launcher and no --local: a world of this one process.
  [[nodiscard]] bool alone() const {
    return launcher.launcher == Launcher::none && !local && size == 1;
  }
};

/// Chooses the backend and engine for `request` under `launcher`. Throws ConfigError
/// (parameter "backend" or "local") for a backend the program does not accept or this build
/// lacks, --local with mpi, and an engine the launcher cannot carry (--backend mpi under
/// commgrid launch or torchrun, whose ranks are not one MPI job).
[[nodiscard]] WorldPlan plan_world(const WorldRequest& request, const DetectedLauncher& launcher);

/// The error for a world that cannot hold the program's layout because no launcher started
/// this process: "no launcher found (world size 1 from no launcher variables): use --local
/// N, mpirun or commgrid launch (world_size 1 is not divisible by ...)". `why` is the error
/// the one-rank world gave.
[[nodiscard]] ConfigError no_launcher_error(const WorldPlan& plan, const std::string& why);

}  // namespace commgrid
