// The launch environment (read_launch_env): every variable read once, by strict parsers. A
// table of environments, each with the error it must raise (the variable and its value) or
// what must be read; pure (no process is started, the environment is a map).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "commgrid/launch_env.hpp"
#include "commgrid/launch_info.hpp"
#include "commgrid/world_plan.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;
using Vars = std::map<std::string, std::string>;

EnvLookup lookup_in(const Vars& vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// "PARAMETER: message" of the ConfigError reading `vars` raises; "no error" when none.
std::string env_error(const Vars& vars) {
  try {
    (void)read_launch_env(lookup_in(vars));
  } catch (const ConfigError& e) { return e.parameter() + ": " + e.what(); }
  return "no error";
}

Vars torchrun(Vars extra = {}) {
  Vars v = {{"RANK", "1"}, {"WORLD_SIZE", "4"}};
  v.insert(extra.begin(), extra.end());
  return v;
}

TEST(LaunchEnv, ANumberWithTrailingCharactersIsAnError) {
  EXPECT_EQ(env_error({{"RANK", "1abc"}, {"WORLD_SIZE", "4"}}),
            "RANK: RANK='1abc' is not a whole decimal number");
  EXPECT_EQ(env_error({{"COMMGRID_RANK", "0"}, {"COMMGRID_WORLD_SIZE", "4x"}}),
            "COMMGRID_WORLD_SIZE: COMMGRID_WORLD_SIZE='4x' is not a whole decimal number");
  EXPECT_EQ(env_error(torchrun({{"COMMGRID_TIMEOUT", "5abc"}})),
            "COMMGRID_TIMEOUT: COMMGRID_TIMEOUT='5abc' is not a positive number of seconds");
  EXPECT_EQ(env_error(torchrun({{"MASTER_PORT", "29500 "}})),
            "MASTER_PORT: MASTER_PORT='29500 ' is not a whole decimal number");
  EXPECT_EQ(env_error({{"COMMGRID_STORE_MAX_CONNECTIONS", "10k"}}),
            "COMMGRID_STORE_MAX_CONNECTIONS: COMMGRID_STORE_MAX_CONNECTIONS='10k' is not a "
            "positive whole number");
  EXPECT_EQ(env_error({{"COMMGRID_PROCESS", "1"},
                       {"COMMGRID_NUM_PROCESSES", "3"},
                       {"COMMGRID_SPARES", "1"},
                       {"COMMGRID_INCARNATION", "0x1"}}),
            "COMMGRID_INCARNATION: COMMGRID_INCARNATION='0x1' is not a whole decimal number");
  EXPECT_EQ(env_error(torchrun({{"TORCHELASTIC_RESTART_COUNT", "+1"}})),
            "TORCHELASTIC_RESTART_COUNT: TORCHELASTIC_RESTART_COUNT='+1' is not a whole decimal "
            "number");
  EXPECT_EQ(env_error({{"RANK", "99999999999999999999"}, {"WORLD_SIZE", "4"}}),
            "RANK: RANK='99999999999999999999' is out of range");
}

TEST(LaunchEnv, ANegativeOrZeroTimeoutIsAnError) {
  for (const char* bad : {"-1", "0", "0.0", "-0.5", "inf", "nan", "1e10", "0x10", " 5"}) {
    EXPECT_EQ(env_error(torchrun({{"COMMGRID_TIMEOUT", bad}})),
              std::string("COMMGRID_TIMEOUT: COMMGRID_TIMEOUT='") + bad +
                  "' is not a positive number of seconds")
        << bad;
  }
  EXPECT_EQ(read_launch_env(lookup_in(torchrun({{"COMMGRID_TIMEOUT", "2.5"}}))).timeout, 2500ms);
  EXPECT_EQ(read_launch_env(lookup_in(torchrun({{"COMMGRID_TIMEOUT", "1e-9"}}))).timeout, 1ms);
  EXPECT_EQ(read_launch_env(lookup_in(torchrun())).timeout, std::nullopt);
}

TEST(LaunchEnv, ARankOutsideTheWorldIsAnError) {
  EXPECT_EQ(env_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
            "RANK: RANK=4 is not below WORLD_SIZE=4");
  EXPECT_EQ(env_error({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}), "RANK: RANK=-1 must be >= 0");
  EXPECT_EQ(env_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}),
            "SLURM_NTASKS: SLURM_NTASKS=0 must be >= 1");
  EXPECT_EQ(env_error(torchrun({{"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}})),
            "LOCAL_RANK: LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2");
  EXPECT_EQ(env_error(torchrun({{"GROUP_RANK", "2"}, {"GROUP_WORLD_SIZE", "2"}})),
            "GROUP_RANK: GROUP_RANK=2 is not below GROUP_WORLD_SIZE=2");
  EXPECT_EQ(env_error({{"COMMGRID_PROCESS", "3"},
                       {"COMMGRID_NUM_PROCESSES", "3"},
                       {"COMMGRID_SPARES", "1"},
                       {"COMMGRID_INCARNATION", "0"}}),
            "COMMGRID_PROCESS: COMMGRID_PROCESS=3 is not below COMMGRID_NUM_PROCESSES=3");
  EXPECT_EQ(env_error({{"COMMGRID_PROCESS", "0"},
                       {"COMMGRID_NUM_PROCESSES", "3"},
                       {"COMMGRID_SPARES", "3"},
                       {"COMMGRID_INCARNATION", "0"}}),
            "COMMGRID_SPARES: COMMGRID_SPARES=3 leaves no process of COMMGRID_NUM_PROCESSES=3 "
            "for the world");
  EXPECT_EQ(env_error(torchrun({{"MASTER_PORT", "65536"}})),
            "MASTER_PORT: MASTER_PORT=65536 must be <= 65535");
  EXPECT_EQ(env_error(torchrun({{"MASTER_PORT", "0"}})), "MASTER_PORT: MASTER_PORT=0 must be >= 1");
}

TEST(LaunchEnv, AnEmptyValueIsAnError) {
  for (const char* name :
       {"COMMGRID_STORE", "COMMGRID_JOB_ID", "COMMGRID_TOKEN", "COMMGRID_JOB_NONCE",
        "COMMGRID_REDIS_PASSWORD", "COMMGRID_GLOO_HOSTNAME", "MASTER_ADDR", "TORCHELASTIC_RUN_ID",
        "SLURM_JOB_ID", "PMIX_NAMESPACE"}) {
    EXPECT_EQ(env_error(torchrun({{name, ""}})),
              std::string(name) + ": " + name + " is set but empty")
        << name;
  }
  EXPECT_EQ(env_error({{"RANK", ""}, {"WORLD_SIZE", "2"}}), "RANK: RANK is set but empty");
  EXPECT_EQ(env_error(torchrun({{"LOCAL_WORLD_SIZE", ""}})),
            "LOCAL_WORLD_SIZE: LOCAL_WORLD_SIZE is set but empty");
  EXPECT_EQ(env_error(torchrun({{"COMMGRID_TIMEOUT", ""}})),
            "COMMGRID_TIMEOUT: COMMGRID_TIMEOUT='' is not a positive number of seconds");
  EXPECT_EQ(env_error({{"COMMGRID_STORE_MAX_BYTES", ""}}),
            "COMMGRID_STORE_MAX_BYTES: COMMGRID_STORE_MAX_BYTES='' is not a positive whole number");
}

TEST(LaunchEnv, MissingPartnersAndBadIdsAreNamed) {
  EXPECT_EQ(env_error({{"RANK", "0"}}), "WORLD_SIZE: RANK is set but WORLD_SIZE is not (torchrun)");
  EXPECT_EQ(env_error({{"COMMGRID_PROCESS", "0"}}),
            "COMMGRID_NUM_PROCESSES: COMMGRID_NUM_PROCESSES is not set (commgrid launch --spares "
            "sets it)");
  EXPECT_EQ(env_error(torchrun({{"COMMGRID_JOB_ID", "a b"}})),
            "COMMGRID_JOB_ID: job id 'a b' may not contain '/', spaces or newlines");
  EXPECT_EQ(env_error(torchrun({{"TORCHELASTIC_RUN_ID", "x/y"}})),
            "TORCHELASTIC_RUN_ID: job id 'x/y' may not contain '/', spaces or newlines");
  EXPECT_EQ(env_error(torchrun({{"COMMGRID_STORE_SERVED", "yes"}})),
            "COMMGRID_STORE_SERVED: COMMGRID_STORE_SERVED='yes' is not 'launch' (commgrid launch "
            "--spares sets it)");
  // A value quoted in an error shows no control characters and is cut short.
  const std::string error =
      env_error({{"RANK", "1\n\x1b[31m" + std::string(200, '9')}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_EQ(error.find('\x1b'), std::string::npos) << error;
  EXPECT_LT(error.size(), 160u) << error;
}

TEST(LaunchEnv, EveryLauncherAndSettingIsReadIntoTheOneStruct) {
  const LaunchEnv env = read_launch_env(lookup_in({{"COMMGRID_RANK", "5"},
                                                   {"COMMGRID_WORLD_SIZE", "8"},
                                                   {"COMMGRID_LOCAL_RANK", "1"},
                                                   {"COMMGRID_LOCAL_WORLD_SIZE", "4"},
                                                   {"RANK", "5"},
                                                   {"WORLD_SIZE", "8"},
                                                   {"GROUP_RANK", "1"},
                                                   {"GROUP_WORLD_SIZE", "2"},
                                                   {"MASTER_ADDR", "10.0.0.1"},
                                                   {"MASTER_PORT", "29501"},
                                                   {"TORCHELASTIC_RUN_ID", "run7"},
                                                   {"TORCHELASTIC_RESTART_COUNT", "0"},
                                                   {"COMMGRID_STORE", "tcp://10.0.0.1:29500"},
                                                   {"COMMGRID_TOKEN", "t"},
                                                   {"COMMGRID_TIMEOUT", "60"},
                                                   {"COMMGRID_STORE_MAX_BYTES", "1048576"},
                                                   {"COMMGRID_STORE_SERVED", "launch"},
                                                   {"COMMGRID_PROCESS", "5"},
                                                   {"COMMGRID_NUM_PROCESSES", "9"},
                                                   {"COMMGRID_SPARES", "1"},
                                                   {"COMMGRID_INCARNATION", "2"}}));
  ASSERT_EQ(env.launchers.size(), 2u);
  EXPECT_EQ(env.launchers[0].launcher, Launcher::commgrid_launch);
  EXPECT_EQ(env.launchers[1].launcher, Launcher::torchrun);
  const auto world = env.world();
  ASSERT_TRUE(world.has_value());
  EXPECT_EQ(world->rank, 5);
  EXPECT_EQ(world->size, 8);
  EXPECT_EQ(world->local_rank, 1);
  EXPECT_EQ(world->local_size, 4);
  EXPECT_EQ(env.group_rank, 1);
  EXPECT_EQ(env.group_world_size, 2);
  EXPECT_EQ(env.master_port, 29501);
  EXPECT_EQ(env.store_uri(), "tcp://10.0.0.1:29500");  // COMMGRID_STORE wins over MASTER_*
  EXPECT_EQ(env.effective_job_id(), "torchrun-run7");
  EXPECT_EQ(env.timeout, 60000ms);
  EXPECT_EQ(env.store_max_bytes, 1048576u);
  EXPECT_TRUE(env.store_served_by_launcher);
  ASSERT_TRUE(env.spares.has_value());
  EXPECT_EQ(env.spares->world_size(), 8);
  EXPECT_EQ(env.spares->incarnation, 2);
  EXPECT_TRUE(env.multi_node());
  EXPECT_EQ(env.security_warning(), "");  // it has a token

  // The views read the same struct.
  const LaunchInfo info = launch_info_of(env);
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.local_size, 4);
  EXPECT_EQ(info.store, "tcp://10.0.0.1:29500");
  EXPECT_TRUE(info.store_served_by_launcher);
  EXPECT_EQ(detect_launcher(lookup_in({{"RANK", "1"}, {"WORLD_SIZE", "2"}})).rank, 1);
}

TEST(LaunchEnv, TheRunNonceComesFromTheLauncherThatHasOne) {
  EXPECT_EQ(read_launch_env(lookup_in(torchrun())).run_nonce(), "");
  EXPECT_EQ(read_launch_env(lookup_in(torchrun({{"COMMGRID_JOB_NONCE", "n1"}}))).run_nonce(), "n1");
  EXPECT_EQ(read_launch_env(lookup_in({{"SLURM_PROCID", "0"},
                                       {"SLURM_NTASKS", "2"},
                                       {"SLURM_JOB_ID", "77"},
                                       {"SLURM_STEP_ID", "3"}}))
                .run_nonce(),
            "slurm 77.3");
  EXPECT_EQ(read_launch_env(lookup_in({{"OMPI_COMM_WORLD_RANK", "0"},
                                       {"OMPI_COMM_WORLD_SIZE", "2"},
                                       {"PMIX_NAMESPACE", "1992359937"}}))
                .run_nonce(),
            "open-mpi 1992359937");
}

TEST(LaunchEnv, AMultiNodeJobWithoutATokenGetsAWarning) {
  const LaunchEnv two_nodes =
      read_launch_env(lookup_in(torchrun({{"GROUP_RANK", "0"}, {"GROUP_WORLD_SIZE", "2"}})));
  EXPECT_TRUE(two_nodes.multi_node());
  const std::string w = two_nodes.security_warning();
  EXPECT_EQ(w.rfind("warning: this job spans 2 machines without COMMGRID_TOKEN", 0), 0u) << w;
  EXPECT_NE(w.find("hands the job secret to anyone"), std::string::npos) << w;
  EXPECT_FALSE(read_launch_env(lookup_in(torchrun({{"LOCAL_WORLD_SIZE", "4"}}))).multi_node());
  EXPECT_TRUE(read_launch_env(lookup_in(torchrun({{"LOCAL_WORLD_SIZE", "2"}}))).multi_node());
  EXPECT_EQ(unauthenticated_job_warning(1, false), "");
  EXPECT_EQ(unauthenticated_job_warning(3, true), "");
  EXPECT_NE(unauthenticated_job_warning(3, false), "");
}

TEST(LaunchEnv, SlurmsUnevenTasksPerNodeIsNotACount) {
  const LaunchEnv env = read_launch_env(lookup_in(
      {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "5"}, {"SLURM_NTASKS_PER_NODE", "2(x2),1"}}));
  EXPECT_EQ(env.world()->local_size, 0);
  EXPECT_EQ(
      env_error({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "5"}, {"SLURM_NTASKS_PER_NODE", "2x"}}),
      "SLURM_NTASKS_PER_NODE: SLURM_NTASKS_PER_NODE='2x' is not a whole decimal number");
}

}  // namespace
}  // namespace commgrid::test
