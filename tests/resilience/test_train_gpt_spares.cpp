// train_gpt under commgrid launch --spares: a process SIGKILLed at a chosen step, and the
// run's per-step losses and gradient norms equal those of the same layout without
// failures to 1e-9 relative. Real processes, real Gloo, the launcher serving the store.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <utility>

#include "cli_runner.hpp"

namespace commgrid::test {
namespace {

struct Step {
  double loss = 0, grad_norm = 0;
};

// Every run here trains a smaller model than the default (hidden 16, sequences of 16): the
// same code paths at a quarter of the compute (CI time, under the sanitizers above all).
constexpr const char* kModel = " --hidden 16 --seq 16";

CliResult launch(const std::vector<std::string>& flags, const std::vector<std::string>& train) {
  std::string cmd = "COMMGRID_TIMEOUT=30 timeout 300 " + shell_quote(COMMGRID_CLI) + " launch";
  for (const auto& f : flags) cmd += " " + shell_quote(f);
  cmd += " -- " + shell_quote(COMMGRID_TRAIN_GPT) + kModel;
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
  for (const auto& s : j["steps"])
    out.push_back({s["loss"].get<double>(), s["grad_norm"].get<double>()});
  return out;
}

void expect_same(const std::vector<Step>& a, const std::vector<Step>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(std::abs(a[i].loss - b[i].loss), 1e-9 * std::abs(b[i].loss)) << "step " << i + 1;
    EXPECT_LE(std::abs(a[i].grad_norm - b[i].grad_norm), 1e-9 * std::abs(b[i].grad_norm))
        << "step " << i + 1;
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

// The same layout as rank-threads of one process (--local): the reference of the buddy
// tests (a second path to the same losses).
std::vector<Step> reference_local(int world, const std::vector<std::string>& layout) {
  std::string cmd = "timeout 300 " + shell_quote(COMMGRID_TRAIN_GPT) + kModel + " --local " +
                    std::to_string(world);
  for (const auto& a : layout) cmd += " " + shell_quote(a);
  const CliResult r = run_shell(cmd + " --steps 6 --format json --timeout 60");
  EXPECT_EQ(r.code, 0) << r.err;
  return steps_of(r);
}

// train_gpt under launch --spares S with --fault-kill KILLS (and K = 2): the launch's result.
CliResult run_with_failure(int processes, int spares, const std::vector<std::string>& layout,
                           const std::string& kills, const std::vector<std::string>& extra = {},
                           const std::vector<std::string>& launch_extra = {}) {
  std::vector<std::string> train = layout;
  train.insert(train.end(), {"--steps", "6", "--format", "json", "--spares", std::to_string(spares),
                             "--snapshot-every", "2", "--fault-kill", kills});
  train.insert(train.end(), extra.begin(), extra.end());
  std::vector<std::string> flags{
      "-n", std::to_string(processes), "--spares", std::to_string(spares), "--output", "raw"};
  flags.insert(flags.end(), launch_extra.begin(), launch_extra.end());
  return launch(flags, train);
}

std::vector<Step> with_failure(int processes, int spares, const std::vector<std::string>& layout,
                               const std::string& kills, int* code = nullptr,
                               std::string* err = nullptr,
                               const std::vector<std::string>& extra = {}) {
  const CliResult r = run_with_failure(processes, spares, layout, kills, extra);
  if (code != nullptr) {
    *code = r.code;
    *err = r.err;
    return {};
  }
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("killed by signal 9 (SIGKILL)"), std::string::npos) << r.err;
  return steps_of(r);
}

// A run whose failures it cannot survive: exit 1 and `message` on stderr.
void expect_ends_saying(int processes, int spares, const std::vector<std::string>& layout,
                        const std::string& kills, const std::string& message) {
  int code = 0;
  std::string err;
  (void)with_failure(processes, spares, layout, kills, &code, &err);
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find(message), std::string::npos) << err;
}

TEST(TrainGptSpares, TpAndDpAKilledRankIsReplacedAndTheRunIsUnchanged) {
  const std::vector<std::string> layout{"--tp", "2"};  // 4 ranks: tp 2, dp 2
  const auto want = reference(4, layout);
  // Process 1 dies at step 3: every rank rolls back to step 2's snapshot.
  expect_same(with_failure(5, 1, layout, "1:3"), want);
}

// Every rank of the new epoch reports its recovery by part, and the CPU time (every
// thread's) that it cost the process: positive, and a small part of the run's timeout.
TEST(TrainGptSpares, EveryRankReportsItsRecoveryByPartWithItsCpuTime) {
  const CliResult r = run_with_failure(5, 1, {"--tp", "2"}, "2:3", {"--keep-connections"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::regex line(
      R"(logical rank (\d) of epoch 1, back at step \d: agreement ([\d.]+) s, groups ([\d.]+) s, )"
      R"(model ([\d.]+) s, state ([\d.]+) s, cpu ([\d.]+) s)");
  std::set<int> ranks;
  for (auto it = std::sregex_iterator(r.err.begin(), r.err.end(), line);
       it != std::sregex_iterator(); ++it) {
    ranks.insert(std::stoi((*it)[1]));
    const double cpu = std::stod((*it)[6]);
    EXPECT_GT(cpu, 0.0) << it->str();
    EXPECT_LT(cpu, 30.0) << it->str();
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3})) << r.err;
}

TEST(TrainGptSpares, RankZeroDiesAndItsSpareReportsTheRun) {
  const std::vector<std::string> layout{"--tp", "2"};
  expect_same(with_failure(5, 1, layout, "0:1"), reference(4, layout));
}

TEST(TrainGptSpares, RankZeroDiesAndOutputRank0FollowsTheSpareThatTookIt) {
  // --output rank0 shows logical rank 0's stdout alone: after process 0 dies, that is the
  // spare's (process 4), which reports the run; launch follows the epochs to know it.
  const std::vector<std::string> layout{"--tp", "2"};
  std::vector<std::string> train = layout;
  train.insert(train.end(), {"--steps", "6", "--format", "json", "--spares", "1",
                             "--snapshot-every", "2", "--fault-kill", "0:1"});
  const CliResult r = launch({"-n", "5", "--spares", "1", "--output", "rank0"}, train);
  EXPECT_EQ(r.code, 0) << r.err;
  expect_same(steps_of(r), reference(4, layout));
}

TEST(TrainGptSpares, TpPpDpAKilledStageIsReplaced) {
  const std::vector<std::string> layout{"--tp", "2", "--pp", "2", "--micro-batches", "2"};  // dp 2
  expect_same(with_failure(9, 1, layout, "5:2"), reference(8, layout));
}

TEST(TrainGptSpares, ASurvivorKilledDuringTheRecoveryIsReplacedByTheNextSpare) {
  // Process 1 dies at step 3; process 2, a survivor, dies in that recovery once the new
  // groups exist: a second epoch gives logical rank 2 to the second spare, and both states
  // come from their replicas (tp 2 x dp 2: logical ranks 3 and 0).
  const std::vector<std::string> layout{"--tp", "2"};
  expect_same(with_failure(6, 2, layout, "1:3,2:recovery"), reference_local(4, layout));
}

TEST(TrainGptSpares, ABuddyKilledDuringTheRecoveryLosesTheStateItHeld) {
  // tp 2 x pp 2 (dp 1): process 1 dies at step 3; its buddy, logical rank 2, dies in the
  // recovery before sending the copy: nobody else holds rank 1's state.
  expect_ends_saying(6, 2, {"--tp", "2", "--pp", "2", "--micro-batches", "2"}, "1:3,2:recovery",
                     "the state of logical rank 1 is lost: it and its buddy, logical rank 2, died");
}

TEST(TrainGptSpares, LosingEveryReplicaAtStepZeroGoesBackToTheInitialState) {
  // dp groups {0, 2} and {1, 3}: both of {0, 2} die at step 0. Nobody holds their state,
  // but at step 0 that is the initial state, which the spares' new models have.
  const std::vector<std::string> layout{"--tp", "2"};
  expect_same(with_failure(6, 2, layout, "0:0,2:0"), reference(4, layout));
}

TEST(TrainGptSpares, ARankLostBeforeTheFirstGroupsExistIsReplacedFromTheInitialState) {
  // Process 1 dies before the job's first groups exist: the others' first creation fails
  // before any model ran or any snapshot was taken. The recovery must not ask a model that
  // never started for its state (it did, and every survivor died of SIGSEGV), and the run
  // is the uninterrupted one.
  const std::vector<std::string> layout{"--tp", "2"};
  expect_same(with_failure(5, 1, layout, "1:start"), reference(4, layout));
}

TEST(TrainGptSpares, LosingEveryReplicaOfAStateEndsTheJobNamingTheRank) {
  // dp groups {0, 2} and {1, 3}: both of {0, 2} die at step 2; two spares take their
  // places, but nobody holds their state.
  expect_ends_saying(
      6, 2, {"--tp", "2"}, "0:2,2:2",
      "the state of logical rank 0 is lost: every replica in its data-parallel group died");
}

// A process and a step drawn at random (printed on failure, with the seed: set
// COMMGRID_TEST_SEED to draw the same again): any rank, at a step after the snapshot of
// step 2 was shipped (so that the state moves: a kill before it rolls back to step 0,
// whose state is a new Trainer's).
std::pair<int, int> random_kill(int world) {
  const char* fixed = std::getenv("COMMGRID_TEST_SEED");
  const unsigned seed =
      fixed != nullptr ? static_cast<unsigned>(std::stoul(fixed)) : std::random_device{}();
  std::cerr << "random kill: COMMGRID_TEST_SEED=" << seed << "\n";
  std::mt19937 gen(seed);
  return {std::uniform_int_distribution<int>(0, world - 1)(gen),
          std::uniform_int_distribution<int>(3, 5)(gen)};
}

std::string kill_text(std::pair<int, int> kill) {
  return std::to_string(kill.first) + ":" + std::to_string(kill.second);
}

// Buddy copies (no full replica): each rank ships its snapshot to logical rank r + 1 and
// the spare fetches the dead rank's state from there.
TEST(TrainGptSpares, BuddyCopiesDpOneTpPpARandomRankAtARandomStep) {
  const std::vector<std::string> layout{"--tp", "2", "--pp", "2", "--micro-batches", "2"};  // dp 1
  const auto kill = random_kill(4);
  SCOPED_TRACE("--fault-kill " + kill_text(kill));
  expect_same(with_failure(5, 1, layout, kill_text(kill)), reference_local(4, layout));
}

TEST(TrainGptSpares, BuddyCopiesDistributedOptimizerShards) {
  const std::vector<std::string> layout{"--tp", "2", "--dist-opt"};  // dp 2, Adam sharded over it
  expect_same(with_failure(5, 1, layout, "2:3"), reference_local(4, layout));
}

TEST(TrainGptSpares, BuddyCopiesMoeWithExpertsShardedOverEp) {
  const std::vector<std::string> layout{"--moe", "--ep", "2", "--pp", "2", "--micro-batches", "2"};
  expect_same(with_failure(5, 1, layout, "1:3"), reference_local(4, layout));
}

TEST(TrainGptSpares, BuddyCopiesCpAndInterleavedPipelineARandomRankAtARandomStep) {
  const std::vector<std::string> layout{"--cp", "2", "--pp", "2", "--vpp", "2", "--micro-batches",
                                        "2"};
  const auto kill = random_kill(4);
  SCOPED_TRACE("--fault-kill " + kill_text(kill));
  expect_same(with_failure(5, 1, layout, kill_text(kill)), reference_local(4, layout));
}

TEST(TrainGptSpares, BuddyCopiesTwoFailuresInARowOnAReplicaLayout) {
  // --state-from buddy on a layout that has replicas: rank 0 at step 1, then process 3 at
  // step 4 (its buddy, logical rank 0, is the first spare by then).
  const std::vector<std::string> layout{"--tp", "2"};
  expect_same(with_failure(6, 2, layout, "0:1,3:4", nullptr, nullptr, {"--state-from", "buddy"}),
              reference_local(4, layout));
}

TEST(TrainGptSpares, LosingARankAndItsBuddyEndsTheJobNamingTheRank) {
  // tp 2 x pp 2 (dp 1): logical rank 1's buddy is logical rank 2; both die at step 3.
  expect_ends_saying(6, 2, {"--tp", "2", "--pp", "2", "--micro-batches", "2"}, "1:3,2:3",
                     "the state of logical rank 1 is lost: it and its buddy, logical rank 2, died");
}

// Kept connections (--keep-connections): the same recoveries over one set of pairs made at
// the start, each epoch's world and groups views over them; only the pairs that held an
// unfinished operation are made anew. The losses are those of the uninterrupted run.
TEST(TrainGptSpares, KeptConnectionsTpDpARandomRankAtARandomStep) {
  const std::vector<std::string> layout{"--tp", "2"};
  const auto kill = random_kill(4);
  SCOPED_TRACE("--fault-kill " + kill_text(kill));
  expect_same(with_failure(5, 1, layout, kill_text(kill), nullptr, nullptr, {"--keep-connections"}),
              reference(4, layout));
}

TEST(TrainGptSpares, KeptConnectionsTpPpBuddyCopiesTwoFailuresInARow) {
  const std::vector<std::string> layout{"--tp", "2", "--pp", "2", "--micro-batches", "2"};  // dp 1
  expect_same(with_failure(6, 2, layout, "0:1,3:4", nullptr, nullptr, {"--keep-connections"}),
              reference_local(4, layout));
}

TEST(TrainGptSpares, KeptConnectionsShrinkWithoutSpares) {
  const std::vector<std::string> layout{"--tp", "2"};  // dp 2 -> 1
  expect_same(with_failure(4, 0, layout, "1:3", nullptr, nullptr, {"--keep-connections"}),
              reference_local(4, layout));
}

// A long run on kept connections without a failure stays in epoch 0: hundreds of
// collectives on each group (their tags past 2^8 and 2^16), none mistaken for another
// view's (a slot layout that let a tag reach the namespace's bits once failed an epoch
// every 256 collectives, silently recovered) and the losses those of connected groups.
TEST(TrainGptSpares, KeptConnectionsManyStepsWithoutAFailureStayInOneEpoch) {
  const std::vector<std::string> layout{"--tp",     "2",    "--steps",  "40",
                                        "--format", "json", "--spares", "0"};
  std::vector<std::string> kept = layout;
  kept.push_back("--keep-connections");
  const CliResult r = launch({"-n", "4", "--spares", "0", "--output", "rank0"}, kept);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["epochs"].size(), 1u) << j["epochs"].dump();
  const CliResult c =
      launch({"-n", "4", "--output", "rank0"}, {"--tp", "2", "--steps", "40", "--format", "json"});
  ASSERT_EQ(c.code, 0) << c.err;
  expect_same(steps_of(r), steps_of(c));
}

