// `commgrid plan` at scale: member lists as ranges, the node and layer columns, bounded
// output (refused up front, nothing printed), worlds of 2^31 - 1 ranks, integer flags
// shown as INT, and the topology advice of the issue's 4,096-GPU job through the command.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_runner.hpp"

namespace commgrid::test {
namespace {

CliResult plan(std::vector<std::string> args, int limit_s = 60) {
  args.insert(args.begin(), "plan");
  return run_cli(COMMGRID_EXE, args, limit_s);
}

// The issue's job: 4,096 GPUs, tp 8, pp 16, cp 2, ep 8, etp 1, vpp 4.
std::vector<std::string> job(std::vector<std::string> more = {}) {
  std::vector<std::string> a = {"--world-size", "4096", "--tp",  "8", "--pp",  "16", "--cp", "2",
                                "--ep",         "8",    "--etp", "1", "--vpp", "4"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

std::size_t longest_line(const std::string& text) {
  std::size_t most = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) most = std::max(most, line.size());
  return most;
}

std::string line_with(const std::string& text, const std::string& start) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(start, 0) == 0) return line;
  return "";
}

TEST(PlanScale, TableListsGroupsAsRanges) {
  const CliResult r = plan(job());
  ASSERT_EQ(r.code, 0) << r.err;
  // Whole 4,096-member groups no longer fill a line each.
  EXPECT_LT(longest_line(r.out), 400u);
  EXPECT_NE(line_with(r.out, "tp ").find("[0-7] [8-15] [16-23] [24-31] ..."), std::string::npos)
      << line_with(r.out, "tp ");
  EXPECT_NE(line_with(r.out, "pp ").find("[0:4096:256] (16 ranks)"), std::string::npos)
      << line_with(r.out, "pp ");
  EXPECT_NE(line_with(r.out, "intra_dist_opt").find("(4096 ranks)"), std::string::npos);
}

TEST(PlanScale, RankViewWithNodesAndLayers) {
  const CliResult r = plan(job({"--rank", "3000", "--gpus-per-node", "8", "--num-layers", "64"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("node 375, local device 0 (8 GPUs per node)"), std::string::npos) << r.out;
  // Megatron's interleaved assignment: pipeline rank 11 of 16, 64 layers, 4 virtual
  // stages of one layer each at v * 16 + 11.
  EXPECT_NE(r.out.find("layers: virtual stage 0: 11, virtual stage 1: 27, virtual stage 2: 43, "
                       "virtual stage 3: 59 (pipeline rank 11 of 16)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(line_with(r.out, "tp "),
            "tp                   375       0     8  [3000-3007]; node 375");
  // The 4,096-member intra_dist_opt group as ranges, not a 19 KB list.
  const std::string ido = line_with(r.out, "intra_dist_opt");
  EXPECT_LT(ido.size(), 200u) << ido;
  EXPECT_NE(ido.find("(4096 ranks); nodes [0-511] (512 nodes)"), std::string::npos) << ido;
  EXPECT_NE(line_with(r.out, "pp ").find("[184:4280:256] (16 ranks); nodes [23:535:32] (16 nodes)"),
            std::string::npos)
      << line_with(r.out, "pp ");
}

TEST(PlanScale, JsonKeepsFullListsAndAddsLayersAndNode) {
  const CliResult r = plan(job({"--rank", "3000", "--gpus-per-node", "8", "--num-layers", "64",
                                "--format", "json", "--kinds", "pp,intra_dist_opt"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["groups"]["intra_dist_opt"].size(), 4096u);
  EXPECT_EQ(j["groups"]["pp"][0], 184);
  EXPECT_EQ(j["node"], 375);
  EXPECT_EQ(j["local_device"], 0);
  EXPECT_EQ(j["layers"], nlohmann::json::parse("[[11,11],[27,27],[43,43],[59,59]]"));
  // Without a rank: per pipeline rank, per virtual stage.
  const CliResult all = plan({"--world-size", "8", "--pp", "4", "--vpp", "2", "--num-layers", "16",
                              "--format", "json", "--kinds", "pp"});
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_EQ(
      nlohmann::json::parse(all.out)["layers"],
      nlohmann::json::parse("[[[0,1],[8,9]],[[2,3],[10,11]],[[4,5],[12,13]],[[6,7],[14,15]]]"));
}

TEST(PlanScale, LayersWithoutVirtualPipeline) {
  const CliResult r = plan({"--world-size", "8", "--pp", "4", "--num-layers", "12"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("layers: 12 over pp 4, 3 layers per pipeline rank"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("        3     9-11"), std::string::npos) << r.out;
}

struct Refusal {
  std::vector<std::string> args;
  std::string must_contain;
};

class PlanRefuses : public ::testing::TestWithParam<Refusal> {};

// Bad or oversized requests: exit 2, one error line, and nothing on stdout before it.
TEST_P(PlanRefuses, ExitTwoNothingPrinted) {
  const CliResult r = plan(GetParam().args);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(GetParam().must_contain), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 30.0) << "refusing took " << r.seconds << " s";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PlanRefuses,
    ::testing::Values(
        Refusal{{"--world-size", "2147483647"}, "would be up to"},
        Refusal{{"--world-size", "2147483647"}, "--rank R"},
        Refusal{{"--world-size", "2147483647", "--format", "json"}, "--max-output-mib"},
        Refusal{{"--world-size", "2147483647", "--format", "json", "--kinds", "tp"}, "GiB"},
        Refusal{{"--world-size", "65536", "--format", "json", "--max-output-mib", "1"},
                "over the 1.0 MiB limit"},
        Refusal{{"--world-size", "8", "--pp", "2", "--vpp", "2147483648"},
                "vpp = 2147483648 exceeds 2147483647"},
        Refusal{{"--world-size", "64", "--pp", "16", "--num-layers", "30"},
                "num_layers = 30 is not divisible by pp = 16"},
        Refusal{{"--world-size", "64", "--pp", "4", "--vpp", "3", "--num-layers", "32"},
                "8 layers per pipeline rank, not divisible by vpp = 3"},
        Refusal{{"--world-size", "64", "--num-layers", "0"}, "num_layers must be >= 1"},
        Refusal{{"--world-size", "1048576", "--format", "svg"}, "--nodes A-B"},
        Refusal{{"--world-size", "64", "--max-output-mib", "-1"}, "max_output_mib must be >= 0"}));

// A refused document leaves no file behind: --output is opened only after every check.
TEST(PlanScale, RefusalCreatesNoFile) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("commgrid-refused-" + std::to_string(::getpid()) + ".json");
  std::filesystem::remove(path);
  const CliResult r =
      plan({"--world-size", "2147483647", "--format", "json", "--output", path.string()});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path)) << path;
  const CliResult bad =
      plan({"--world-size", "64", "--pp", "16", "--num-layers", "30", "--output", path.string()});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(path)) << path;
}

// The limit is a flag: 0 lifts it.
TEST(PlanScale, LimitCanBeLifted) {
  const CliResult r = plan(
      {"--world-size", "65536", "--format", "json", "--max-output-mib", "0", "--kinds", "tp,dp"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["groups"]["tp"].size(), 65536u);
  EXPECT_EQ(j["groups"]["dp"][0].size(), 65536u);
}

// One rank of the largest world, table and JSON, answers at once without memory for it.
TEST(PlanScale, OneRankOfTheLargestWorld) {
  const CliResult t = plan({"--world-size", "2147483647", "--rank", "2147483646", "--kinds",
                            "tp,pp,mp", "--gpus-per-node", "8"});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("node 268435455, local device 6"), std::string::npos) << t.out;
  EXPECT_EQ(line_with(t.out, "tp "),
            "tp                2147483646           0           1  [2147483646]; node 268435455");
  // Groups of 2^24 members (and their nodes) are streamed, not held.
  const CliResult d = plan({"--world-size", "16777216", "--rank", "16777215", "--kinds",
                            "dp,intra_dist_opt", "--gpus-per-node", "8"});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(line_with(d.out, "dp ")
                .find("[0-16777215] (16777216 ranks); nodes [0-2097151] (2097152 nodes)"),
            std::string::npos)
      << d.out;
  EXPECT_NE(line_with(d.out, "intra_dist_opt").find("16777215  16777216  [0-16777215]"),
            std::string::npos)
      << d.out;
  const CliResult j =
      plan({"--world-size", "2147483647", "--rank", "5", "--kinds", "tp", "--format", "json"});
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_EQ(j.out, "{\"rank\":5,\"groups\":{\"tp\":[5]}}\n");
}

// The issue's loop through the command: default order warns about cp without an order
// (and --strict passes: nothing could be avoided); cp first warns about tp with the default
// order, and --strict fails.
TEST(PlanScale, TopologyAdviceConverges) {
  const CliResult d = plan(job({"--check-topology", "--strict", "--kinds", "tp,cp"}));
  EXPECT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.err.find(
                "tp\u00b7cp = 16 > 8 GPUs per node: cp groups must cross nodes; keeping tp inside"),
            std::string::npos)
      << d.err;
  const CliResult c =
      plan(job({"--order", "cp-tp-ep-dp-pp", "--check-topology", "--strict", "--kinds", "tp"}));
  EXPECT_EQ(c.code, 3) << c.err;
  EXPECT_NE(c.err.find("order \"tp-cp-ep-dp-pp\" keeps them inside; cp groups then cross"),
            std::string::npos)
      << c.err;
  const CliResult j = plan(
      job({"--order", "cp-tp-ep-dp-pp", "--check-topology", "--format", "json", "--kinds", "tp"}));
  ASSERT_EQ(j.code, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["best_order"], "tp-cp-ep-dp-pp");
  EXPECT_EQ(doc["warnings"][0]["avoidable"], true);
}

// Memory stays small at any world: 2^22 ranks as JSON (about 600 MB of text) and the
// topology check, each under a 300 MB address-space limit (a list per kind alone would
// need 32 MiB, the old JSON tree about 4 GB).
TEST(PlanScale, MemoryStaysSmall) {
#if defined(COMMGRID_TEST_UNDER_ASAN)
  GTEST_SKIP()
      << "AddressSanitizer reserves terabytes of address space, so ulimit -v cannot bound it";
#else
  const std::string exe = shell_quote(COMMGRID_EXE);
  const std::string w = " plan --world-size 4194304 --tp 8 --pp 8 --cp 2 --ep 8 --etp 1";
  const CliResult j = run_shell("ulimit -v 300000; " + exe + w + " --format json | wc -c");
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_GT(std::stoll(j.out), 500000000LL) << j.out;
  const CliResult t = run_shell("ulimit -v 300000; " + exe + w + " --check-topology");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("intra_dist_opt"), std::string::npos) << t.out;
  EXPECT_NE(t.err.find("warning: cp groups cross nodes"), std::string::npos) << t.err;
#endif
}

// The topology check of the largest world answers (no bad_alloc, nothing printed first).
TEST(PlanScale, TopologyOfTheLargestWorld) {
  const CliResult r = plan({"--world-size", "2147483647", "--check-topology", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["nodes"], 268435456);
  bool dp_seen = false;
  for (const auto& k : j["kinds"])
    if (k["kind"] == "dp") {
      dp_seen = true;
      EXPECT_EQ(k["max_nodes_spanned"], 268435456);
    }
  EXPECT_TRUE(dp_seen);
  EXPECT_LT(r.seconds, 60.0) << "not O(1) per kind";
}

TEST(PlanScale, HelpShowsIntegerFlagsAsInt) {
  const CliResult r = run_cli(COMMGRID_EXE, {"plan", "--help"});
  ASSERT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--world-size INT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--num-layers INT"), std::string::npos);
  EXPECT_NE(r.out.find("--gpus-per-node INT"), std::string::npos);
  EXPECT_EQ(r.out.find("TEXT"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace commgrid::test
