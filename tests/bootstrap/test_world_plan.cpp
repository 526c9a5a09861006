// The world plan (no world is started): which launcher started the process, from its
// variables alone, and which backend and engine follow for a program's flags.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "commgrid/world_plan.hpp"

namespace commgrid {
namespace {

EnvLookup env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

WorldRequest built_all() {
  WorldRequest r;
  r.mpi_built = r.gloo_built = r.nccl_built = true;
  return r;
}

TEST(DetectLauncher, EachLauncherByItsVariables) {
  EXPECT_EQ(detect_launcher(env({})).launcher, Launcher::none);
  EXPECT_EQ(detect_launcher(env({})).describe(), "no launcher variables");
  const DetectedLauncher t = detect_launcher(env({{"RANK", "3"}, {"WORLD_SIZE", "4"}}));
  EXPECT_EQ(t.launcher, Launcher::torchrun);
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.size, 4);
  EXPECT_FALSE(t.store);
  EXPECT_EQ(t.describe(), "torchrun (RANK=3, WORLD_SIZE=4)");
  const DetectedLauncher o =
      detect_launcher(env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}));
  EXPECT_EQ(o.launcher, Launcher::open_mpi);
  EXPECT_FALSE(o.store_launcher());
  EXPECT_EQ(detect_launcher(env({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}})).launcher, Launcher::hydra);
  EXPECT_EQ(detect_launcher(env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}})).launcher,
            Launcher::slurm);
  const DetectedLauncher c = detect_launcher(env(
      {{"COMMGRID_RANK", "0"}, {"COMMGRID_WORLD_SIZE", "2"}, {"COMMGRID_STORE", "file:///tmp/x"}}));
  EXPECT_EQ(c.launcher, Launcher::commgrid_launch);
  EXPECT_TRUE(c.store);
  EXPECT_TRUE(c.store_launcher());
}

TEST(DetectLauncher, MalformedValuesAreConfigErrors) {
  EXPECT_THROW((void)detect_launcher(env({{"RANK", "0"}})), ConfigError);  // no WORLD_SIZE
  EXPECT_THROW((void)detect_launcher(env({{"RANK", "x"}, {"WORLD_SIZE", "2"}})), InvalidValueError);
  EXPECT_THROW((void)detect_launcher(env({{"RANK", "2"}, {"WORLD_SIZE", "2"}})),
               RankOutOfRangeError);
  // Two launchers that disagree (not a per-node inner launch).
  EXPECT_THROW((void)detect_launcher(env({{"RANK", "0"},
                                          {"WORLD_SIZE", "2"},
                                          {"OMPI_COMM_WORLD_RANK", "1"},
                                          {"OMPI_COMM_WORLD_SIZE", "3"}})),
               IncompatibleError);
}

TEST(PlanWorld, BackendFollowsTheLauncher) {
  const WorldRequest r = built_all();
  const WorldPlan alone = plan_world(r, detect_launcher(env({})));
  EXPECT_EQ(alone.backend, "mpi");
  EXPECT_EQ(alone.engine, WorldEngine::mpi);
  EXPECT_EQ(alone.size, 1);
  EXPECT_TRUE(alone.alone());
  const WorldPlan torchrun =
      plan_world(r, detect_launcher(env({{"RANK", "1"}, {"WORLD_SIZE", "4"}})));
  EXPECT_EQ(torchrun.backend, "gloo");
  EXPECT_EQ(torchrun.engine, WorldEngine::store_ranks);
  EXPECT_EQ(torchrun.size, 4);
  EXPECT_EQ(torchrun.rank(), 1);
  EXPECT_FALSE(torchrun.alone());
  const WorldPlan mpirun = plan_world(
      r, detect_launcher(env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}})));
  EXPECT_EQ(mpirun.backend, "mpi");
  EXPECT_EQ(mpirun.engine, WorldEngine::mpi);
  WorldRequest local = r;
  local.local = 8;
  const WorldPlan threads = plan_world(local, detect_launcher(env({})));
  EXPECT_EQ(threads.backend, "gloo");
  EXPECT_EQ(threads.engine, WorldEngine::rank_threads);
  EXPECT_EQ(threads.size, 8);
  EXPECT_FALSE(threads.alone());
  // NCCL over mpirun's ranks bootstraps through MPI; over torchrun's through the store.
  WorldRequest nccl = r;
  nccl.backend = "nccl";
  EXPECT_EQ(plan_world(nccl, mpirun.launcher).engine, WorldEngine::mpi);
  EXPECT_EQ(plan_world(nccl, torchrun.launcher).engine, WorldEngine::store_ranks);
  // Without MPI in the build, a process alone is one rank-thread.
  WorldRequest no_mpi = r;
  no_mpi.mpi_built = false;
  EXPECT_EQ(plan_world(no_mpi, detect_launcher(env({}))).engine, WorldEngine::rank_threads);
}

TEST(PlanWorld, BadRequestsNameTheFlag) {
  WorldRequest r = built_all();
  r.backend = "tcp";
  try {
    (void)plan_world(r, detect_launcher(env({})));
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.parameter(), "backend");
    EXPECT_STREQ(e.what(), "backend: expected mpi, gloo or nccl, got 'tcp'");
  }
  r = built_all();
  r.accepted = {"gloo", "mpi"};
  r.backend = "nccl";
  EXPECT_THROW((void)plan_world(r, detect_launcher(env({}))), InvalidValueError);
  r = built_all();
  r.backend = "mpi";
  r.local = 2;
  EXPECT_THROW((void)plan_world(r, detect_launcher(env({}))), IncompatibleError);
  r.local.reset();
  EXPECT_THROW((void)plan_world(
                   r, detect_launcher(env({{"COMMGRID_RANK", "0"}, {"COMMGRID_WORLD_SIZE", "2"}}))),
               IncompatibleError);
  r = built_all();
  r.gloo_built = false;
  r.backend = "gloo";
  EXPECT_THROW((void)plan_world(r, detect_launcher(env({}))), ConfigError);
}

TEST(PlanWorld, NoLauncherErrorSaysHowToStartRanks) {
  const WorldPlan alone = plan_world(built_all(), detect_launcher(env({})));
  const ConfigError e =
      no_launcher_error(alone, "world_size 1 is not divisible by tp*pp*cp = 2*1*1 = 2");
  EXPECT_EQ(e.parameter(), "launcher");
  EXPECT_STREQ(e.what(),
               "no launcher found (world size 1 from no launcher variables): use --local N, mpirun "
               "or commgrid launch (world_size 1 is not divisible by tp*pp*cp = 2*1*1 = 2)");
}

}  // namespace
}  // namespace commgrid