TEST(TrainGptSpares, KeepConnectionsWithoutSparesIsABadFlag) {
  const CliResult r =
      run_shell("timeout 60 " + shell_quote(COMMGRID_TRAIN_GPT) + " --keep-connections --steps 1");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--keep-connections"), std::string::npos) << r.err;
}

// Shrink: a failure that finds no spare goes on with fewer data-parallel replicas (the
// global batch kept: each replica takes more micro-batches), the state resharded.
TEST(TrainGptSpares, ShrinkWithoutSparesARandomRankAtARandomStep) {
  const std::vector<std::string> layout{"--tp", "2"};  // dp 2 -> 1
  const auto kill = random_kill(4);
  SCOPED_TRACE("--fault-kill " + kill_text(kill));
  expect_same(with_failure(4, 0, layout, kill_text(kill)), reference_local(4, layout));
}

TEST(TrainGptSpares, ShrinkReshardsTheDistributedOptimizer) {
  // dp 4, Adam's state in 4 shards; process 1 dies: 3 replicas survive, dp 2 (which divides
  // dp x micro-batches = 4) is kept, and the 2 new ranks take 2 old shards each.
  const std::vector<std::string> layout{"--dist-opt"};
  expect_same(with_failure(4, 0, layout, "1:3"), reference_local(4, layout));
}

