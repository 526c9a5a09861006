// The train_gpt program: output formats, bad input (exit 2), and runs under mpirun and
// `commgrid launch` that give the losses of one rank.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.hpp"

namespace {

using commgrid::test::CliResult;
using commgrid::test::run_cli;
using commgrid::test::run_shell;
using commgrid::test::shell_quote;
using nlohmann::json;

const std::string kTrainGpt = TRAIN_GPT_EXE;
const std::string kCommgrid = COMMGRID_EXE;
const std::string kMpiexec = TRAIN_GPT_MPIEXEC;  // empty without MPI

std::string describe(const CliResult& r) {
  return "exit " + std::to_string(r.code) + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

// The program's stdout without the "[rank 0] " that `commgrid launch` puts before each line.
std::string without_rank_prefix(const std::string& out) {
  const std::string prefix = "[rank 0] ";
  std::string s;
  std::size_t at = 0;
  while (at < out.size()) {
    std::size_t end = out.find('\n', at);
    if (end == std::string::npos) end = out.size();
    std::string line = out.substr(at, end - at);
    if (line.rfind(prefix, 0) == 0) line.erase(0, prefix.size());
    s += line + "\n";
    at = end + 1;
  }
  return s;
}

json parse_json(const CliResult& r) {
  json j = json::parse(without_rank_prefix(r.out), nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << describe(r);
  return j;
}

const json& one_rank() {
  static const json j = [] {
    const CliResult r = run_cli(kTrainGpt, {"--local", "1", "--format", "json"});
    EXPECT_EQ(r.code, 0) << describe(r);
    return parse_json(r);
  }();
  return j;
}

// Every step's loss and gradient norm within 1e-9 relative of one rank's.
void expect_matches_one_rank(const CliResult& r) {
  ASSERT_EQ(r.code, 0) << describe(r);
  const json got = parse_json(r);
  const json& ref = one_rank();
  ASSERT_EQ(got["steps"].size(), 10u) << r.out;
  ASSERT_EQ(ref["steps"].size(), 10u);
  for (std::size_t i = 0; i < 10; ++i)
    for (const char* key : {"loss", "grad_norm"}) {
      const double a = got["steps"][i][key].get<double>();
      const double b = ref["steps"][i][key].get<double>();
      EXPECT_LE(std::abs(a - b), 1e-9 * std::abs(b))
          << "step " << i + 1 << " " << key << ": " << a << ", one rank " << b;
    }
  EXPECT_LT(got["steps"][9]["loss"].get<double>(), got["steps"][0]["loss"].get<double>());
}

std::string mpirun(int np, const std::vector<std::string>& args) {
  std::string cmd =
      "timeout 170 " + kMpiexec + " -np " + std::to_string(np) + " " + shell_quote(kTrainGpt);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  return cmd;
}

TEST(TrainGptCli, JsonHasConfigAndEveryStep) {
  const CliResult r =
      run_cli(kTrainGpt, {"--local", "2", "--tp", "2", "--steps", "3", "--format", "json"});
  ASSERT_EQ(r.code, 0) << describe(r);
  const json j = parse_json(r);
  EXPECT_EQ(j["config"]["world_size"], 2);
  EXPECT_EQ(j["config"]["tp"], 2);
  EXPECT_EQ(j["config"]["dp"], 1);
  EXPECT_EQ(j["config"]["layers"], 4);
  ASSERT_EQ(j["steps"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["steps"][i]["step"], i + 1);
    EXPECT_TRUE(std::isfinite(j["steps"][i]["loss"].get<double>()));
    EXPECT_GT(j["steps"][i]["grad_norm"].get<double>(), 0.0);
  }
}

TEST(TrainGptCli, TablePrintsEveryStep) {
  const CliResult r = run_cli(kTrainGpt, {"--local", "2", "--pp", "2", "--steps", "2"});
  ASSERT_EQ(r.code, 0) << describe(r);
  EXPECT_NE(r.out.find("world 2: tp 1, pp 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step              loss         grad_norm\n   1    4.15"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\n   2    4."), std::string::npos) << r.out;
}

TEST(TrainGptCli, HelpNamesTheProgramAndShowsHowToSeeARecovery) {
  const CliResult r = run_cli(kTrainGpt, {"--help"});
  ASSERT_EQ(r.code, 0) << describe(r);
  // The installed program's name, never the CMake target's (which the build folder's path,
  // in the usage line, still holds).
  EXPECT_EQ(r.out.find(" train_gpt "), std::string::npos) << r.out;
  EXPECT_NE(r.out.rfind("train_gpt:", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("commgrid-train-gpt: a small float64 GPT"), std::string::npos) << r.out;
  // --fault-kill is documented: the way to see a recovery in one command.
  EXPECT_NE(r.out.find("--fault-kill"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("commgrid launch -n 5 --spares 1 -- commgrid-train-gpt --tp 2 --spares 1 "
                       "--fault-kill 1:3"),
            std::string::npos)
      << r.out;
}

TEST(TrainGptCli, InvalidCombinationsExit2) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--local", "4", "--pp", "4", "--layers", "2"},
       "error: layers 2 is not divisible by pp(4) x vpp(1) = 4"},
      {{"--local", "4", "--pp", "2", "--vpp", "3"},
       "error: layers 4 is not divisible by pp(2) x vpp(3) = 6"},
      {{"--local", "2", "--tp", "2", "--heads", "3", "--hidden", "33"},
       "error: heads 3 is not divisible by tp 2"},
      {{"--local", "2", "--cp", "2", "--seq", "30"},
       "error: seq 30 is not divisible by 2 x cp = 4"},
      {{"--local", "4", "--tp", "4", "--seq", "6", "--sequence-parallel"},
       "error: seq / cp = 6 is not divisible by tp 4"},
      {{"--local", "2", "--micro-batches", "3"},
       "error: global_batch 8 is not divisible by dp(2) x micro_batches(3) = 6"},
      {{"--local", "4", "--pp", "2", "--vpp", "2", "--micro-batches", "1"},
       "error: micro_batches 1 is not divisible by pp 2"},
      {{"--local", "2", "--dist-opt-instances", "2"},
       "error: dist_opt_instances 2 needs the distributed optimizer"},
      {{"--local", "4", "--tp", "3"}, "error: world_size 4 is not divisible by tp*pp*cp"},
      {{"--local", "2", "--backend", "nccl"}, "error: backend: expected gloo or mpi"},
      {{"--local", "2", "--format", "xml"}, "error: format: expected table or json"},
      {{"--local", "2", "--steps", "0"}, "error: steps must be >= 1"},
      {{"--local", "2", "--lr", "fast"}, "error: lr: expected a number"},
      {{"--local", "2", "--no-such-flag"}, "error: "},
  };
  for (const auto& [args, expected] : cases) {
    const CliResult r = run_cli(kTrainGpt, args);
    EXPECT_EQ(r.code, 2) << describe(r);
    EXPECT_EQ(r.err.rfind(expected, 0), 0u)
        << "expected stderr to start with \"" << expected << "\"\n"
        << describe(r);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(TrainGptCli, MpirunTpPpSequenceParallelMatchesOneRank) {
  if (kMpiexec.empty()) GTEST_SKIP() << "this build has no MPI backend";
  expect_matches_one_rank(run_shell(mpirun(4, {"--tp", "2", "--pp", "2", "--sequence-parallel",
                                               "--micro-batches", "2", "--format", "json"})));
}

TEST(TrainGptCli, MpirunCpDistOptMatchesOneRank) {
  if (kMpiexec.empty()) GTEST_SKIP() << "this build has no MPI backend";
  expect_matches_one_rank(run_shell(mpirun(4, {"--cp", "2", "--dist-opt", "--format", "json"})));
}

TEST(TrainGptCli, MpirunBadInputExits2) {
  if (kMpiexec.empty()) GTEST_SKIP() << "this build has no MPI backend";
  const CliResult r = run_shell(mpirun(2, {"--pp", "2", "--layers", "3"}));
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_NE(r.err.find("error: layers 3 is not divisible by pp(2) x vpp(1) = 2"), std::string::npos)
      << describe(r);
}

TEST(TrainGptCli, LaunchInterleavedPipelineMatchesOneRank) {
  const CliResult r = run_cli(kCommgrid,
                              {"launch", "-n", "4", "--", kTrainGpt, "--pp", "2", "--vpp", "2",
                               "--cp", "2", "--micro-batches", "2", "--format", "json"},
                              170);
  expect_matches_one_rank(r);
}

TEST(TrainGptCli, LaunchDistOptTwoInstancesMatchesOneRank) {
  const CliResult r = run_cli(kCommgrid,
                              {"launch", "-n", "4", "--", kTrainGpt, "--dist-opt",
                               "--dist-opt-instances", "2", "--format", "json"},
                              170);
  expect_matches_one_rank(r);
}

}  // namespace

// MoE (issue 11) under mpirun: ep 2 over 4 processes with the all-to-all dispatcher, cp 2
// (token counts over tp_cp) and dist-opt, equal to one rank's MoE run, aux loss included.
const std::vector<std::string> kMoeModel = {
    "--moe", "--vocab",  "32", "--hidden",         "16",  "--heads",  "2",   "--seq",
    "16",    "--layers", "2",  "--aux-loss-coeff", "0.1", "--format", "json"};

std::vector<std::string> with_moe(std::vector<std::string> args) {
  args.insert(args.end(), kMoeModel.begin(), kMoeModel.end());
  return args;
}

TEST(TrainGptCli, MpirunMoeMatchesOneRank) {
  if (kMpiexec.empty()) GTEST_SKIP() << "this build has no MPI backend";
  const CliResult ref_run = run_cli(kTrainGpt, with_moe({"--local", "1"}));
  ASSERT_EQ(ref_run.code, 0) << describe(ref_run);
  const json ref = parse_json(ref_run);
  const CliResult r = run_shell(mpirun(4, with_moe({"--ep", "2", "--cp", "2", "--dist-opt"})));
  ASSERT_EQ(r.code, 0) << describe(r);
  const json got = parse_json(r);
  ASSERT_EQ(got["steps"].size(), 10u) << r.out;
  ASSERT_EQ(ref["steps"].size(), 10u);
  for (std::size_t i = 0; i < 10; ++i)
    for (const char* key : {"loss", "grad_norm", "aux_loss"}) {
      const double a = got["steps"][i][key].get<double>();
      const double b = ref["steps"][i][key].get<double>();
      EXPECT_LE(std::abs(a - b), 1e-9 * std::abs(b))
          << "step " << i + 1 << " " << key << ": " << a << ", one rank " << b;
    }
  EXPECT_GT(ref["steps"][0]["aux_loss"].get<double>(), 0.0);
}

TEST(TrainGptCli, MoeInvalidCombinationsExit2) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--local", "4", "--tp", "2", "--ep", "2", "--etp", "1", "--moe"},  // tp without SP
           {"--local", "4", "--ep", "4", "--experts", "6", "--moe"},
           {"--local", "1", "--moe", "--topk", "5"},
           {"--local", "1", "--moe", "--dispatcher", "ring"}}) {
    const CliResult r = run_cli(kTrainGpt, args);
    EXPECT_EQ(r.code, 2) << describe(r);
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << describe(r);
  }
}
