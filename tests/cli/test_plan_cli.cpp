// `commgrid plan` end to end, in both editions (seed, and --compat head): outputs, and every
// kind of bad input (exit 2, one line on stderr that starts with "error: " and names the
// parameter, nothing on stdout).
#include <gtest/gtest.h>

#include <cctype>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.hpp"

namespace commgrid::test {
namespace {

CliResult plan(std::vector<std::string> args) {
  args.insert(args.begin(), "plan");
  return run_cli(COMMGRID_EXE, args);
}

TEST(PlanCli, JsonWholeLayout) {
  const CliResult r =
      plan({"--world-size", "16", "--tp", "2", "--pp", "2", "--cp", "2", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["config"]["dp"], 2);
  EXPECT_EQ(j["config"]["expert_dp"], 4);
  EXPECT_TRUE(j["config"]["vpp"].is_null());
  EXPECT_EQ(j["groups"]["mp"],
            nlohmann::json::parse("[[0,1,8,9],[2,3,10,11],[4,5,12,13],[6,7,14,15]]"));
  EXPECT_FALSE(j["groups"].contains("hcp"));
  EXPECT_FALSE(j["groups"].contains("inter_dist_opt"));
  EXPECT_EQ(j["groups"].size(), 19u);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t nl = text.find('\n', at);
    out.push_back(text.substr(at, nl - at));
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  return out;
}

TEST(PlanCli, HeadTableColumnsFitTheLongKindNamesAndTheHeaderSaysHead) {
  // HEAD's kind names run to 24 characters (tp_ep_pp_with_egtp_remat, hybrid_dp_cp_4): every
  // column of the summary and of the per-rank table still lines up under its title.
  const std::vector<std::string> layout{"--compat",
                                        "head",
                                        "--world-size",
                                        "16",
                                        "--tp",
                                        "2",
                                        "--ep",
                                        "2",
                                        "--cp",
                                        "2",
                                        "--expert-gtp-remat",
                                        "2",
                                        "--hybrid-context-parallel"};
  const CliResult r = plan(layout);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines[0].find(", compat head"), std::string::npos) << lines[0];
  // The summary: "kind ... groups" then one line per kind, its count right-aligned under
  // "groups" with the kind name left of it and at least two spaces between.
  std::size_t head = 0;
  while (head < lines.size() && !lines[head].starts_with("kind ")) ++head;
  ASSERT_LT(head, lines.size()) << r.out;
  const std::size_t groups_end = lines[head].find("groups") + 6;
  int kinds = 0;
  bool long_names = false;
  for (std::size_t i = head + 1; i < lines.size() && !lines[i].empty(); ++i, ++kinds) {
    const std::string& l = lines[i];
    const std::string name = l.substr(0, l.find(' '));
    long_names = long_names || name == "tp_ep_pp_with_egtp_remat";
    ASSERT_GT(l.size(), groups_end) << l;
    EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(l[groups_end - 1])) && l[groups_end] == ' ')
        << "column off under \"groups\": " << l;
    EXPECT_EQ(l.compare(name.size(), 2, "  "), 0) << l;
  }
  EXPECT_TRUE(long_names) << r.out;
  EXPECT_GT(kinds, 20);
  // The per-rank table: every row exactly as long as its header, each number in its column.
  std::size_t table = 0;
  while (table < lines.size() && !lines[table].starts_with("  rank ")) ++table;
  ASSERT_LT(table + 16, lines.size()) << r.out;
  for (std::size_t i = table + 1; i <= table + 16; ++i)
    EXPECT_EQ(lines[i].size(), lines[table].size()) << lines[table] << "\n" << lines[i];
  // The pictures say so too: the SVG's title and heading, the HTML page's title.
  std::vector<std::string> svg = layout, html = layout;
  svg.insert(svg.end(), {"--format", "svg"});
  html.insert(html.end(), {"--format", "html"});
  const CliResult s = plan(svg), h = plan(html);
  ASSERT_EQ(s.code, 0) << s.err;
  ASSERT_EQ(h.code, 0) << h.err;
  EXPECT_NE(s.out.find("<title>commgrid layout: world 16, compat head, order "), std::string::npos);
  EXPECT_NE(s.out.find("(innermost first), compat head"), std::string::npos);
  EXPECT_NE(h.out.find("<title>commgrid layout: world 16, compat head, order "), std::string::npos);
  // The seed says nothing of it.
  const CliResult seed = plan({"--world-size", "16", "--tp", "2", "--format", "svg"});
  EXPECT_EQ(seed.out.find("compat"), std::string::npos);
}