TEST(TrainGptSpares, ShrinkMoeMovesExpertsAndReshardsBothOptimizers) {
  // tp 2 x dp 4, experts over ep 4 (expert-tp 1, expert-dp 2), both optimizers sharded;
  // rank 0 dies: dp 4 -> 2 keeps old ranks 2-5 as new ranks 0-3, whose ep coordinates
  // change (old 2, 3, 0, 1 -> new 0, 1, 2, 3): each takes its new experts from old ranks
  // that held them, and reshards dense and expert optimizer states.
  const std::vector<std::string> layout{
      "--moe", "--tp", "2", "--etp", "1", "--ep", "4", "--sequence-parallel", "--dist-opt"};
  expect_same(with_failure(8, 0, layout, "0:3"), reference_local(8, layout));
}

TEST(TrainGptSpares, TheSpareFirstThenShrinkAndTheReportIsOfTheLayoutThatFinished) {
  // Process 1 dies at step 1 and spare 4 takes its rank; process 4 dies at step 4: no spare
  // is left, so tp 2 x dp 2 shrinks to dp 1 (replica 1, logical ranks 2 and 3 on processes
  // 2 and 3, goes on alone with 2 micro-batches).
  const std::vector<std::string> layout{"--tp", "2"};
  const CliResult r = run_with_failure(5, 1, layout, "1:1,4:4");
  EXPECT_EQ(r.code, 0) << r.err;
  expect_same(steps_of(r), reference_local(4, layout));
  // The JSON reports the layout that finished and every epoch's layout and members.
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["config"]["world_size"], 2) << j["config"];
  EXPECT_EQ(j["config"]["dp"], 1) << j["config"];
  EXPECT_EQ(j["config"]["micro_batches"], 2) << j["config"];
  ASSERT_EQ(j["epochs"].size(), 3u) << j["epochs"];
  EXPECT_EQ(j["epochs"][0]["members"], nlohmann::json({0, 1, 2, 3})) << j["epochs"];
  EXPECT_EQ(j["epochs"][1]["members"], nlohmann::json({0, 4, 2, 3})) << j["epochs"];
  EXPECT_EQ(j["epochs"][1]["dead"], nlohmann::json({1})) << j["epochs"];
  EXPECT_EQ(j["epochs"][1]["world_size"], 4) << j["epochs"];
  EXPECT_EQ(j["epochs"][2]["members"], nlohmann::json({2, 3})) << j["epochs"];
  EXPECT_EQ(j["epochs"][2]["dead"], nlohmann::json({4})) << j["epochs"];
  EXPECT_EQ(j["epochs"][2]["world_size"], 2) << j["epochs"];
  EXPECT_EQ(j["epochs"][2]["dp"], 1) << j["epochs"];
  EXPECT_EQ(j["epochs"][2]["shrink"], true) << j["epochs"];
}

