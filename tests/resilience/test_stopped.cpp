// A process that does not run for a while (SIGSTOP), under commgrid launch --spares with
// real processes: stopped for longer than the job's timeout but for less than the decision
// window (1.5 timeouts after its peers' own timeout), it comes back before the others
// decide; the job went on without it all the same (its epoch failed), so it is dead to the
// job: it says so, is fenced, and a spare takes its rank. Stopped for less than the
// timeout, nobody notices and the job goes on with it.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>

#include "cli_runner.hpp"

namespace commgrid::test {
namespace {

constexpr int kSteps = 6;

CliResult launch(const std::vector<std::string>& flags, const std::vector<std::string>& worker,
                 const std::string& timeout_s) {
  std::string cmd =
      "COMMGRID_TIMEOUT=" + timeout_s + " timeout 200 " + shell_quote(COMMGRID_CLI) + " launch";
  for (const auto& f : flags) cmd += " " + shell_quote(f);
  cmd += " -- " + shell_quote(COMMGRID_RESILIENCE_WORKER);
  for (const auto& a : worker) cmd += " " + shell_quote(a);
  return run_shell(cmd);
}

// Every logical rank of the tp 2 world of 4 printed the sums of a run without failures, in
// `epoch`; returns the label launch gave each logical rank's line ("rank 2" in epoch 0,
// "rank 2, epoch 1" after a regroup: launch follows the epochs).
std::map<int, std::string> expect_right_sums(const CliResult& r, int epoch) {
  std::map<int, std::string> got;
  std::map<int, std::string> label;
  std::istringstream lines(r.out);
  std::string line;
  const std::regex re(R"(\[([^\]]+)\] rank (\d+) epoch (\d+) sums(.*))");
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, re)) continue;
    const int rank = std::stoi(m[2]);
    got[rank] = m[4];
    label[rank] = m[1];
    EXPECT_EQ(std::stoi(m[3]), epoch) << line;
  }
  EXPECT_EQ(got.size(), 4u) << r.out << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    std::string want;
    for (int s = 0; s < kSteps; ++s)
      want += " " + std::to_string((s + 1) * (rank % 2 == 0 ? 4 : 6));
    EXPECT_EQ(got[rank], want) << "rank " << rank;
    EXPECT_EQ(label[rank], "rank " + std::to_string(rank) +
                               (epoch > 0 ? ", epoch " + std::to_string(epoch) : ""))
        << r.out;
  }
  return label;
}

TEST(StoppedProcess, BackBeforeTheDecisionAfterTheJobWentOnItIsFencedAndReplaced) {
  // Timeout 6 s; process 2 stops at step 2 for 9 s (1.5 timeouts): its peers time out at
  // 6 s and agree; it comes back at 9 s, before the decision window (6 + 9 s) ends.
  const CliResult r = launch({"-n", "5", "--spares", "1"},
                             {std::to_string(kSteps), "stopfor", "2", "2", "9000"}, "6");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  // Process 2 was fenced (below), so the line of logical rank 2 in epoch 1 is the spare's.
  (void)expect_right_sums(r, 1);
  EXPECT_NE(r.err.find("process 2 did not run for "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("longer than the job's timeout of 6.0 s, and the job went on without it "
                       "(epoch 0 failed): it is fenced: it may not rejoin"),
            std::string::npos)
      << r.err;
}

TEST(StoppedProcess, StoppedForLessThanTheTimeoutNobodyNoticesAndTheJobKeepsIt) {
  // Stopped for 2 s of a 20 s timeout: its peers wait for it, and epoch 0 goes on.
  const CliResult r = launch({"-n", "5", "--spares", "1"},
                             {std::to_string(kSteps), "stopfor", "2", "2", "2000"}, "20");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  (void)expect_right_sums(r, 0);
  EXPECT_EQ(r.err.find("fenced"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace commgrid::test
