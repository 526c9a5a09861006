// `commgrid plan` end to end: outputs, and every kind of bad input (exit 2, one line on
// stderr that starts with "error: " and names the parameter, nothing on stdout).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_runner.hpp"

namespace commgrid::test {
namespace {

CliResult plan(std::vector<std::string> args) {
  args.insert(args.begin(), "plan");
  return run_cli(COMMGRID_EXE, args);
}

TEST(PlanCli, JsonWholeLayout) {
  const CliResult r = plan({"--world-size", "16", "--tp", "2", "--pp", "2", "--cp", "2",
                            "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["config"]["dp"], 2);
  EXPECT_EQ(j["config"]["expert_dp"], 4);
  EXPECT_TRUE(j["config"]["vpp"].is_null());
  EXPECT_EQ(j["groups"]["mp"], nlohmann::json::parse("[[0,1,8,9],[2,3,10,11],[4,5,12,13],[6,7,14,15]]"));
  EXPECT_FALSE(j["groups"].contains("hcp"));
  EXPECT_FALSE(j["groups"].contains("inter_dist_opt"));
  EXPECT_EQ(j["groups"].size(), 19u);
}

TEST(PlanCli, JsonOneRankAndKinds) {
  const CliResult r = plan({"--world-size", "16", "--tp", "2", "--pp", "2", "--cp", "2",
                            "--format", "json", "--rank", "13", "--kinds", "pos_embd,tp,hcp"
                            "", "--hcp", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::ordered_json::parse(r.out);
  EXPECT_EQ(j["rank"], 13);
  // Reference order whatever the request's order; null where the rank is in no group.
  EXPECT_EQ(j["groups"].dump(), R"({"hcp":[[13,15]],"tp":[12,13],"pos_embd":null})");
}

TEST(PlanCli, MegatronLongNamesAreAliases) {
  const CliResult a = plan({"--world-size", "16", "--tensor-model-parallel-size", "2",
                            "--pipeline-model-parallel-size", "2", "--context-parallel-size", "2",
                            "--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1",
                            "--num-distributed-optimizer-instances", "2",
                            "--virtual-pipeline-model-parallel-size", "3",
                            "--hierarchical-context-parallel-sizes", "2", "--format", "json"});
  const CliResult b = plan({"--world-size", "16", "--tp", "2", "--pp", "2", "--cp", "2",
                            "--ep", "2", "--etp", "1", "--dist-opt-instances", "2", "--vpp", "3",
                            "--hcp", "2", "--format", "json"});
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(nlohmann::json::parse(a.out)["config"]["vpp"], 3);
}

TEST(PlanCli, TableShowsConfigSummaryAndEveryRank) {
  const CliResult r = plan({"--world-size", "8", "--tp", "2", "--pp", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("dense grid:  tp 2 x cp 1 x dp 2 x pp 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("intra_dist_opt         1       8  [0,1,4,5,2,3,6,7]"), std::string::npos)
      << r.out;
  // One row per rank in the per-rank table.
  std::size_t rows = 0;
  std::istringstream lines(r.out.substr(r.out.find("per rank")));
  for (std::string line; std::getline(lines, line);)
    if (line.find(" |") != std::string::npos) ++rows;
  EXPECT_EQ(rows, 9u);  // header + 8 ranks
}

TEST(PlanCli, TableForOneRank) {
  const CliResult r = plan({"--world-size", "16", "--tp", "2", "--pp", "2", "--cp", "2", "--rank", "13"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("rank 13: tp 1, cp 0, dp 1, pp 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(not a member)"), std::string::npos);
}

TEST(PlanCli, HelpExitsZero) {
  const CliResult r = run_cli(COMMGRID_EXE, {"plan", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--tensor-model-parallel-size"), std::string::npos);
}

struct BadInput {
  std::vector<std::string> args;
  std::string must_contain;  // the parameter and/or values the message names
};

void PrintTo(const BadInput& b, std::ostream* os) {
  for (const auto& a : b.args) *os << "'" << a << "' ";
}

class PlanBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(PlanBadInput, ExitTwoWithOneLineError) {
  std::vector<std::string> args = GetParam().args;
  const CliResult r = run_cli(COMMGRID_EXE, args);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.out, "") << "partial output on bad input";
  ASSERT_GE(r.err.size(), 8u);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(GetParam().must_contain), std::string::npos) << r.err;
}

const std::vector<std::string> kW8 = {"plan", "--world-size", "8"};
std::vector<std::string> w8(std::vector<std::string> more) {
  std::vector<std::string> a = kW8;
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PlanBadInput,
    ::testing::Values(
        BadInput{{}, "subcommand"},
        BadInput{{"frobnicate"}, "unknown command \"frobnicate\""},
        BadInput{{"plan"}, "--world-size is required"},
        BadInput{w8({"--foo", "1"}), "--foo"},
        BadInput{w8({"--tp"}), "--tp"},
        BadInput{w8({"--tp", "abc"}), "tp: expected an integer, got \"abc\""},
        BadInput{w8({"--tp", "2.5"}), "\"2.5\""},
        BadInput{w8({"--tp", "-2"}), "tp must be >= 1, got -2"},
        BadInput{w8({"--pp", "0"}), "pp must be >= 1, got 0"},
        BadInput{w8({"--cp", "1e3"}), "\"1e3\""},
        BadInput{w8({"--ep", ""}), "ep"},  // "ep: expected an integer" or "--ep needs a value"
        BadInput{{"plan", "--world-size", "99999999999999999999"}, "world_size"},
        BadInput{{"plan", "--world-size", "3000000000"}, "exceeds 2147483647"},
        BadInput{{"plan", "--world-size", "0"}, "world_size must be >= 1, got 0"},
        BadInput{w8({"--kinds", "tp,foo"}), "unknown group kind \"foo\""},
        BadInput{w8({"--kinds", "hcp"}), "hcp"},
        BadInput{w8({"--kinds", "inter_dist_opt"}), "dist_opt_instances = 1"},
        BadInput{w8({"--format", "xml"}), "format"},
        BadInput{w8({"--rank", "8"}), "rank 8 out of range [0, 8)"},
        BadInput{w8({"--rank", "-1"}), "rank -1 out of range"},
        BadInput{w8({"--rank", "x"}), "rank: expected an integer"},
        BadInput{w8({"--order", ""}), "empty"},
        BadInput{w8({"--order", "tp-xx-dp"}), "unknown token \"xx\""},
        BadInput{w8({"--order", "tp-dp-tp"}), "appears twice"},
        BadInput{w8({"--tp", "3"}), "world_size 8 is not divisible by tp*pp*cp = 3*1*1 = 3"},
        BadInput{w8({"--vpp", "2"}), "vpp = 2 requires pp > 1, got pp = 1"},
        BadInput{w8({"--tp", "1", "--ep", "16"}), "etp*ep*pp = 1*16*1 = 16"},
        BadInput{w8({"--tp", "2", "--pp", "2", "--ep", "2", "--order", "tp-cp-pp-ep-dp"}),
                 "does not end with pp"},
        BadInput{w8({"--tp", "2", "--pp", "2", "--dist-opt-instances", "3"}),
                 "dist_opt_instances = 3 must divide dp*cp = 2*1 = 2"},
        BadInput{w8({"--tp", "1", "--ep", "8", "--dist-opt-instances", "2"}),
                 "must divide expert_dp"},
        BadInput{w8({"--cp", "4", "--hcp", "2,4"}), "hcp sizes [2,4] multiply to 8, but cp = 4"},
        BadInput{w8({"--cp", "4", "--hcp", "2,,2"}), "hcp[1]"},
        BadInput{w8({"--cp", "4", "--hcp", "2,-2"}), "hcp[1] must be >= 1, got -2"},
        BadInput{w8({"--tp", "2", "--ep", "2", "--order", "tp-cp-dp-pp"}), "omits \"ep\""},
        BadInput{w8({"--tp", "2", "--pp", "2", "--ep", "2", "--etp", "1", "--order", "tp-pp-ep-dp"}),
                 "pipeline groups differ"},
        BadInput{{"plan", "--world-size", "4096", "--tp", "65536", "--pp", "65536"},
                 "tp*pp*cp exceeds world_size 4096"}));

}  // namespace
}  // namespace commgrid::test
