// How a program's world will start: the launcher, the backend and the engine.
#include "commgrid/world_plan.hpp"

#include <algorithm>

namespace commgrid {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

bool built(const WorldRequest& r, const std::string& backend) {
  return backend == "mpi" ? r.mpi_built : backend == "gloo" ? r.gloo_built : r.nccl_built;
}

// What to install for a backend a build lacks (the CLI's and the examples' advice alike).
std::string missing_backend(const std::string& backend) {
  if (backend == "mpi")
    return "this build of commgrid has no MPI backend; install an MPI (e.g. libopenmpi-dev) and "
           "rebuild with -DCOMMGRID_WITH_MPI=ON";
  if (backend == "gloo")
    return "this build of commgrid has no Gloo backend; install libgloo-dev and rebuild with "
           "-DCOMMGRID_WITH_GLOO=ON";
  return "this build of commgrid has no NCCL backend; install CUDA and NCCL and rebuild with "
         "-DCOMMGRID_WITH_NCCL=ON";
}

}  // namespace

std::string DetectedLauncher::describe() const {
  if (launcher == Launcher::none) return "no launcher variables";
  return launcher_name(launcher) + " (" + variables + ")";
}

WorldPlan plan_world(const WorldRequest& request, const DetectedLauncher& launcher) {
  WorldPlan plan;
  plan.launcher = launcher;
  std::string backend = request.backend;
  if (backend.empty()) {
    const bool store_world = request.local || launcher.store_launcher() ||
                             (launcher.store && launcher.launcher != Launcher::none);
    backend = (store_world && request.gloo_built) || !request.mpi_built ? "gloo" : "mpi";
  }
  if (std::find(request.accepted.begin(), request.accepted.end(), backend) ==
      request.accepted.end())
    throw InvalidValueError(
        "backend", "backend: expected " + joined(request.accepted) + ", got '" + backend + "'");
  if (!built(request, backend))
    throw ConfigError("backend", "backend " + backend + ": " + missing_backend(backend));
  plan.backend = backend;

  if (request.local) {
    if (backend == "mpi")
      throw IncompatibleError("local",
                              "local: --local runs ranks as threads and needs --backend "
                              "gloo" +
                                  std::string(request.nccl_built ? " or nccl" : "") +
                                  " (under mpirun the launcher sets the number of ranks)");
    if (!request.gloo_built)
      throw ConfigError("local",
                        "local: --local runs ranks as threads over a Gloo bootstrap, and " +
                            missing_backend("gloo"));
    if (*request.local < 1)
      throw InvalidValueError("local",
                              "local: --local must be >= 1, got " + std::to_string(*request.local));
    plan.engine = WorldEngine::rank_threads;
    plan.local = true;
    plan.size = *request.local;
    return plan;
  }
  plan.size = launcher.size;
  if (backend == "mpi") {
    if (launcher.store_launcher())
      throw IncompatibleError("backend",
                              "backend: --backend mpi needs an MPI launcher (mpirun, "
                              "srun), but " +
                                  launcher.describe() +
                                  " started this process; use --backend gloo");
    plan.engine = WorldEngine::mpi;
    return plan;
  }
  // gloo, or nccl over a bootstrap world: a launched rank meets the others in the store;
  // an MPI launcher's rank without a store meets them through MPI (nccl only).
  if (launcher.launcher == Launcher::none) {
    // A world of this one process: one rank-thread, or an MPI singleton.
    plan.engine = request.gloo_built ? WorldEngine::rank_threads : WorldEngine::mpi;
    return plan;
  }
  if (launcher.store_launcher() || launcher.store || !request.mpi_built || backend == "gloo") {
    plan.engine = WorldEngine::store_ranks;  // read_launch_info names a missing store
    return plan;
  }
  plan.engine = WorldEngine::mpi;
  return plan;
}

ConfigError no_launcher_error(const WorldPlan& plan, const std::string& why) {
  return ConfigError("launcher", "no launcher found (world size " + std::to_string(plan.size) +
                                     " from " + plan.launcher.describe() +
                                     "): use --local N, mpirun or commgrid launch (" + why + ")");
}

}  // namespace commgrid
