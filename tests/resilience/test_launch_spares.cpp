// commgrid launch --spares with real processes: one is killed by SIGKILL (rank 0 too: the
// store is served by launch), two die in a row with a restart, one is stopped and, once
// declared dead, continued and fenced; each job still ends with every rank's right result.
// Bad flags exit 2.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>

#include "cli_runner.hpp"

namespace commgrid::test {
namespace {

constexpr int kSteps = 6;

CliResult launch(const std::vector<std::string>& flags, const std::vector<std::string>& worker,
                 const std::string& timeout_s = "20") {
  std::string cmd = "COMMGRID_TIMEOUT=" + timeout_s + " timeout 200 " + shell_quote(COMMGRID_CLI) + " launch";
  for (const auto& f : flags) cmd += " " + shell_quote(f);
  cmd += " -- " + shell_quote(COMMGRID_RESILIENCE_WORKER);
  for (const auto& a : worker) cmd += " " + shell_quote(a);
  return run_shell(cmd);
}

// Every logical rank of the tp 2 world of 4 printed the sums of a run without failures:
// dp groups {0, 2} and {1, 3}, step s's sum (s + 1) * 4 or (s + 1) * 6.
void expect_right_sums(const CliResult& r, int expected_epoch) {
  std::map<int, std::string> got;
  std::istringstream lines(r.out);
  std::string line;
  const std::regex re(R"(rank (\d+) epoch (\d+) sums(.*))");
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, re)) continue;
    const int rank = std::stoi(m[1]);
    EXPECT_EQ(got.count(rank), 0u) << "rank " << rank << " printed twice:\n" << r.out;
    got[rank] = m[3];
    EXPECT_EQ(std::stoi(m[2]), expected_epoch) << line;
  }
  ASSERT_EQ(got.size(), 4u) << r.out << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    std::string want;
    for (int s = 0; s < kSteps; ++s) want += " " + std::to_string((s + 1) * (rank % 2 == 0 ? 4 : 6));
    EXPECT_EQ(got[rank], want) << "rank " << rank;
  }
}

TEST(LaunchSpares, AKilledRankIsReplacedByTheSpareAndTheRunIsUnchanged) {
  const CliResult r = launch({"-n", "5", "--spares", "1"}, {std::to_string(kSteps), "kill", "1", "2"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  expect_right_sums(r, 1);
  EXPECT_NE(r.err.find("rank 1 killed by signal 9 (SIGKILL); posted it to the job's store (epoch 0)"),
            std::string::npos) << r.err;
}

TEST(LaunchSpares, RankZeroDiesAndTheStoreLivesOnInLaunch) {
  const CliResult r = launch({"-n", "5", "--spares", "1"}, {std::to_string(kSteps), "kill", "0", "3"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  expect_right_sums(r, 1);
}

TEST(LaunchSpares, TwoFailuresInARowWithARestartedProcessAsTheSecondSpare) {
  // Process 1 dies at step 2; the spare (process 4) takes rank 1 and dies at step 4; the
  // restarted process 1 takes it back.
  const CliResult r = launch({"-n", "5", "--spares", "1", "--max-restarts", "1"},
                             {std::to_string(kSteps), "kill", "1", "2", "kill", "4", "4"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  expect_right_sums(r, 2);
  EXPECT_NE(r.err.find("restarting it as a spare (restart 1 of 1)"), std::string::npos) << r.err;
}

TEST(LaunchSpares, ASpareThatDiesDuringTheRecoveryIsReplacedByTheNext) {
  // Process 1 dies at step 2; spare 4, chosen for its rank, dies right after the decision,
  // before the new world exists: the others' world creation fails (at its 6 s timeout),
  // and epoch 2 gives the rank to spare 5.
  const CliResult r = launch({"-n", "6", "--spares", "2"},
                             {std::to_string(kSteps), "kill", "1", "2", "killrec", "4", "1"}, "6");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  expect_right_sums(r, 2);
}

TEST(LaunchSpares, AStoppedRankIsDeclaredDeadAndFencedWhenContinued) {
  // Process 2 stops itself (SIGSTOP); after its peers' timeout (6 s) they declare it dead;
  // continued, it finds itself fenced and exits 1 saying so. The job finishes.
  const CliResult r = launch({"-n", "5", "--spares", "1"}, {std::to_string(kSteps), "stop", "2", "2"}, "6");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  expect_right_sums(r, 1);
  EXPECT_NE(r.err.find("process 2 was declared dead in epoch 1 and is fenced: it may not rejoin"),
            std::string::npos) << r.err;
}

TEST(LaunchSpares, BadFlagsExitTwo) {
  for (const auto& flags : std::vector<std::vector<std::string>>{
           {"-n", "4", "--spares", "1", "--max-restarts", "-1"},
           {"-n", "4", "--spares", "4"},
           {"-n", "4", "--spares", "-1"},
           {"-n", "4", "--max-restarts", "1"},
           {"-n", "2", "--nnodes", "2", "--node-rank", "0", "--master-port", "29999", "--spares", "1"}}) {
    const CliResult r = launch(flags, {"1"});
    std::string all;
    for (const auto& f : flags) all += f + " ";
    EXPECT_EQ(r.code, 2) << all << r.err;
    EXPECT_NE(r.err.find("error: "), std::string::npos) << all << r.err;
  }
}

}  // namespace
}  // namespace commgrid::test
