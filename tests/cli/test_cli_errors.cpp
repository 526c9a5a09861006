// Errors that guide: every subcommand's misspelt flag gets "did you mean", a flag without
// its value is named, a stray word is named, every message points at the help; --version.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "cli_runner.hpp"

namespace commgrid::test {
namespace {

struct Case {
  std::vector<std::string> args;
  std::string want;  // the whole error line, without "error: " and the newline
};

void PrintTo(const Case& c, std::ostream* os) {
  if (c.args.empty()) *os << "(no arguments)";
  for (const auto& a : c.args) *os << a << ' ';
}

class CliErrors : public ::testing::TestWithParam<Case> {};

TEST_P(CliErrors, OneLineThatNamesTheFlagAndPointsAtTheHelp) {
  const CliResult r = run_cli(COMMGRID_EXE, GetParam().args);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "error: " + GetParam().want + "\n");
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CliErrors,
    ::testing::Values(
        // The issue's own examples.
        Case{
            {"plan", "--world-sise", "4096", "--tp", "8"},
            "plan: unknown flag --world-sise (did you mean --world-size?); see commgrid plan --help"},
        Case{{"plan", "--world-size", "8", "--tp", "--pp", "4"},
             "plan: --tp needs a value (got the flag --pp instead); see commgrid plan --help"},
        Case{{"plan", "--world-size", "8", "--tp"},
             "plan: --tp needs a value; see commgrid plan --help"},
        Case{{"plan", "--world-size", "8", "4"},
             "plan: unexpected argument \"4\"; see commgrid plan --help"},
        // Every subcommand.
        Case{
            {"verify", "--local", "2", "--stratgy", "split"},
            "verify: unknown flag --stratgy (did you mean --strategy?); see commgrid verify --help"},
        Case{
            {"launch", "--nproc-per-nod", "2", "--", "true"},
            "launch: unknown flag --nproc-per-nod (did you mean --nproc-per-node?); see commgrid launch --help"},
        Case{
            {"bench", "layout", "--world", "8"},
            "bench layout: unknown flag --world (did you mean --worlds?); see commgrid bench layout --help"},
        // A flag of another subcommand, a program's flag read as launch's, a short flag.
        Case{{"plan", "--world-size", "8", "--local", "2"},
             "plan: unknown flag --local (a flag of commgrid verify); see commgrid plan --help"},
        Case{{"launch", "-n", "2", "python3", "train.py", "--lr", "1"},
             "launch: unknown flag --lr after the program \"python3\": put -- before the program "
             "(commgrid launch ... -- PROGRAM ARGS...); see commgrid launch --help"},
        Case{{"launch", "-n", "--", "true"},
             "launch: --nproc needs a value; see commgrid launch --help"},
        Case{{"--versoin"},
             "unknown flag --versoin (did you mean --version?); see commgrid --help"},
        // CLI11's own messages, lower-case like every other error line.
        Case{{},
             "a subcommand is required (valid: plan, verify, launch, bench); see commgrid "
             "--help"},
        Case{{"bench"},
             "bench: a subcommand is required (valid: layout, init, collectives, store); see "
             "commgrid bench --help"},
        Case{{"plan", "--world-size", "8", "--tp", "2", "--tp", "2"},
             "plan: --tp: at most 1 required but received 2; see commgrid plan --help"},
        Case{{"plna", "--world-size", "8"},
             "unknown command \"plna\" (did you mean plan?) (valid: plan, verify, launch, bench); "
             "see commgrid --help"}));

TEST(CliErrorLines, EveryErrorLineStartsLowerCase) {
  // The text after "error: " (and after the subcommand's "plan: ") never starts with a
  // capital letter, whatever produced it: CLI11, the command, or the library.
  const std::vector<std::vector<std::string>> inputs = {
      {},
      {"bench"},
      {"launch"},
      {"launch", "-n", "2"},
      {"launch", "-n", "1", "-n", "2", "--", "true"},
      {"plan", "--world-size", "8", "--tp", "3"},
      {"plan", "--world-size", "8", "--order", "tp-pp"},
      {"plan", "--world-size", "8", "--tp", "2", "--tp", "2"},
      {"plan", "--world-size", "8", "--format", "xml"},
      {"plan", "--world-size", "8", "--compat", "head", "--tp", "4", "--gtp-remat", "4"},
      {"verify", "--local", "3", "--tp", "2"},
      {"bench", "layout", "--worlds", "x"},
      {"launch", "-n", "2", "--output", "tee", "--", "true"},
      {"launch", "-n", "2", "--spares", "2", "--", "true"},
  };
  const std::regex capital(R"(^error: ([a-z ]+: )?[A-Z])");
  for (const auto& args : inputs) {
    const CliResult r = run_cli(COMMGRID_EXE, args);
    std::string all;
    for (const auto& a : args) all += a + " ";
    EXPECT_EQ(r.code, 2) << all << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << all << r.err;
    std::istringstream lines(r.err);
    for (std::string line; std::getline(lines, line);)
      EXPECT_FALSE(std::regex_search(line, capital)) << all << "\n" << line;
  }
}

TEST(CliVersion, NamesTheVersionAndTheBackendsBuiltIn) {
  const CliResult r = run_cli(COMMGRID_EXE, {"--version"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::regex_match(
      r.out,
      std::regex(
          R"(commgrid \d+\.\d+\.\d+ \(backends: ((gloo|mpi|nccl)(, (mpi|nccl))*|none)\)\n)")))
      << r.out;
}

// What the issue-24 stranger fed `plan --job` and `verify --job`: never a crash, never the
// whole bad value echoed back, the same refusals from both.
std::string write_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("commgrid-errors-" + std::to_string(::getpid()) + "-" + name + ".json");
  std::ofstream(path) << text;
  return path.string();
}

TEST(JobFileErrors, HostileFilesAreExitTwoWithShortMessagesInPlanAndVerify) {
  const std::string long_name(100000, 'x');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string(100000, '['), "nests arrays and objects deeper than 32 levels (at byte 32)"},
      {R"({"world_size": 8, "modules": [{"name": "a", "dims": [{"name": "tp", "size": 1e999}]}]})",
       "number overflow parsing '1e999'"},
      {R"({"world_size": 8, "modules": [{"name": "a", "dims": [{"name": "tp", "size": 2}, {"name": "dp", "size": 4}],
          "groups": [["tp", "dp"], ["dp", "tp"]]}]})",
       "job.modules[0].groups[1]: the groups over dp-tp are listed twice (also groups[0])"},
      {R"({"world_size": 8, "modules": [{"name": ")" + long_name +
           R"(", "dims": [{"name": "tp", "size": 2}]}]})",
       "job.modules[0].name: expected a name of at most 64 characters"},
      {R"({"world_size": 8, "modules": [{"name": "a", "dims": [{"name": "tp", "size": ")" +
           long_name + R"("}]}]})",
       "(100002 characters)"},
      {"[" + long_name + "]", "not valid JSON"},
  };
  int i = 0;
  for (const auto& [text, want] : cases) {
    const std::string path = write_file(std::to_string(i++), text);
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"plan", "--job", path},
          std::vector<std::string>{"verify", "--job", path, "--local", "8"}}) {
      const CliResult r = run_cli(COMMGRID_EXE, args);
      if (args[0] == "verify" && r.err.find("no Gloo backend") != std::string::npos) continue;
      EXPECT_EQ(r.code, 2) << args[0] << " " << want << ": " << r.err.substr(0, 300);
      EXPECT_EQ(r.err.rfind("error: job", 0), 0u) << r.err.substr(0, 300);
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err.substr(0, 300);
      EXPECT_NE(r.err.find(want), std::string::npos) << r.err.substr(0, 300);
      EXPECT_LT(r.err.size(), 400u) << "the bad value was echoed: " << r.err.substr(0, 300);
    }
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace commgrid::test
