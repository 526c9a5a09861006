// `commgrid plan --job` and `commgrid verify --job`: multi-module jobs (docs/megatron-head.md),
// their layouts, and every bad job file (exit 2, one `error:` line naming the field).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.hpp"

namespace commgrid::test {
namespace {

CliResult plan(std::vector<std::string> args) {
  args.insert(args.begin(), "plan");
  return run_cli(COMMGRID_EXE, args);
}

void expect_usage_error(const std::vector<std::string>& args, const std::string& text) {
  const CliResult r = plan(args);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_EQ(r.err.rfind("error:", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
}

std::string write_job(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("commgrid-job-" + std::to_string(::getpid()) + "-" + name + ".json");
  std::ofstream(path) << text;
  return path.string();
}

TEST(PlanJobCli, TwoModules) {
  const std::string job = write_job("ok", R"({"world_size": 64, "modules": [
    {"name": "vision", "dims": [{"name": "tp", "size": 2}, {"name": "dp", "size": 4}]},
    {"name": "llm", "rank_offset": 8, "dims": [{"name": "tp", "size": 4}, {"name": "dp", "size": 7},
     {"name": "pp", "size": 2}], "groups": [["tp"], ["pp", "tp"]]}]})");
  const CliResult r = plan({"--job", job, "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["modules"]["vision"]["groups"]["tp"][3], nlohmann::json::parse("[6,7]"));
  EXPECT_FALSE(j["modules"]["llm"]["groups"].contains("pp"));  // not asked for
  EXPECT_EQ(j["modules"]["llm"]["groups"]["pp-tp"][0],
            nlohmann::json::parse("[8,9,10,11,36,37,38,39]"));
  const CliResult t = plan({"--job", job});
  EXPECT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("llm: ranks 8-63"), std::string::npos) << t.out;
  std::filesystem::remove(job);
}

TEST(PlanJobCli, BadFilesNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "not valid JSON"},
      {R"({"modules": []})", "job.world_size: missing"},
      {R"({"world_size": 0, "modules": []})", "job.world_size: expected an integer >= 1"},
      {R"({"world_size": 8, "modules": []})", "job.modules: expected a non-empty list"},
      {R"({"world_size": 8, "modules": [{"dims": [{"name": "tp", "size": 2}]}]})",
       "job.modules[0].name: missing"},
      {R"({"world_size": 8, "modules": [{"name": "a", "dims": [{"name": "tp", "size": "x"}]}]})",
       "job.modules[0].dims[0].size"},
      {R"({"world_size": 8, "modules": [{"name": "a", "dims": [{"name": "tp", "size": 2}], "colour": 1}]})",
       "job.modules[0].colour: unknown field"},
      {R"({"world_size": 8, "modules": [{"name": "a", "dims": [{"name": "tp", "size": 16}]}]})",
       "does not fit world_size 8"},
      {R"({"world_size": 8, "modules": [{"name": "a", "rank_offset": -1, "dims": [{"name": "tp", "size": 2}]}]})",
       "job.modules[0].rank_offset"},
      {R"({"world_size": 8, "modules": [{"name": "a", "dims": [{"name": "tp", "size": 2}], "groups": [["pp"]]}]})",
       "job.modules[0].groups[0]"},
      {R"({"world_size": 8, "modules": [{"name": "a", "dims": [{"name": "tp", "size": 4}]},
          {"name": "b", "rank_offset": 2, "dims": [{"name": "tp", "size": 2}]}]})",
       "job.modules[1].rank_offset: module \"b\" (ranks 2-3) overlaps module \"a\""},
      {R"({"world_size": 8, "modules": [{"name": "a", "dims": [{"name": "tp", "size": 2}]},
          {"name": "a", "rank_offset": 2, "dims": [{"name": "tp", "size": 2}]}]})",
       "job.modules[1].name: module \"a\" is given twice"},
  };
  int i = 0;
  for (const auto& [text, want] : cases) {
    const std::string job = write_job("bad" + std::to_string(i++), text);
    expect_usage_error({"--job", job}, want);
    std::filesystem::remove(job);
  }
  expect_usage_error({"--job", "/nonexistent/job.json"}, "cannot read");
  const std::string job = write_job(
      "flags",
      R"({"world_size": 8, "modules": [{"name": "a", "dims": [{"name": "tp", "size": 2}]}]})");
  expect_usage_error({"--job", job, "--tp", "2"}, "--tp does not apply with --job");
  std::filesystem::remove(job);
}

// verify --job: two modules on 16 Gloo rank-threads, proven on the wire.
TEST(PlanJobCli, VerifyJobOnSixteenRankThreads) {
  const std::string job = write_job("verify", R"({"world_size": 16, "modules": [
    {"name": "encoder", "dims": [{"name": "tp", "size": 2}, {"name": "dp", "size": 4}]},
    {"name": "llm", "rank_offset": 8, "dims": [{"name": "tp", "size": 2}, {"name": "dp", "size": 2},
     {"name": "pp", "size": 2}], "groups": [["tp"], ["dp"], ["pp"], ["tp", "pp"]]}]})");
  const CliResult r = run_cli(COMMGRID_EXE, {"verify", "--job", job, "--local", "16"});
  if (r.err.find("no Gloo backend") != std::string::npos)
    GTEST_SKIP() << "this build has no Gloo backend";
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("llm pp-tp: 2 groups ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verified 2 modules on 16 ranks"), std::string::npos) << r.out;
  const CliResult mismatch = run_cli(COMMGRID_EXE, {"verify", "--job", job, "--local", "8"});
  EXPECT_EQ(mismatch.code, 2);
  EXPECT_NE(mismatch.err.find("error: local: --local 8 differs from the job's world_size 16"),
            std::string::npos)
      << mismatch.err;
  const CliResult flags = run_cli(COMMGRID_EXE, {"verify", "--job", job, "--pp", "2"});
  EXPECT_EQ(flags.code, 2);
  EXPECT_NE(flags.err.find("--pp does not apply with --job"), std::string::npos) << flags.err;
  std::filesystem::remove(job);
}

}  // namespace
}  // namespace commgrid::test