TEST(PlanCli, JsonOneRankAndKinds) {
  const CliResult r = plan({"--world-size", "16", "--tp", "2", "--pp", "2", "--cp", "2", "--format",
                            "json", "--rank", "13", "--kinds",
                            "pos_embd,tp,hcp"
                            "",
                            "--hcp", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::ordered_json::parse(r.out);
  EXPECT_EQ(j["rank"], 13);
  // Reference order whatever the request's order; null where the rank is in no group.
  EXPECT_EQ(j["groups"].dump(), R"({"hcp":[[13,15]],"tp":[12,13],"pos_embd":null})");
}

TEST(PlanCli, MegatronLongNamesAreAliases) {
  const CliResult a = plan({"--world-size",
                            "16",
                            "--tensor-model-parallel-size",
                            "2",
                            "--pipeline-model-parallel-size",
                            "2",
                            "--context-parallel-size",
                            "2",
                            "--expert-model-parallel-size",
                            "2",
                            "--expert-tensor-parallel-size",
                            "1",
                            "--num-distributed-optimizer-instances",
                            "2",
                            "--virtual-pipeline-model-parallel-size",
                            "3",
                            "--hierarchical-context-parallel-sizes",
                            "2",
                            "--format",
                            "json"});
  const CliResult b = plan({"--world-size",
                            "16",
                            "--tp",
                            "2",
                            "--pp",
                            "2",
                            "--cp",
                            "2",
                            "--ep",
                            "2",
                            "--etp",
                            "1",
                            "--dist-opt-instances",
                            "2",
                            "--vpp",
                            "3",
                            "--hcp",
                            "2",
                            "--format",
                            "json"});
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
  const CliResult r =
      plan({"--world-size", "16", "--tp", "2", "--pp", "2", "--cp", "2", "--rank", "13"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("rank 13: tp 1, cp 0, dp 1, pp 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(not a member)"), std::string::npos);
}

TEST(PlanCli, SparesShowWhereTheyAreAndEachRanksProcess) {
  // Table: the spares after the world; with nodes, whole nodes; with --rank, its process.
  const CliResult t =
      plan({"--world-size", "8", "--tp", "2", "--spares", "4", "--gpus-per-node", "4"});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("spares: 4 processes (8-11, node 2) hold no rank"), std::string::npos)
      << t.out;
  EXPECT_NE(t.out.find("12 processes in all"), std::string::npos) << t.out;
  const CliResult one = plan({"--world-size", "8", "--tp", "2", "--spares", "1", "--rank", "5"});
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_NE(one.out.find("spares: 1 process (8) hold no rank"), std::string::npos) << one.out;
  EXPECT_NE(one.out.find("logical rank 5 on process 5"), std::string::npos) << one.out;
  // JSON: the same facts as numbers.
  const CliResult j = plan({"--world-size", "16", "--tp", "2", "--spares", "8", "--gpus-per-node",
                            "4", "--rank", "13", "--format", "json"});
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_EQ(
      nlohmann::json::parse(j.out)["processes"],
      nlohmann::json::parse(R"({"total":24,"spares":[16,23],"spare_nodes":[4,5],"process":13})"));
  // No spares: no processes section (the plan is the one without --spares).
  const CliResult none = plan({"--world-size", "8", "--spares", "0", "--format", "json"});
  const CliResult base = plan({"--world-size", "8", "--format", "json"});
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_EQ(none.out, base.out);
}

TEST(PlanCli, HelpExitsZero) {
  const CliResult r = run_cli(COMMGRID_EXE, {"plan", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--tensor-model-parallel-size"), std::string::npos);
}

struct BadInput {
  std::vector<std::string> args;
  std::string must_contain;  // the parameter and/or values the message names
  /// What the message names under --compat head where it differs (HEAD's sizes include
  /// gtp_remat); "" when it is the same.
  std::string head_contains = "";
  /// Run under --compat head as well (appended): a plan case that holds in both editions.
  bool both_editions = false;
  bool head = false;  // this instance runs under --compat head
};

void PrintTo(const BadInput& b, std::ostream* os) {
  for (const auto& a : b.args) *os << "'" << a << "' ";
  if (b.head) *os << "(compat head)";
}

class PlanBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(PlanBadInput, ExitTwoWithOneLineError) {
  const BadInput& c = GetParam();
  std::vector<std::string> args = c.args;
  if (c.head) args.insert(args.end(), {"--compat", "head"});
  const CliResult r = run_cli(COMMGRID_EXE, args);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.out, "") << "partial output on bad input";
  ASSERT_GE(r.err.size(), 8u);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  const std::string& want = c.head && !c.head_contains.empty() ? c.head_contains : c.must_contain;
  EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
}

// Each case as given and, for a plan case of both editions, again under --compat head.
std::vector<BadInput> in_both_editions(const std::vector<BadInput>& cases) {
  std::vector<BadInput> out;
  for (const BadInput& c : cases) {
    out.push_back(c);
    if (!c.both_editions) continue;
    BadInput h = c;
    h.head = true;
    out.push_back(std::move(h));
  }
  return out;
}

const std::vector<std::string> kW8 = {"plan", "--world-size", "8"};
std::vector<std::string> w8(std::vector<std::string> more) {
  std::vector<std::string> a = kW8;
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// Every case in the seed edition; the plan cases also under --compat head, where the same
// rules hold (one validator, two editions).
INSTANTIATE_TEST_SUITE_P(
    Cases, PlanBadInput,
    ::testing::ValuesIn(in_both_editions(
        {BadInput{{}, "subcommand"},
         BadInput{{"frobnicate"}, "unknown command \"frobnicate\""},
         BadInput{{"plan"}, "--world-size is required"},
         BadInput{w8({"--foo", "1"}), "--foo", "", true},
         BadInput{w8({"--tp"}), "--tp", "", true},
         BadInput{w8({"--tp", "abc"}), "tp: expected an integer, got \"abc\"", "", true},
         BadInput{w8({"--tp", "2.5"}), "\"2.5\"", "", true},
         BadInput{w8({"--tp", "-2"}), "tp must be >= 1, got -2", "", true},
         BadInput{w8({"--pp", "0"}), "pp must be >= 1, got 0", "", true},
         BadInput{w8({"--cp", "1e3"}), "\"1e3\"", "", true},
         BadInput{w8({"--ep", ""}), "ep"},  // "ep: expected an integer" or "--ep needs a value"
         BadInput{{"plan", "--world-size", "99999999999999999999"}, "world_size", "", true},
         BadInput{{"plan", "--world-size", "3000000000"}, "exceeds 2147483647", "", true},
         BadInput{{"plan", "--world-size", "0"}, "world_size must be >= 1, got 0", "", true},
         BadInput{w8({"--kinds", "tp,foo"}), "unknown group kind \"foo\"", "", true},
         BadInput{w8({"--kinds", "hcp"}), "hcp", "", true},
         BadInput{w8({"--kinds", "inter_dist_opt"}), "dist_opt_instances = 1", "", true},
         BadInput{w8({"--format", "xml"}), "format", "", true},
         BadInput{w8({"--rank", "8"}), "rank 8 out of range [0, 8)", "", true},
         BadInput{w8({"--rank", "-1"}), "rank -1 out of range", "", true},
         BadInput{w8({"--rank", "x"}), "rank: expected an integer", "", true},
         BadInput{w8({"--order", ""}), "empty", "", true},
         BadInput{w8({"--order", "tp-xx-dp"}), "unknown token \"xx\"", "", true},
         BadInput{w8({"--order", "tp-dp-tp"}), "appears twice", "", true},
         BadInput{w8({"--tp", "3"}), "world_size 8 is not divisible by tp*pp*cp = 3*1*1 = 3",
                  "world_size 8 is not divisible by tp*pp*cp*gtp_remat = 3*1*1*1 = 3", true},
         BadInput{w8({"--vpp", "2"}), "vpp = 2 requires pp > 1, got pp = 1", "", true},
         BadInput{w8({"--tp", "1", "--ep", "16"}), "etp*ep*pp = 1*16*1 = 16",
                  "etp*ep*pp*expert_gtp_remat = 1*16*1*1 = 16", true},
         BadInput{w8({"--tp", "2", "--pp", "2", "--ep", "2", "--order", "tp-cp-pp-ep-dp"}),
                  "does not end with pp", "", true},
         BadInput{w8({"--tp", "2", "--pp", "2", "--dist-opt-instances", "3"}),
                  "dist_opt_instances = 3 must divide dp*cp = 2*1 = 2", "", true},
         BadInput{w8({"--tp", "1", "--ep", "8", "--dist-opt-instances", "2"}),
                  "must divide expert_dp", "", true},
         BadInput{w8({"--cp", "4", "--hcp", "2,4"}), "hcp sizes [2,4] multiply to 8, but cp = 4",
                  "", true},
         BadInput{w8({"--cp", "4", "--hcp", "2,,2"}), "hcp[1]", "", true},
         BadInput{w8({"--cp", "4", "--hcp", "2,-2"}), "hcp[1] must be >= 1, got -2", "", true},
         BadInput{w8({"--tp", "2", "--ep", "2", "--order", "tp-cp-dp-pp"}), "omits \"ep\"", "",
                  true},
         BadInput{
             w8({"--tp", "2", "--pp", "2", "--ep", "2", "--etp", "1", "--order", "tp-pp-ep-dp"}),
             "pipeline groups differ", "", true},
         BadInput{w8({"--spares", "-1"}), "spares must be >= 0, got -1", "", true},
         BadInput{w8({"--spares", "x"}), "spares: expected an integer", "", true},
         BadInput{w8({"--spares", "2", "--format", "svg"}),
                  "--spares is shown by --format table and json, not svg", "", true},
         BadInput{w8({"--spares", "3", "--gpus-per-node", "4"}),
                  "spares = 3 is not a whole number of nodes of 4", "", true},
         BadInput{w8({"--spares", "4", "--gpus-per-node", "3"}),
                  "world_size 8 is not a whole number of nodes of 3", "", true},
         BadInput{{"plan", "--world-size", "4096", "--tp", "65536", "--pp", "65536"},
                  "tp*pp*cp exceeds world_size 4096",
                  "tp*pp*cp*gtp_remat exceeds world_size 4096",
                  true}})));

// The HEAD flags: each one's bad values under --compat head, and each one refused in the
// seed edition, with the parameter named.
const std::vector<std::string> kHeadW8 = {"plan", "--world-size", "8", "--compat", "head"};
std::vector<std::string> head_w8(std::vector<std::string> more) {
  std::vector<std::string> a = kHeadW8;
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

INSTANTIATE_TEST_SUITE_P(
    HeadFlags, PlanBadInput,
    ::testing::Values(
        BadInput{w8({"--compat", "tip"}), "compat: expected seed or head"},
        BadInput{w8({"--gtp-remat", "2"}), "gtp_remat = 2 requires compat head"},
        BadInput{w8({"--expert-gtp-remat", "2"}), "expert_gtp_remat"},
        BadInput{w8({"--hybrid-context-parallel"}), "hybrid_context_parallel"},
        BadInput{w8({"--all-gather-groups"}), "all_gather_groups"},
        BadInput{w8({"--rank-offset", "2"}), "rank_offset"},
        BadInput{w8({"--local-world-size", "4"}), "local_world_size"},
        BadInput{head_w8({"--gtp-remat", "two"}), "gtp_remat: expected an integer"},
        BadInput{head_w8({"--gtp-remat", "0"}), "gtp_remat must be >= 1"},
        BadInput{head_w8({"--expert-gtp-remat", "3"}), "expert_gtp_remat"},
        BadInput{head_w8({"--rank-offset", "-1"}), "rank_offset must be >= 0"},
        BadInput{head_w8({"--rank-offset", "4"}), "exceeds world_size 8"},
        BadInput{head_w8({"--local-world-size", "0"}), "local_world_size must be >= 1"},
        BadInput{head_w8({"--local-world-size", "9"}), "local_world_size = 9 exceeds"},
        BadInput{head_w8({"--order", "cp-dp-pp"}), "has no \"tp\""},
        BadInput{head_w8({"--order", "tp-gtp_remat-gtp_remat"}), "appears twice"},
        BadInput{head_w8({"--kinds", "gtp_remat,bogus"}), "bogus"},
        // A HEAD kind asked of a seed layout names why it is absent.
        BadInput{w8({"--kinds", "gtp_remat"}), "only under compat head"}));

TEST(PlanCli, HeadAllGatherWarningWhenOrderDiffers) {
  const std::vector<std::string> base = {"--world-size",
                                         "16",
                                         "--tp",
                                         "2",
                                         "--pp",
                                         "2",
                                         "--ep",
                                         "2",
                                         "--etp",
                                         "1",
                                         "--compat",
                                         "head",
                                         "--all-gather-groups",
                                         "--format",
                                         "json"};
  CliResult r = plan(base);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  std::vector<std::string> reordered = base;
  reordered.insert(reordered.end(), {"--order", "tp-cp-ep-pp-dp"});
  r = plan(reordered);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: dp_cp_ag differs from dp_cp"), std::string::npos) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["groups"]["dp_cp_ag"], j["groups"]["dp_cp"]);
}

TEST(PlanCli, HeadTableAndRankViews) {
  CliResult r = plan({"--world-size", "32", "--tp", "2", "--cp", "8", "--compat", "head",
                      "--hybrid-context-parallel"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("hybrid_dp_cp_4"), std::string::npos);
  r = plan({"--world-size", "16", "--tp", "2", "--compat", "head", "--gtp-remat", "2", "--rank",
            "5", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["groups"]["gtp_remat"], nlohmann::json::parse("[5,7]"));
  EXPECT_EQ(j["groups"]["tp"], nlohmann::json::parse("[4,5]"));
}

}  // namespace
}  // namespace commgrid::test
