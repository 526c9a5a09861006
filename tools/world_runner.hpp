// The one world runner of `commgrid verify`, `commgrid bench` and the example programs
// (installed as commgrid::cli): the launcher (commgrid::plan_world in
// <commgrid/world_plan.hpp>) decides how the world starts (--local N rank-threads, ranks
// launched by commgrid launch or torchrun meeting in a store, an MPI job, or this process
// alone); the runner checks the input for its size on every rank alike, starts it (a
// launched rank's world is commgrid::make_world's, <commgrid/world.hpp>), runs the job on
// every rank and maps what went wrong to one exit code: 0 done, 1 a check or the
// communication failed, 2 bad input.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/world_plan.hpp"

namespace commgrid::cli {

/// What a program asks of its world: its flags' text and what it can run on.
struct RunnerOptions {
  /// --backend: "mpi", "gloo", "nccl", or "" to choose from the launcher.
  std::string backend;
  /// --local N ("" when not given).
  std::string local;
  /// How long any rank waits for the others in one call.
  std::chrono::milliseconds timeout{120000};
  /// The backends the program takes (its --backend choices).
  std::vector<std::string> accepted = {"mpi", "gloo", "nccl"};
  /// For --backend nccl: the GPU world over a bootstrap world (Gloo or MPI; a launched
  /// rank's from make_world), made after the input is checked. The program links NCCL; the
  /// runner does not. Empty: this program has no NCCL.
  std::function<std::unique_ptr<Communicator>(Communicator& boot)> device_world;
};

/// What runs on the world.
struct WorldJob {
  /// Checks the input for the planned world (plan.size ranks), identically on every rank
  /// and before any communication: a ConfigError here ends every rank with exit 2, printed
  /// once. Without a launcher a ConfigError about world_size becomes no_launcher_error.
  std::function<void(const WorldPlan& plan)> prepare;
  /// One rank's work on `world` (the device world for nccl); returns its exit code (0, or 1
  /// for a failed check). Rank 0 prints the results. A ConfigError (e.g. ranks given
  /// different flags) is exit 2, any other error exit 1, "rank R: ..." on stderr.
  std::function<int(Communicator& world, const WorldPlan& plan)> run;
};

/// Plans the world of `options` from this process's launcher, starts it and runs `job`;
/// returns the exit code of this process. Throws ConfigError for bad flags (--local "x",
/// a backend the program does not take) before anything starts. Under MPI a rank whose
/// job fails ends the whole job (MPI_Abort), since the others would wait for it.
int run_world(const RunnerOptions& options, const WorldJob& job);

/// The plan run_world would follow (no world is started): the flags parsed, the launcher
/// detected. Throws what run_world throws for bad flags.
WorldPlan plan_world_for(const RunnerOptions& options);

}  // namespace commgrid::cli
