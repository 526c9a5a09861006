// make_world's errors: each bad option or launch variable is a typed error naming the
// parameter (or variable) and its value, raised before any world is opened (no socket, no
// store, no MPI). The launch variables are set in this test process only.
#include <gtest/gtest.h>

#include <commgrid/commgrid.hpp>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace commgrid {
namespace {

// Every launcher's rank variable unset for the test, and `set` set; restored afterwards.
class LaunchVars {
 public:
  explicit LaunchVars(std::vector<std::pair<std::string, std::string>> set) {
    for (const char* name :
         {"COMMGRID_RANK", "COMMGRID_WORLD_SIZE", "COMMGRID_STORE", "COMMGRID_TIMEOUT", "RANK",
          "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"}) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      ::unsetenv(name);
    }
    for (const auto& [name, value] : set) {
      if (!std::getenv(name.c_str())) saved_.emplace_back(name, std::nullopt);
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~LaunchVars() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }
  LaunchVars(const LaunchVars&) = delete;
  LaunchVars& operator=(const LaunchVars&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Runs `f`, expects an E whose parameter() is `parameter` and whose text holds `text`.
template <class E, class F>
void expect_error(F&& f, const std::string& parameter, const std::string& text) {
  try {
    f();
    FAIL() << "no error; expected one naming " << parameter;
  } catch (const E& e) {
    EXPECT_EQ(e.parameter(), parameter) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(MakeWorldErrors, UnknownBackendNamesTheParameterAndValue) {
  const LaunchVars env({});
  for (const std::string name : {"glo", "MPI", "", "nccl2", "tcp"})
    expect_error<InvalidValueError>([&] { (void)make_world({.backend = name}); }, "backend",
                                    "got '" + name + "'");
}

TEST(MakeWorldErrors, TimeoutMustBePositive) {
  const LaunchVars env({});
  for (const auto t : {std::chrono::milliseconds(0), std::chrono::milliseconds(-5)})
    expect_error<InvalidValueError>([&] { (void)make_world({.backend = "auto", .timeout = t}); },
                                    "timeout", std::to_string(t.count()));
}

TEST(MakeWorldErrors, BackendThisBuildLacksIsAConfigErrorNamingIt) {
  const LaunchVars env({});
  const std::vector<std::string> built = built_backends();
  int missing = 0;
  for (const std::string name : {"gloo", "mpi", "nccl"}) {
    if (std::find(built.begin(), built.end(), name) != built.end()) continue;
    ++missing;
    expect_error<ConfigError>([&] { (void)make_world({.backend = name}); }, "backend",
                              "backend " + name);
  }
  if (missing == 0) GTEST_SKIP() << "this build has every backend: none is missing";
}

TEST(MakeWorldErrors, MalformedLaunchVariableIsNamedWithItsValue) {
  const LaunchVars env({{"COMMGRID_RANK", "1x"}, {"COMMGRID_WORLD_SIZE", "2"}});
  try {
    (void)make_world({});
    FAIL() << "no error for COMMGRID_RANK=1x";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("COMMGRID_RANK"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1x"), std::string::npos) << e.what();
  }
}

TEST(MakeWorldErrors, RankOutsideTheWorldIsAConfigError) {
  const LaunchVars env({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  EXPECT_THROW((void)make_world({}), RankOutOfRangeError);
}

TEST(MakeWorldErrors, MpiUnderAStoreLauncherIsIncompatible) {
  if (built_backends().size() < 2) GTEST_SKIP() << "needs gloo and mpi both built";
  const LaunchVars env({{"COMMGRID_RANK", "0"}, {"COMMGRID_WORLD_SIZE", "2"}});
  expect_error<IncompatibleError>([] { (void)make_world({.backend = "mpi"}); }, "backend",
                                  "commgrid launch");
}

TEST(MakeWorldErrors, RankThreadsPlanIsNotOneRanksWorld) {
  const LaunchVars env({});
  WorldPlan plan;
  plan.backend = "gloo";
  plan.engine = WorldEngine::rank_threads;
  plan.local = true;
  plan.size = 4;
  expect_error<InvalidValueError>([&] { (void)make_world({.backend = "gloo"}, plan); }, "plan",
                                  "4 rank-threads");
}

TEST(WorldRequest, AutoLeavesTheChoiceToThePlanAndSaysWhatIsBuilt) {
  const WorldRequest r = world_request({});
  EXPECT_EQ(r.backend, "");
  const std::vector<std::string> built = built_backends();
  auto has = [&](const char* n) { return std::find(built.begin(), built.end(), n) != built.end(); };
  EXPECT_EQ(r.gloo_built, has("gloo"));
  EXPECT_EQ(r.mpi_built, has("mpi"));
  EXPECT_EQ(r.nccl_built, has("nccl"));
  EXPECT_EQ(world_request({.backend = "mpi"}).backend, "mpi");
}

TEST(WorldRequest, AutoPlansTheLaunchersBackend) {
  if (built_backends().size() < 2) GTEST_SKIP() << "needs gloo and mpi both built";
  // Under a store launcher: gloo; under mpirun without a store: mpi.
  DetectedLauncher launch;
  launch.launcher = Launcher::commgrid_launch;
  launch.size = 2;
  EXPECT_EQ(plan_world(world_request({}), launch).backend, "gloo");
  DetectedLauncher mpirun;
  mpirun.launcher = Launcher::open_mpi;
  mpirun.size = 2;
  EXPECT_EQ(plan_world(world_request({}), mpirun).backend, "mpi");
}

}  // namespace
}  // namespace commgrid
