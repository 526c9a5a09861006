// make_world: the launcher's world through the backends' factories.
#include "commgrid/world.hpp"

#include <algorithm>
#include <optional>

#include "commgrid/backends.hpp"
#include "commgrid/error.hpp"
#include "commgrid/launch_env.hpp"
#include "commgrid/store.hpp"
#if COMMGRID_HAS_GLOO
#include "commgrid/gloo.hpp"
#endif
#if COMMGRID_HAS_MPI
#include "commgrid/mpi.hpp"
#endif
#if COMMGRID_HAS_NCCL
#include "commgrid/nccl.hpp"
#endif

namespace commgrid {
namespace {

constexpr const char* kBackendNames = "auto, gloo, mpi or nccl";

#if COMMGRID_HAS_MPI
// MPI started by make_world: finalized when the process exits (after main returns, so
// after the program's communicators are gone), unless the program holds its own
// MpiEnvironment, in which case this one owns nothing.
void ensure_mpi() {
  static const MpiEnvironment env(MpiThreadSupport::serialized,
                                  read_launch_env().timeout.value_or(kDefaultTimeout));
  (void)env;
}
#endif

// The world of the ranks that meet through the plan's engine: Gloo (one process alone or
// ranks in the launcher's store) or MPI.
std::unique_ptr<Communicator> bootstrap_world([[maybe_unused]] const WorldOptions& options,
                                              const WorldPlan& plan) {
  switch (plan.engine) {
    case WorldEngine::rank_threads:
      if (plan.size != 1)
        throw InvalidValueError("plan",
                                "plan: make_world starts one rank of a launched "
                                "world; " +
                                    std::to_string(plan.size) +
                                    " rank-threads are run_local_ranks'");
#if COMMGRID_HAS_GLOO
      {
        GlooOptions gloo;  // a world of this one process
        gloo.store = make_memory_store();
        gloo.timeout = options.timeout;
        return make_gloo_world(gloo);
      }
#else
      break;
#endif
    case WorldEngine::store_ranks:
#if COMMGRID_HAS_GLOO
    {
      GlooOptions gloo;
      gloo.timeout = options.timeout;
      return make_gloo_world_from_env(gloo);
    }
#else
      break;
#endif
    case WorldEngine::mpi:
#if COMMGRID_HAS_MPI
      ensure_mpi();
      return make_mpi_world({.timeout = options.timeout});
#else
      break;
#endif
  }
  // plan_world chooses only engines of what is built: another plan is the caller's.
  std::string built;
  for (const std::string& b : built_backends()) built += (built.empty() ? "" : ", ") + b;
  throw InvalidValueError("plan", "plan: its engine needs a backend this build lacks (it has: " +
                                      (built.empty() ? std::string("none") : built) + ")");
}

}  // namespace

std::vector<std::string> built_backends() {
  std::vector<std::string> names;
  if (COMMGRID_HAS_GLOO) names.emplace_back("gloo");
  if (COMMGRID_HAS_MPI) names.emplace_back("mpi");
  if (COMMGRID_HAS_NCCL) names.emplace_back("nccl");
  return names;
}

WorldRequest world_request(const WorldOptions& options) {
  const std::vector<std::string> known = {"auto", "gloo", "mpi", "nccl"};
  if (std::find(known.begin(), known.end(), options.backend) == known.end())
    throw InvalidValueError("backend", std::string("backend: expected ") + kBackendNames +
                                           ", got '" + options.backend + "'");
  if (options.timeout.count() <= 0)
    throw InvalidValueError("timeout", "timeout: must be > 0 ms, got " +
                                           std::to_string(options.timeout.count()) + " ms");
  WorldRequest request;
  request.backend = options.backend == "auto" ? "" : options.backend;
  request.accepted = {"gloo", "mpi", "nccl"};
  request.gloo_built = COMMGRID_HAS_GLOO != 0;
  request.mpi_built = COMMGRID_HAS_MPI != 0;
  request.nccl_built = COMMGRID_HAS_NCCL != 0;
  return request;
}

std::unique_ptr<Communicator> make_world(const WorldOptions& options) {
  const WorldRequest request = world_request(options);
  const DetectedLauncher launcher = detect_launcher();
  if (request.backend == "mpi" && launcher.store_launcher())
    throw IncompatibleError("backend",
                            "backend 'mpi' needs an MPI launcher (mpirun, srun), "
                            "but " +
                                launcher.describe() + " started this process; use backend 'gloo'");
  return make_world(options, plan_world(request, launcher));
}

std::unique_ptr<Communicator> make_world(const WorldOptions& options, const WorldPlan& plan) {
  (void)world_request(options);  // the same checks of the options
  std::unique_ptr<Communicator> boot = bootstrap_world(options, plan);
  if (plan.backend != "nccl") return boot;
#if COMMGRID_HAS_NCCL
  NcclOptions nccl;
  nccl.bootstrap = std::shared_ptr<Communicator>(std::move(boot));  // the NCCL world keeps it
  nccl.timeout = options.timeout;
  return make_nccl_world(nccl);
#else
  throw ConfigError("backend", "backend nccl: this build of commgrid has no NCCL backend");
#endif
}

}  // namespace commgrid
