#include "world_runner.hpp"

#include <algorithm>
#include <iostream>
#include <mutex>
#include <optional>

#include "cli_errors.hpp"
#include "commgrid/backends.hpp"
#include "commgrid/error.hpp"
#include "commgrid/launch_env.hpp"
#include "commgrid/world.hpp"
#include "layout_flags.hpp"
#if COMMGRID_HAS_GLOO
#include "commgrid/gloo.hpp"
#include "commgrid/local_ranks.hpp"
#endif
#if COMMGRID_HAS_MPI
#include "commgrid/mpi.hpp"
#endif

namespace commgrid::cli {
namespace {

// The job's input checked for the planned world. Without a launcher the world is this one
// process: a layout that needs more ranks is a missing launcher, and says so.
void prepare_for(const WorldJob& job, const WorldPlan& plan) {
  if (!job.prepare) return;
  try {
    job.prepare(plan);
  } catch (const ConfigError& e) {
    if (plan.alone() && (e.parameter() == "world_size" || e.parameter() == "local_world_size"))
      throw no_launcher_error(plan, e.what());
    throw;
  }
}

// On every launched rank alike (the same flags, the same world size): rank 0 says it once.
int config_failure(const WorldPlan& plan, const ConfigError& e) {
  if (plan.rank() == 0) print_error(e.what());
  return 2;
}

// This launched rank's world from make_world: for nccl its bootstrap world (Gloo in the
// launcher's store, or MPI), over which run_rank makes the device world once the input has
// been checked, where a failure is this rank's error.
std::unique_ptr<Communicator> launched_world(const RunnerOptions& o, const WorldPlan& plan) {
  WorldPlan boot = plan;
  boot.backend = plan.engine == WorldEngine::mpi ? "mpi" : "gloo";
  return make_world({.backend = boot.backend, .timeout = o.timeout}, boot);
}

// One rank of the world, or the device world over it.
int run_rank(const RunnerOptions& o, const WorldJob& job, const WorldPlan& plan,
             Communicator& boot) {
  if (plan.backend != "nccl") return job.run(boot, plan);
  const std::unique_ptr<Communicator> device = o.device_world(boot);
  return job.run(*device, plan);
}

// One process's rank of a launched world: errors become this rank's exit code, printed
// with the rank (a ConfigError, the same on every rank, once); `abort_job` ends the other
// ranks where the launcher would not (MPI).
int run_launched(const RunnerOptions& o, const WorldJob& job, const WorldPlan& plan,
                 Communicator& boot, void (*abort_job)()) {
  try {
    return run_rank(o, job, plan, boot);
  } catch (const ConfigError& e) {
    return config_failure(plan, e);
  } catch (const std::exception& e) {
    print_error("rank " + std::to_string(boot.rank()) + ": " +
                e.what());  // one write: never cut mid-line
    if (abort_job != nullptr) abort_job();
    return 1;
  }
}

#if COMMGRID_HAS_GLOO
int run_threads(const RunnerOptions& o, const WorldJob& job, const WorldPlan& plan) {
  prepare_for(job, plan);
  GlooOptions gloo;
  gloo.timeout = o.timeout;
  std::mutex mutex;
  int code = 0;
  const LocalRunResult run = run_local_ranks_collect(
      plan.size,
      [&](Communicator& world) {
        const int mine = run_rank(o, job, plan, world);
        const std::lock_guard<std::mutex> lock(mutex);
        code = std::max(code, mine);
      },
      gloo);
  if (run.first_failed_rank < 0) return code;
  print_error(run.first_failure);
  return exit_code_of(run.errors[static_cast<std::size_t>(run.first_failed_rank)]);
}

int run_store_ranks(const RunnerOptions& o, const WorldJob& job, const WorldPlan& launched) {
  // The whole launch description (store, job id, token) is read here, so that a launched
  // rank without a store is told which variables are missing.
  const LaunchInfo info = read_launch_info();
  WorldPlan plan = launched;
  plan.size = info.size;
  try {
    prepare_for(job, plan);
  } catch (const ConfigError& e) { return config_failure(plan, e); }
  const std::unique_ptr<Communicator> world = launched_world(o, plan);
  return run_launched(o, job, plan, *world, nullptr);
}
#endif

#if COMMGRID_HAS_MPI
int run_mpi(const RunnerOptions& o, const WorldJob& job, const WorldPlan& launched) {
  WorldPlan plan = launched;
  // Alone, the input is checked before MPI starts: a missing launcher is said at once.
  if (plan.alone()) prepare_for(job, plan);
  // MPI_Init waits for every rank of the job: bounded by the launch's timeout.
  const MpiEnvironment env(MpiThreadSupport::serialized,
                           read_launch_env().timeout.value_or(kDefaultTimeout));
  const std::unique_ptr<Communicator> world = launched_world(o, plan);
  // A launcher whose variables commgrid does not know may still have started an MPI job:
  // then the world is MPI's, and the input is checked for its size.
  const bool checked = plan.alone() && world->size() == plan.size;
  plan.size = world->size();
  plan.launcher.rank = world->rank();
  if (!checked) {
    try {
      prepare_for(job, plan);
    } catch (const ConfigError& e) { return config_failure(plan, e); }
  }
  return run_launched(o, job, plan, *world, [] { MpiEnvironment::abort(1); });
}
#endif

}  // namespace

WorldPlan plan_world_for(const RunnerOptions& o) {
  // What this build has (make_world's), the program's own backend choices checked by
  // plan_world against its accepted list.
  WorldRequest request = world_request({.backend = "auto", .timeout = o.timeout});
  request.backend = o.backend;
  if (!o.local.empty()) request.local = static_cast<int>(parse_integer("local", o.local, 1, 4096));
  request.accepted = o.accepted;
  request.nccl_built = request.nccl_built && static_cast<bool>(o.device_world);
  return plan_world(request, detect_launcher());
}

int run_world(const RunnerOptions& o, const WorldJob& job) {
  const WorldPlan plan = plan_world_for(o);
  switch (plan.engine) {
    case WorldEngine::rank_threads:
#if COMMGRID_HAS_GLOO
      return run_threads(o, job, plan);
#else
      break;
#endif
    case WorldEngine::store_ranks:
#if COMMGRID_HAS_GLOO
      return run_store_ranks(o, job, plan);
#else
      break;
#endif
    case WorldEngine::mpi:
#if COMMGRID_HAS_MPI
      return run_mpi(o, job, plan);
#else
      break;
#endif
  }
  // plan_world chose an engine this build lacks: it checks what is built, so this is a bug.
  throw InternalError("world runner: no engine for backend " + plan.backend);
}

}  // namespace commgrid::cli
