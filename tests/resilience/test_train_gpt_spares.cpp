// train_gpt under commgrid launch --spares: a process SIGKILLed at a chosen step, and the
// run's per-step losses and gradient norms equal those of the same layout without
// failures to 1e-9 relative. Real processes, real Gloo, the launcher serving the store.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "cli_runner.hpp"

namespace commgrid::test {
namespace {

struct Step {
  double loss = 0, grad_norm = 0;
};

CliResult launch(const std::vector<std::string>& flags, const std::vector<std::string>& train) {
  std::string cmd = "COMMGRID_TIMEOUT=30 timeout 300 " + shell_quote(COMMGRID_CLI) + " launch";
  for (const auto& f : flags) cmd += " " + shell_quote(f);
  cmd += " -- " + shell_quote(COMMGRID_TRAIN_GPT);
  for (const auto& a : train) cmd += " " + shell_quote(a);
  return run_shell(cmd);
}

std::vector<Step> steps_of(const CliResult& r) {
  std::vector<Step> out;
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  if (j.is_discarded() || !j.contains("steps")) {
    ADD_FAILURE() << "no JSON on stdout:\n" << r.out << r.err;
    return out;
  }
  for (const auto& s : j["steps"]) out.push_back({s["loss"].get<double>(), s["grad_norm"].get<double>()});
  return out;
}

void expect_same(const std::vector<Step>& a, const std::vector<Step>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(std::abs(a[i].loss - b[i].loss), 1e-9 * std::abs(b[i].loss)) << "step " << i + 1;
    EXPECT_LE(std::abs(a[i].grad_norm - b[i].grad_norm), 1e-9 * std::abs(b[i].grad_norm)) << "step " << i + 1;
  }
}

// The same layout without spares and without failures: the reference.
std::vector<Step> reference(int world, const std::vector<std::string>& layout) {
  std::vector<std::string> train = layout;
  train.insert(train.end(), {"--steps", "6", "--format", "json"});
  const CliResult r = launch({"-n", std::to_string(world), "--output", "rank0"}, train);
  EXPECT_EQ(r.code, 0) << r.err;
  return steps_of(r);
}

std::vector<Step> with_failure(int processes, int spares, const std::vector<std::string>& layout,
                               const std::string& kills, int* code = nullptr, std::string* err = nullptr) {
  std::vector<std::string> train = layout;
  train.insert(train.end(), {"--steps", "6", "--format", "json", "--spares", std::to_string(spares),
                             "--snapshot-every", "2", "--fault-kill", kills});
  const CliResult r = launch({"-n", std::to_string(processes), "--spares", std::to_string(spares),
                              "--output", "raw"},
                             train);
  if (code != nullptr) {
    *code = r.code;
    *err = r.err;
    return {};
  }
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("killed by signal 9 (SIGKILL)"), std::string::npos) << r.err;
  return steps_of(r);
}

TEST(TrainGptSpares, TpAndDpAKilledRankIsReplacedAndTheRunIsUnchanged) {
  const std::vector<std::string> layout{"--tp", "2"};  // 4 ranks: tp 2, dp 2
  const auto want = reference(4, layout);
  // Process 1 dies at step 3: every rank rolls back to step 2's snapshot.
  expect_same(with_failure(5, 1, layout, "1:3"), want);
}

TEST(TrainGptSpares, RankZeroDiesAndItsSpareReportsTheRun) {
  const std::vector<std::string> layout{"--tp", "2"};
  expect_same(with_failure(5, 1, layout, "0:1"), reference(4, layout));
}

TEST(TrainGptSpares, TpPpDpAKilledStageIsReplaced) {
  const std::vector<std::string> layout{"--tp", "2", "--pp", "2", "--micro-batches", "2"};  // dp 2
  expect_same(with_failure(9, 1, layout, "5:2"), reference(8, layout));
}

TEST(TrainGptSpares, LosingEveryReplicaOfAStateEndsTheJobNamingTheRank) {
  // dp groups {0, 2} and {1, 3}: both of {0, 2} die at step 2; two spares take their
  // places, but nobody holds their state.
  int code = 0;
  std::string err;
  (void)with_failure(6, 2, {"--tp", "2"}, "0:2,2:2", &code, &err);
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find("the state of logical rank 0 is lost: every replica in its data-parallel group died"),
            std::string::npos) << err;
}

TEST(TrainGptSpares, BadInputExitsTwo) {
  // A layout without a replica, and --spares without launch --spares.
  const CliResult no_replica = launch({"-n", "3", "--spares", "1"}, {"--tp", "2", "--spares", "1"});
  EXPECT_EQ(no_replica.code, 2) << no_replica.err;
  EXPECT_NE(no_replica.err.find("buddy copies are not implemented"), std::string::npos) << no_replica.err;
  const CliResult no_launch = run_shell(shell_quote(COMMGRID_TRAIN_GPT) + " --spares 1 --local 2");
  EXPECT_EQ(no_launch.code, 2) << no_launch.err;
}

}  // namespace
}  // namespace commgrid::test
