// The world of a program started by any launcher: commgrid launch, torchrun, SLURM's srun,
// mpirun (Open MPI) or Hydra, or no launcher at all (a world of one process). make_world
// reads the launch environment (read_launch_env), decides the backend and how the ranks meet
// (plan_world) and creates this process's world communicator with the backend's factory
// (make_gloo_world_from_env, make_mpi_world, make_nccl_world over a Gloo or MPI bootstrap).
// The layer above the backends and the bootstrap: commgrid::world.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/world_plan.hpp"

namespace commgrid {

/// What a program asks of its world.
struct WorldOptions {
  /// "gloo", "mpi", "nccl", or "auto": the launcher's (Gloo under commgrid launch or
  /// torchrun or with a store, MPI under mpirun, srun or Hydra), else whichever is built.
  std::string backend = "auto";
  /// Timeout of every rendezvous and every call on the world and its groups (> 0).
  /// COMMGRID_TIMEOUT, when set, overrides it for a Gloo world of launched ranks (as
  /// make_gloo_world_from_env does) and bounds MPI's start-up.
  std::chrono::milliseconds timeout = kDefaultTimeout;
};

/// The backends of this build, in the order "gloo", "mpi", "nccl".
[[nodiscard]] std::vector<std::string> built_backends();

/// The request plan_world decides for `options`: its backend ("" for auto) and what this
/// build has. Throws InvalidValueError ("backend") for a name other than auto, gloo, mpi and
/// nccl, InvalidValueError ("timeout") for a timeout <= 0.
[[nodiscard]] WorldRequest world_request(const WorldOptions& options);

/// Creates this process's world communicator: collective over every rank the launcher
/// started (each calls it). Throws, before anything is opened: InvalidValueError ("backend",
/// "timeout") as world_request; ConfigError ("backend") naming a backend this build lacks;
/// IncompatibleError ("backend") for mpi under commgrid launch or torchrun (their ranks are
/// not one MPI job); the launch environment's ConfigErrors naming the variable and its value
/// (read_launch_env). Then what the backend's factory throws (TimeoutError naming the ranks
/// that did not arrive, BackendError). For mpi, MPI is initialized when it is not (it is
/// finalized when the process exits; a program that wants it earlier holds its own
/// MpiEnvironment around the world's life).
[[nodiscard]] std::unique_ptr<Communicator> make_world(const WorldOptions& options = {});

/// Creates the world `plan` describes (plan_world over world_request(options) and the
/// detected launcher): for a program that checks its input for the planned world size
/// before any rank communicates. plan.engine rank_threads is accepted only for a world of
/// one process (InvalidValueError "plan" otherwise: rank-threads are run_local_ranks').
[[nodiscard]] std::unique_ptr<Communicator> make_world(const WorldOptions& options,
                                                       const WorldPlan& plan);

}  // namespace commgrid
