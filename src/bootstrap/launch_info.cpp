// Where this process stands in its job: views of the launch environment (launch_env.cpp
// reads and checks every variable; this file only applies defaults and says what is missing).
#include "commgrid/launch_info.hpp"

#include <string>

#include "commgrid/store.hpp"
#include "commgrid/world_plan.hpp"

namespace commgrid {

namespace {

DetectedLauncher detected_of(const LaunchEnv& env) {
  DetectedLauncher out;
  out.store = env.store.has_value() || env.master_addr.has_value();
  const std::optional<LauncherRanks> inner = env.world();
  if (!inner) return out;
  out.launcher = inner->launcher;
  out.rank = inner->rank;
  out.size = inner->size;
  out.variables = std::string(inner->rank_variable) + "=" + std::to_string(inner->rank) + ", " +
                  inner->size_variable + "=" + std::to_string(inner->size);
  return out;
}

}  // namespace

bool launched(const EnvLookup& lookup) { return !read_launch_env(lookup).launchers.empty(); }

bool launched() { return !read_launch_env().launchers.empty(); }

DetectedLauncher detect_launcher(const EnvLookup& lookup) {
  return detected_of(read_launch_env(lookup));
}

DetectedLauncher detect_launcher() { return detected_of(read_launch_env()); }

LaunchInfo launch_info_of(const LaunchEnv& env) {
  const std::optional<LauncherRanks> inner = env.world();
  if (!inner)
    throw ConfigError("launcher",
                      "no launcher found: none of COMMGRID_RANK (commgrid launch), RANK "
                      "(torchrun), SLURM_PROCID (srun), OMPI_COMM_WORLD_RANK (mpirun) or "
                      "PMI_RANK (Hydra) is set");
  LaunchInfo out;
  out.launcher = launcher_name(inner->launcher) + " (" + inner->rank_variable + ", " +
                 inner->size_variable + ")";
  out.rank = inner->rank;
  out.size = inner->size;
  out.local_rank = inner->local_rank;
  out.local_size = inner->local_size;
  const std::optional<std::string> store = env.store_uri();
  if (!store)
    throw ConfigError("COMMGRID_STORE", "no rendezvous store: " + launcher_name(inner->launcher) +
                                            " started this process, but neither COMMGRID_STORE "
                                            "nor MASTER_ADDR and MASTER_PORT are set");
  out.store = *store;
  out.job_id = env.effective_job_id();
  out.token = env.token.value_or("");
  out.timeout = env.timeout;
  out.nonce = env.run_nonce();
  out.epoch = env.restart_count.value_or(0);
  out.store_served_by_launcher = env.store_served_by_launcher;
  return out;
}

LaunchInfo read_launch_info(const EnvLookup& lookup) {
  return launch_info_of(read_launch_env(lookup));
}

LaunchInfo read_launch_info() { return launch_info_of(read_launch_env()); }

std::shared_ptr<Store> open_launch_store(const LaunchInfo& info,
                                         std::chrono::milliseconds timeout) {
  StoreOptions so;
  so.job_id = info.job_id;
  so.token = info.token;
  so.timeout = timeout;
  // Under commgrid launch --spares the launcher serves the store (so that losing rank 0
  // loses no store).
  so.serve = info.rank == 0 && !info.store_served_by_launcher;
  so.rank = info.rank;
  so.nonce = info.nonce;
  so.epoch = info.epoch;
  so.world_size = info.size;
  return open_store(info.store, so);
}

bool world_env_present() {
  const LaunchEnv env = read_launch_env();
  return !env.launchers.empty() && env.launchers.front().launcher == Launcher::commgrid_launch;
}

WorldEnv read_world_env() {
  const LaunchEnv env = read_launch_env();
  const bool ours =
      !env.launchers.empty() && env.launchers.front().launcher == Launcher::commgrid_launch;
  const char* missing = !ours ? "COMMGRID_RANK" : !env.store ? "COMMGRID_STORE" : nullptr;
  if (missing != nullptr)
    throw ConfigError(missing, std::string(missing) +
                                   " is not set (commgrid launch sets COMMGRID_RANK, "
                                   "COMMGRID_WORLD_SIZE and COMMGRID_STORE)");
  WorldEnv out;
  out.rank = env.launchers.front().rank;
  out.size = env.launchers.front().size;
  out.store = *env.store;
  out.timeout = env.timeout;
  return out;
}

}  // namespace commgrid