TEST(TrainGptSpares, TheTableAfterAShrinkShowsTheLayoutThatFinishedAndEveryEpoch) {
  // tp 2 x dp 2 without spares, process 1 dies at step 2: dp 1 (processes 2 and 3).
  const CliResult r = launch({"-n", "4", "--spares", "0", "--output", "raw"},
                             {"--tp", "2", "--steps", "4", "--spares", "0", "--snapshot-every", "2",
                              "--fault-kill", "1:2"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("world 2: tp 2, pp 1, cp 1, dp 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("in 2 micro-batches per dp rank"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("epochs:\n  0: world 4: tp 2, pp 1, cp 1, dp 2; processes 0,1,2,3; from "
                       "step 0\n  1: world 2: tp 2, pp 1, cp 1, dp 1; processes 2,3; dead 1 "
                       "(shrunk); from step 2\n"),
            std::string::npos)
      << r.out;
}

TEST(TrainGptSpares, AFailureAtTheFirstStepGoesBackToTheInitialState) {
  // Before any snapshot: process 2 dies at step 0 (tp 2 x pp 2, buddy copies), every rank
  // starts again from the initial state, the spare from a new Trainer's.
  const std::vector<std::string> layout{"--tp", "2", "--pp", "2", "--micro-batches", "2"};
  expect_same(with_failure(5, 1, layout, "2:0"), reference_local(4, layout));
}

TEST(TrainGptSpares, AFailureAfterAShrinkToOneReplicaTakesTheStateFromABuddy) {
  // tp 2 x dp 2 without spares: process 1 dies at step 1 (dp 2 -> 1: processes 2 and 3
  // hold the ranks, process 0 is a spare); process 2 dies at step 4: process 0 takes its
  // rank, and with no replica left its state comes from buddy copies, shipped since the
  // shrink.
  const std::vector<std::string> layout{"--tp", "2"};
  expect_same(with_failure(4, 0, layout, "1:1,2:4"), reference_local(4, layout));
}

TEST(TrainGptSpares, ARestartedProcessTakesARankOfTheShrunkLayout) {
  // --max-restarts 1 without spares: process 0 dies at step 1 (dp 2 -> 1) and comes back
  // as a spare, replaying the shrink it missed; process 2 dies at step 4 and the restarted
  // process 0, the lowest spare, takes its rank in the shrunk layout.
  const std::vector<std::string> layout{"--tp", "2"};
  const CliResult r = run_with_failure(4, 0, layout, "0:1,2:4", {}, {"--max-restarts", "1"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("train_gpt: process 0 is logical rank 0 of epoch"), std::string::npos)
      << r.err;
  expect_same(steps_of(r), reference_local(4, layout));
}

TEST(TrainGptSpares, NoSmallerLayoutEndsTheJobSayingWhy) {
  // tp 2 x pp 2 has one replica: losing a rank leaves no layout to shrink to.
  expect_ends_saying(
      4, 0, {"--tp", "2", "--pp", "2", "--micro-batches", "2"}, "1:3",
      "cannot go on without a spare: cannot shrink after logical rank [1] failed: every one "
      "of the 1 data-parallel replicas lost a rank");
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(TrainGptSpares, WhenNoRecoveryIsPossibleTheJobSaysWhyOnce) {
  // No spare and --no-shrink: process 1's death cannot be recovered from. Every process
  // ends with the same reason; the job says it once, and launch does not note each
  // process's end as one the job goes on without.
  const CliResult r = run_with_failure(4, 0, {"--tp", "2"}, "1:2", {"--no-shrink"});
  EXPECT_EQ(r.code, 1) << r.err;
  const std::string reason =
      "recovery: cannot go on without a spare: no spare left for logical rank [1] (0 spares for "
      "1 failed rank)";
  EXPECT_EQ(count(r.err, reason), 1u) << r.err;
  EXPECT_NE(
      r.err.find("error: " + reason + " (after process 1 (rank 1) killed by signal 9 (SIGKILL))"),
      std::string::npos)
      << r.err;
  // Only the first death, when the job could still go on, says so.
  EXPECT_LE(count(r.err, "the job goes on"), 1u) << r.err;
}

TEST(TrainGptSpares, AStateProviderThatFailsEndsTheJobWithItsMessage) {
  // Process 1's state provider throws when it saves the snapshot of step 2, then process
  // 2's when a recovery loads its snapshot: each ends the job on every process (a spare
  // included) with the provider's message and the process, at once and not at a timeout.
  int code = 0;
  std::string err;
  (void)with_failure(5, 1, {"--tp", "2"}, "1:5", &code, &err, {"--fault-state", "1:save:2"});
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(err.find("error: process 1 (logical rank 1): the state provider's save failed at step "
                     "2: test fault: save refused (--fault-state)"),
            std::string::npos)
      << err;
  (void)with_failure(5, 1, {"--tp", "2"}, "1:3", &code, &err, {"--fault-state", "2:load"});
  EXPECT_EQ(code, 1) << err;
  EXPECT_NE(
      err.find("error: process 2 (logical rank 2): the state provider's load failed at step "),
      std::string::npos)
      << err;
}

TEST(TrainGptSpares, ASnapshotBeyondTheMemoryAllowedIsAnErrorNamingTheSizes) {
  int code = 0;
  std::string err;
  (void)with_failure(5, 1, {"--tp", "2"}, "1:5", &code, &err, {"--snapshot-memory-limit", "1000"});
  EXPECT_EQ(code, 1) << err;
  const std::regex re(
      "error: process [0-9] \\(logical rank [0-9]\\): the snapshot of step 0 is [0-9.]+ [KM]iB; "
      "keeping 2 snapshots takes [0-9.]+ [KM]iB, more than the 1000 bytes allowed");
  EXPECT_TRUE(std::regex_search(err, re)) << err;
}

TEST(TrainGptSpares, BadInputExitsTwo) {
  // Replicas asked for on a layout without them, a bad --state-from, and --spares without
  // launch --spares.
  const CliResult no_replica = launch({"-n", "3", "--spares", "1"},
                                      {"--tp", "2", "--spares", "1", "--state-from", "replica"});
  EXPECT_EQ(no_replica.code, 2) << no_replica.err;
  EXPECT_NE(no_replica.err.find("--state-from replica: dp 1 (no data-parallel replica)"),
            std::string::npos)
      << no_replica.err;
  const CliResult bad_source =
      launch({"-n", "5", "--spares", "1"}, {"--tp", "2", "--spares", "1", "--state-from", "disk"});
  EXPECT_EQ(bad_source.code, 2) << bad_source.err;
  EXPECT_NE(bad_source.err.find("state_from: expected auto, replica or buddy, got \"disk\""),
            std::string::npos)
      << bad_source.err;
  const CliResult no_launch = run_shell(shell_quote(COMMGRID_TRAIN_GPT) + " --spares 1 --local 2");
  EXPECT_EQ(no_launch.code, 2) << no_launch.err;
}

}  // namespace
}  // namespace commgrid::test
