// `commgrid launch` end to end: real processes, the file store, output prefixes, exit codes,
// and faults (a rank exiting non-zero, a rank killed by SIGKILL, a rank never arriving).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.hpp"

namespace {

using Result = commgrid::test::CliResult;
using commgrid::test::run_shell;

// Runs commgrid with args; coreutils timeout turns a hang into exit 124.
Result launch(const std::vector<std::string>& args, int limit_s = 60) {
  return commgrid::test::run_cli(COMMGRID_CLI, args, limit_s);
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const std::string kWorker = COMMGRID_GLOO_WORKER;

TEST(Launch, FourProcessesMeetThroughTheFileStoreWithPrefixedOutput) {
  Result r = launch({"launch", "-n", "4", "--timeout", "20", "--", kWorker, "ok"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (int k = 0; k < 4; ++k)
    EXPECT_TRUE(has(r.out, "[rank " + std::to_string(k) + "] rank " + std::to_string(k) +
                               " of 4 ok sum=6\n"))
        << r.out;
}

TEST(Launch, EnvironmentStoreFolderPartialLinesAndStderr) {
  Result r = launch({"launch", "-n", "2", "--timeout", "7", "--", kWorker, "env"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "[rank 1] timeout 7\n")) << r.out;
  EXPECT_TRUE(has(r.out, "[rank 0] no newline at the end\n")) << r.out;
  EXPECT_TRUE(has(r.err, "[rank 1] to stderr\n")) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\[rank 0\] store file://(\S+))"))) << r.out;
  EXPECT_FALSE(std::filesystem::exists(m[1].str())) << "store folder left behind: " << m[1];
}

TEST(Launch, ARankExitingNonZeroStopsTheOthersAndIsNamed) {
  Result r = launch({"launch", "-n", "3", "--timeout", "60", "--", kWorker, "exit", "1", "3"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "error: rank 1 exited with code 3\n")) << r.err;
  // The others would sleep 100 s: launch stopped them.
  EXPECT_LT(r.seconds, 30) << "the others were not stopped promptly";
}

TEST(Launch, ARankKilledBySigkillIsNamedAndTheOthersEndWithoutHanging) {
  Result r = launch({"launch", "-n", "4", "--timeout", "60", "--", kWorker, "sigkill", "2"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "error: rank 2 killed by signal 9 (SIGKILL)\n")) << r.err;
  EXPECT_LT(r.seconds, 30) << "survivors waited for their 60 s timeout";
}

TEST(Launch, ARankThatNeverArrivesMakesTheOthersFailNamingIt) {
  Result r = launch({"launch", "-n", "3", "--timeout", "2", "--", kWorker, "missing", "2"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(error: rank [01] exited with code 1\n)")))
      << r.err;
  EXPECT_TRUE(has(r.err, "rank 2 (global 2) of 3 to arrive")) << r.err;
  EXPECT_LT(r.seconds, 30);
}

TEST(Launch, BadUsageIsExitTwo) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"launch", "--", "true"},                       // no -n
           {"launch", "-n", "0", "--", "true"},            // too few
           {"launch", "-n", "2"},                          // no program
           {"launch", "-n", "2", "--timeout", "0", "--", "true"},
           {"launch", "-n", "x", "--", "true"},
           {"launch", "-n", "2", "--", "/no/such/program"}}) {
    Result r = launch(args);
    EXPECT_EQ(r.code, 2) << args[1] << " " << args.back() << ": " << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  }
}

TEST(Launch, ExitCodeIsZeroOnlyWhenEveryRankExitsZero) {
  EXPECT_EQ(launch({"launch", "-n", "3", "--", "sh", "-c", "exit 0"}).code, 0);
  Result r = launch({"launch", "-n", "3", "--grace", "1", "--", "sh", "-c",
                     "if [ $COMMGRID_RANK = 2 ]; then kill -SEGV $$; fi; sleep 30"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, "error: rank 2 killed by signal 11 (SIGSEGV)")) << r.err;
  EXPECT_LT(r.seconds, 20);
}

TEST(Launch, ASigtermToTheLauncherStopsEveryRank) {
  // SIGTERM to launch after 2 s: it stops its ranks (which would sleep 100 s) and exits
  // 128+15. The ranks print their pid first so the test can check that none is left.
  Result r = run_shell("timeout 60 " + commgrid::test::shell_quote(COMMGRID_CLI) + " launch -n 2 --grace 1 -- sh -c " +
                       commgrid::test::shell_quote("echo pid $$; exec " + kWorker + " sleep") +
                       " & pid=$!; sleep 2; kill -TERM $pid; wait $pid");
  EXPECT_EQ(r.code, 143) << r.err;
  EXPECT_TRUE(has(r.err, "error: interrupted by SIGTERM; stopped 2 ranks")) << r.err;
  EXPECT_LT(r.seconds, 15);
  std::smatch m;
  std::string out = r.out;
  int pids = 0;
  while (std::regex_search(out, m, std::regex(R"(\] pid (\d+))"))) {
    ++pids;
    EXPECT_NE(::kill(std::stoi(m[1].str()), 0), 0) << "rank process " << m[1] << " survived";
    out = m.suffix();
  }
  EXPECT_EQ(pids, 2) << r.out;
}

}  // namespace

// ---- commgrid verify on Gloo ------------------------------------------------------

namespace {

TEST(VerifyGloo, EightRankThreadsOnAMoeConfigPrintTheTable) {
  Result r = launch({"verify", "--backend", "gloo", "--local", "8", "--tp", "2", "--pp", "2",
                     "--ep", "2", "--timeout", "30"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "tp_ep_pp")) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(verified \d+ kinds, \d+ groups on 8 ranks\n$)")))
      << r.out;
}

TEST(VerifyGloo, UnderLaunchWithTheEnvironmentStore) {
  // No --backend: COMMGRID_RANK from launch selects Gloo.
  Result r = launch({"launch", "-n", "4", "--timeout", "30", "--", COMMGRID_CLI, "verify",
                     "--tp", "2", "--pp", "2", "--strategy", "split"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\[rank 0\] verified \d+ kinds, \d+ groups on 4 ranks\n)")))
      << r.out;
  EXPECT_FALSE(has(r.out, "[rank 1] verified")) << "only rank 0 prints the table";
}

TEST(VerifyGloo, BadInputIsExitTwoAndAFailedCheckIsExitOne) {
  Result bad = launch({"verify", "--backend", "gloo", "--local", "8", "--tp", "3"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_TRUE(has(bad.err, "error: world_size 8 is not divisible")) << bad.err;
  EXPECT_EQ(launch({"verify", "--backend", "mpi", "--local", "2"}).code, 2);
  EXPECT_EQ(launch({"verify", "--backend", "nccl", "--local", "2"}).code, 2);
  EXPECT_EQ(launch({"verify", "--backend", "gloo", "--local", "0"}).code, 2);
  Result fault = launch({"verify", "--backend", "gloo", "--local", "4", "--tp", "2",
                         "--fault-rank", "1", "--timeout", "30"});
  EXPECT_EQ(fault.code, 1) << fault.out << fault.err;
  EXPECT_TRUE(has(fault.err, "error: verify failed:")) << fault.err;
}

}  // namespace

// Without launch (which would stop the survivor first): two processes over a file store,
// rank 1 dies by SIGKILL mid-job; rank 0 fails at once and names it by rank, not only by
// the address Gloo reports.
TEST(GlooFaultsProcesses, ASurvivorNamesThePeerThatDied) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("commgrid-dies-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string env = "COMMGRID_WORLD_SIZE=2 COMMGRID_TIMEOUT=30 COMMGRID_STORE=file://" + dir;
  const std::string worker = commgrid::test::shell_quote(kWorker);
  Result r = run_shell(env + " COMMGRID_RANK=0 timeout 60 " + worker + " sigkill 1 & " + env +
                       " COMMGRID_RANK=1 timeout 60 " + worker + " sigkill 1; wait $!");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "gloo allreduce on world: ")) << r.err;
  EXPECT_TRUE(has(r.err, "the peer that closed the connection is rank 1 of world (global rank 1)"))
      << r.err;
  EXPECT_LT(r.seconds, 20) << "the survivor waited for its timeout instead of failing at once";
}
