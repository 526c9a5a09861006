// `commgrid launch` end to end: real processes, the file store, output prefixes, exit codes,
// and faults (a rank exiting non-zero, a rank killed by SIGKILL, a rank never arriving).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_runner.hpp"
#include "free_port.hpp"

namespace {

using Result = commgrid::test::CliResult;
using commgrid::test::free_port;
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
    EXPECT_TRUE(has(
        r.out, "[rank " + std::to_string(k) + "] rank " + std::to_string(k) + " of 4 ok sum=6\n"))
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
  Result r = launch({"launch", "-n", "3", "--timeout", "60", "--", kWorker, "exit", "1", "3"}, 120);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "error: rank 1 exited with code 3\n")) << r.err;
  // The others would sleep 100 s: launch stopped them (a bound with room for a loaded machine).
  EXPECT_LT(r.seconds, 50) << "the others were not stopped promptly";
}

TEST(Launch, ARankKilledBySigkillIsNamedAndTheOthersEndWithoutHanging) {
  Result r = launch({"launch", "-n", "4", "--timeout", "100", "--", kWorker, "sigkill", "2"}, 150);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "error: rank 2 killed by signal 9 (SIGKILL)\n")) << r.err;
  EXPECT_LT(r.seconds, 60) << "survivors waited for their 100 s timeout";
}

TEST(Launch, ARankThatNeverArrivesMakesTheOthersFailNamingIt) {
  // The ranks' own 2 s timeout, without launch's --timeout: launch's deadline (the timeout
  // + 1 s from its start) would race the ranks' on a loaded machine, where starting them
  // alone can take longer than that second.
  Result r =
      run_shell("COMMGRID_TIMEOUT=2 timeout 60 " + commgrid::test::shell_quote(COMMGRID_CLI) +
                " launch -n 3 -- " + commgrid::test::shell_quote(kWorker) + " missing 2");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(error: rank [01] exited with code 1\n)")))
      << r.err;
  EXPECT_TRUE(has(r.err, "rank 2 (global 2) of 3 to arrive")) << r.err;
  EXPECT_LT(r.seconds, 50) << "the others did not end at their 2 s timeout";
}

TEST(Launch, BadUsageIsExitTwo) {
  for (const auto& args :
       std::vector<std::vector<std::string>>{{"launch", "--", "true"},             // no -n
                                             {"launch", "-n", "0", "--", "true"},  // too few
                                             {"launch", "-n", "2"},                // no program
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
                     "if [ $COMMGRID_RANK = 2 ]; then kill -SEGV $$; fi; sleep 100"},
                    120);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, "error: rank 2 killed by signal 11 (SIGSEGV)")) << r.err;
  EXPECT_LT(r.seconds, 50) << "the others slept on";
}

TEST(Launch, ASigtermToTheLauncherStopsEveryRank) {
  // SIGTERM to launch after 2 s: it stops its ranks (which would sleep 100 s) and exits
  // 128+15. The ranks print their pid first so the test can check that none is left.
  Result r = run_shell("timeout 60 " + commgrid::test::shell_quote(COMMGRID_CLI) +
                       " launch -n 2 --grace 1 -- sh -c " +
                       commgrid::test::shell_quote("echo pid $$; exec " + kWorker + " sleep") +
                       " & pid=$!; sleep 2; kill -TERM $pid; wait $pid");
  EXPECT_EQ(r.code, 143) << r.err;
  EXPECT_TRUE(has(r.err, "error: interrupted by SIGTERM; stopped 2 ranks")) << r.err;
  EXPECT_LT(r.seconds, 50) << "the ranks slept on";
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

// ---- torchrun's variables, output modes, exit codes --------------------------------

// The lines of `text` that start with `prefix`, in order.
std::vector<std::string> lines_with(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  return out;
}

TEST(Launch, SetsTorchrunsVariablesWithAMasterPortApartFromTheStore) {
  const int store_port = free_port();
  // An outer launcher's RANK and MASTER_PORT are replaced, never passed on.
  Result r = run_shell(
      "RANK=7 MASTER_PORT=1 timeout 60 " + commgrid::test::shell_quote(COMMGRID_CLI) +
      " launch -n 2 --master-port " + std::to_string(store_port) + " --rdzv-id my-job -- sh -c " +
      commgrid::test::shell_quote(
          "echo \"v $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK "
          "$GROUP_WORLD_SIZE $ROLE_RANK $ROLE_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
          "$TORCHELASTIC_RUN_ID $COMMGRID_JOB_ID $COMMGRID_STORE\""));
  EXPECT_EQ(r.code, 0) << r.err;
  const std::string tail = " 2 127.0.0.1 " + std::to_string(store_port + 1) +
                           " my-job my-job tcp://127.0.0.1:" + std::to_string(store_port) + "\n";
  EXPECT_TRUE(has(r.out, "[rank 0] v 0 2 0 2 0 1 0" + tail)) << r.out;
  EXPECT_TRUE(has(r.out, "[rank 1] v 1 2 1 2 0 1 1" + tail)) << r.out;

  // One node, no --master-port: the file store, and a free port for torch.
  Result one =
      launch({"launch", "-n", "2", "--", "sh", "-c", "echo \"p $MASTER_PORT $COMMGRID_STORE\""});
  EXPECT_EQ(one.code, 0) << one.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(one.out, m, std::regex(R"(\[rank 0\] p (\d+) file://)")))
      << one.out;
  EXPECT_GT(std::stoi(m[1].str()), 0);
  EXPECT_TRUE(has(one.out, "[rank 1] p " + m[1].str() + " file://"))
      << "one MASTER_PORT per job: " << one.out;
}

TEST(Launch, OnTheLoopbackEachProcessListensOnAnAddressOfItsOwn) {
  // Gloo (Debian's) opens a listening socket per pair while it connects, and the ephemeral
  // ports are per address: each process gets a loopback address of its own, so that 64
  // ranks' groups fit. The user's own COMMGRID_GLOO_HOSTNAME wins.
  Result r = launch({"launch", "-n", "3", "--", "sh", "-c", "echo \"h $COMMGRID_GLOO_HOSTNAME\""});
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* line :
       {"[rank 0] h 127.1.0.1\n", "[rank 1] h 127.1.0.2\n", "[rank 2] h 127.1.0.3\n"})
    EXPECT_TRUE(has(r.out, line)) << r.out;
  Result own = run_shell("COMMGRID_GLOO_HOSTNAME=127.0.0.1 timeout 60 " +
                         commgrid::test::shell_quote(COMMGRID_CLI) +
                         " launch -n 2 -- sh -c 'echo \"h $COMMGRID_GLOO_HOSTNAME\"'");
  EXPECT_EQ(own.code, 0) << own.err;
  EXPECT_TRUE(has(own.out, "[rank 1] h 127.0.0.1\n")) << own.out;
  // And a world whose every pair listens on those addresses works.
  Result world =
      launch({"launch", "-n", "4", "--", COMMGRID_CLI, "verify", "--backend", "gloo", "--tp", "2"});
  EXPECT_EQ(world.code, 0) << world.err;
  EXPECT_TRUE(has(world.out, "verified")) << world.out;
}

TEST(Launch, TorchrunsFlagNamesAndSpellingsAreAccepted) {
  Result r = launch({"launch", "--standalone", "--nproc_per_node", "2", "--rdzv_id", "abc", "--",
                     "sh", "-c", "echo \"id $TORCHELASTIC_RUN_ID of $WORLD_SIZE\""});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "[rank 1] id abc of 2\n")) << r.out;
  Result bad = launch({"launch", "--standalone", "--nnodes", "2", "--node-rank", "0",
                       "--master-port", "1234", "-n", "1", "--", "true"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_TRUE(has(bad.err, "--standalone is one node")) << bad.err;
  Result id = launch({"launch", "-n", "1", "--rdzv-id", "a/b", "--", "true"});
  EXPECT_EQ(id.code, 2) << id.err;
  EXPECT_TRUE(has(id.err, "error: --rdzv-id: ")) << id.err;
}

TEST(Launch, AMultiNodeJobWithoutATokenWarnsNamingItsStore) {
  // Without COMMGRID_TOKEN the tcp:// store of a multi-node job hands the job's secret to
  // whoever connects: launch says so at start, on each node. (One node of two runs `true`,
  // which needs no peer.)
  const std::string port = std::to_string(free_port());
  const std::string cmd = "timeout 60 " + commgrid::test::shell_quote(COMMGRID_CLI) +
                          " launch -n 1 --nnodes 2 --node-rank 0 --master-port " + port +
                          " -- true";
  Result bare = run_shell("env -u COMMGRID_TOKEN " + cmd);
  EXPECT_EQ(bare.code, 0) << bare.err;
  EXPECT_TRUE(has(bare.err,
                  "launch: warning: COMMGRID_TOKEN is not set: anyone who can connect "
                  "to this job's store (tcp://127.0.0.1:" +
                      port + ") is handed the job's secret"))
      << bare.err;
  Result with_token = run_shell("COMMGRID_TOKEN=t " + cmd);
  EXPECT_EQ(with_token.code, 0) << with_token.err;
  EXPECT_FALSE(has(with_token.err, "warning")) << with_token.err;
  // One node makes its own token: nothing to warn about.
  Result one = run_shell("env -u COMMGRID_TOKEN timeout 60 " +
                         commgrid::test::shell_quote(COMMGRID_CLI) + " launch -n 1 -- true");
  EXPECT_EQ(one.code, 0) << one.err;
  EXPECT_FALSE(has(one.err, "warning")) << one.err;
}

TEST(Launch, OutputRawAndRank0) {
  const std::string script = "echo \"out $RANK\"; echo \"err $RANK\" >&2";
  Result raw = launch({"launch", "-n", "3", "--output", "raw", "--", "sh", "-c", script});
  EXPECT_EQ(raw.code, 0) << raw.err;
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE(has(raw.out, "out " + std::to_string(k) + "\n")) << raw.out;
    EXPECT_TRUE(has(raw.err, "err " + std::to_string(k) + "\n")) << raw.err;
  }
  EXPECT_FALSE(has(raw.out + raw.err, "[rank")) << raw.out << raw.err;
  // rank0: rank 0's stdout alone on stdout, so that it pipes cleanly into a parser; the
  // other ranks' stderr stays visible, prefixed.
  Result r0 = launch(
      {"launch", "-n", "3", "--output", "rank0", "--", "sh", "-c",
       "if [ $RANK = 0 ]; then printf '{\\n  \"a\": [1,\\n 2]\\n}\\n'; else echo chatter; fi; "
       "echo \"err $RANK\" >&2"});
  EXPECT_EQ(r0.code, 0) << r0.err;
  EXPECT_EQ(r0.out, "{\n  \"a\": [1,\n 2]\n}\n");
  EXPECT_TRUE(has(r0.err, "err 0\n") && has(r0.err, "[rank 1] err 1\n") &&
              has(r0.err, "[rank 2] err 2\n"))
      << r0.err;
  Result bad = launch({"launch", "-n", "1", "--output", "tee", "--", "true"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(has(bad.err, "error: --output: expected prefixed, raw or rank0, got 'tee'"))
      << bad.err;
}

TEST(Launch, AFlagErrorInEveryRankExitsTwoWithEveryLineWhole) {
  // --grace 60: on a loaded machine a rank may take seconds longer than the first to start
  // and fail; the default 5 s would cut it short (killed, not exit 2).
  Result r = launch({"launch", "-n", "4", "--grace", "60", "--", COMMGRID_CLI, "plan",
                     "--world-size", "8", "--tp", "--pp", "4"});
  EXPECT_EQ(r.code, 2) << r.err;
  const auto errors = lines_with(r.err, "[rank ");
  EXPECT_EQ(errors.size(), 4u) << r.err;
  for (const auto& line : errors)
    EXPECT_TRUE(std::regex_match(
        line,
        std::regex(
            R"(\[rank \d\] error: plan: --tp needs a value \(got the flag --pp instead\); see commgrid plan --help)")))
        << line;
  EXPECT_TRUE(
      has(r.err, "error: every rank exited with code 2 (bad input; the ranks' errors are above)\n"))
      << r.err;
  // A rank slower to fail (its error written in two pieces, a second apart) is not cut
  // short by the first rank's exit 2: its line arrives whole.
  Result slow = launch(
      {"launch", "-n", "3", "--grace", "60", "--", "sh", "-c",
       "if [ $RANK != 0 ]; then printf 'error: ' >&2; sleep 1; echo \"slow rank $RANK\" >&2; fi; exit 2"});
  EXPECT_EQ(slow.code, 2) << slow.err;
  EXPECT_TRUE(has(slow.err, "[rank 1] error: slow rank 1\n") &&
              has(slow.err, "[rank 2] error: slow rank 2\n"))
      << slow.err;
  // Exit 2 from some ranks only, 0 or 1 from the others: a failure (1), naming the first
  // to end (either: the two exit at once, in no set order).
  Result mixed = launch({"launch", "-n", "2", "--", "sh", "-c", "exit $((2 - RANK))"});
  EXPECT_EQ(mixed.code, 1) << mixed.err;
  EXPECT_TRUE(has(mixed.err, "error: rank 0 exited with code 2\n") ||
              has(mixed.err, "error: rank 1 exited with code 1\n"))
      << mixed.err;
}

// ---- starting from other launchers, across nodes ------------------------------------

const std::string kCli = commgrid::test::shell_quote(COMMGRID_CLI);

// A file of /proc read with read(2), "" when it cannot be: a process may end while it is
// read (ESRCH), which std::ifstream reports by throwing from inside its buffer.
std::string read_proc(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

// Whether a process exists and is not a zombie (an orphan's zombie stays until its new
// parent reaps it, which a container's init may never do).
bool alive(int pid) {
  const std::string stat = read_proc("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(") ");
  return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] != 'Z';
}

// Starts `count` copies of `command` in the background, each with `env(i)` before it, and
// prints each one's exit code as "exit <i> <code>".
std::string start_ranks(int count, const std::function<std::string(int)>& env,
                        const std::string& command) {
  std::string sh;
  for (int i = 0; i < count; ++i)
    sh += "( " + env(i) + " timeout 60 " + command + "; echo \"exit " + std::to_string(i) +
          " $?\" ) & ";
  return sh + "wait";
}

TEST(Launchers, TorchrunStyleVariablesStartAVerifiedJob) {
  const std::string port = std::to_string(free_port());
  Result r = run_shell(start_ranks(
      4,
      [&](int i) {
        return "RANK=" + std::to_string(i) + " WORLD_SIZE=4 LOCAL_RANK=" + std::to_string(i) +
               " LOCAL_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port +
               " COMMGRID_TOKEN=t0rch";
      },
      kCli + " verify --tp 2 --pp 2 --timeout 20"));
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(has(r.out, "exit " + std::to_string(i) + " 0\n")) << r.out << r.err;
  EXPECT_TRUE(
      std::regex_search(r.out, std::regex(R"(verified \d+ kinds, \d+ groups on 4 ranks\n)")))
      << r.out;
  EXPECT_FALSE(has(r.out + r.err, "t0rch")) << "the token was shown";
}

TEST(Launchers, SlurmStyleVariablesStartAVerifiedJob) {
  const std::string port = std::to_string(free_port());
  Result r = run_shell(start_ranks(
      4,
      [&](int i) {
        return "SLURM_PROCID=" + std::to_string(i) +
               " SLURM_NTASKS=4 SLURM_LOCALID=" + std::to_string(i % 2) +
               " SLURM_NTASKS_PER_NODE=2 SLURM_JOB_ID=4242 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
               port;
      },
      kCli + " verify --tp 2 --timeout 20"));
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(has(r.out, "exit " + std::to_string(i) + " 0\n")) << r.out << r.err;
  EXPECT_TRUE(
      std::regex_search(r.out, std::regex(R"(verified \d+ kinds, \d+ groups on 4 ranks\n)")))
      << r.out;
}

TEST(Launchers, TwoLaunchesOfTwoNodesOverLoopbackVerifyOneJob) {
  const std::string port = std::to_string(free_port());
  // Node 1's launch writes to stderr, so that the two launches' lines stay apart.
  const std::string common = "COMMGRID_JOB_ID=two-nodes COMMGRID_TOKEN=n0des timeout 60 " + kCli +
                             " launch -n 2 --nnodes 2 --master-port " + port + " --timeout 20";
  Result j =
      run_shell("(" + common + " --node-rank 1 -- " + kCli +
                " verify --tp 2 --pp 2 >&2; echo \"node1 $?\" >&2) & " + common +
                " --node-rank 0 -- " + kCli + " verify --tp 2 --pp 2; echo \"node0 $?\"; wait");
  EXPECT_TRUE(has(j.out, "node0 0\n")) << j.out << j.err;
  EXPECT_TRUE(has(j.err, "node1 0\n")) << j.out << j.err;
  EXPECT_TRUE(std::regex_search(
      j.out, std::regex(R"(\[rank 0\] verified \d+ kinds, \d+ groups on 4 ranks\n)")))
      << j.out;
}

TEST(Launchers, NodeRanksAndLocalRanksOfATwoNodeLaunch) {
  const std::string port = std::to_string(free_port());
  const std::string common = "COMMGRID_JOB_ID=j7 COMMGRID_TOKEN=x timeout 60 " + kCli +
                             " launch -n 2 --nnodes 2 --master-port " + port + " --timeout 20";
  Result j = run_shell("(" + common + " --node-rank 1 -- " + commgrid::test::shell_quote(kWorker) +
                       " local; echo \"node1 $?\") & " + common + " --node-rank 0 -- " +
                       commgrid::test::shell_quote(kWorker) + " local; echo \"node0 $?\"; wait");
  EXPECT_TRUE(has(j.out, "node0 0\n") && has(j.out, "node1 0\n")) << j.out << j.err;
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(has(j.out, "[rank " + std::to_string(r) + "] rank " + std::to_string(r) +
                               " local " + std::to_string(r % 2) + " of 2 job j7\n"))
        << j.out;
}

TEST(Launchers, ASecondJobOnTheSamePortFailsAtOnceAndTheFirstCompletes) {
  const std::string port = std::to_string(free_port());
  const std::string launch = "timeout 60 " + kCli + " launch -n 2 --master-port " + port +
                             " --timeout 20 -- " + commgrid::test::shell_quote(kWorker);
  Result r = run_shell("(" + launch + " hold 4; echo \"first $?\") & sleep 1.5; " +
                       "s=$(date +%s%N); " + launch + " hold 0 >&2; echo \"second $?\"; " +
                       "echo \"took_ms $(( ($(date +%s%N) - s) / 1000000 ))\"; wait");
  EXPECT_TRUE(has(r.out, "first 0\n")) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "second 1\n")) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "[rank 0] rank 0 held") && has(r.out, "[rank 1] rank 1 held")) << r.out;
  EXPECT_TRUE(has(r.err, "is in use") || has(r.err, "serves job")) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(took_ms (\d+))"))) << r.out;
  // At once: not after its 20 s --timeout (a bound with room for a loaded machine).
  EXPECT_LT(std::stoi(m[1].str()), 10000) << "the second job did not fail at once";
}

// ---- strangers ---------------------------------------------------------------------

// The listening TCP ports of processes whose command line contains `marker`, read from
// /proc (socket inodes of their descriptors matched against /proc/net/tcp{,6}). The ranks
// come and go while it reads: a process or descriptor that vanishes is skipped, and
// nothing here throws.
std::set<int> listening_ports_of(const std::string& marker) {
  std::set<std::string> inodes;
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc", ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string pid = it->path().filename().string();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (pid == std::to_string(::getpid())) continue;
    if (read_proc("/proc/" + pid + "/cmdline").find(marker) == std::string::npos) continue;
    std::error_code fd_ec;
    std::filesystem::directory_iterator fds("/proc/" + pid + "/fd", fd_ec);
    for (; !fd_ec && fds != end; fds.increment(fd_ec)) {
      std::error_code link_ec;
      const std::string target = std::filesystem::read_symlink(fds->path(), link_ec).string();
      if (!link_ec && target.starts_with("socket:[") && target.size() > 9)
        inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::set<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream in(read_proc(table));
    std::string row;
    std::getline(in, row);
    while (std::getline(in, row)) {
      std::istringstream f(row);
      std::string slot, local, remote, state, skip, inode;
      f >> slot >> local >> remote >> state;
      for (int i = 0; i < 5; ++i) f >> skip;
      f >> inode;
      const size_t colon = local.rfind(':');
      if (state != "0A" || inodes.count(inode) == 0 || colon == std::string::npos) continue;
      ports.insert(static_cast<int>(std::strtol(local.c_str() + colon + 1, nullptr, 16)));
    }
  }
  return ports;
}

// One run of the job below with the stranger at it: the job's result, how many connections
// the stranger made, and what its thread threw.
struct StrangerRun {
  Result job;
  int attacked = 0;
  std::string error;
};

StrangerRun run_with_a_stranger(const std::string& marker) {
  const int store_port = free_port();
  std::atomic<bool> done{false};
  std::atomic<int> attacked{0};
  StrangerRun out;
  std::jthread stranger([&] {
    std::vector<int> fds;
    std::set<int> seen;
    auto attack = [&](int port) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
        char junk[48];
        for (size_t i = 0; i < sizeof(junk); ++i) junk[i] = static_cast<char>(i * 37 + 1);
        (void)!::send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
        ++attacked;
        fds.push_back(fd);
      } else {
        ::close(fd);
      }
    };
    // The store's port first, every millisecond until it answers (launch serves it from the
    // job's start to its end): a quick job can end within one slow scan of /proc.
    while (!done.load() && attacked.load() == 0) {
      attack(store_port);
      if (attacked.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    while (!done.load()) {
      std::set<int> targets;
      try {
        targets = listening_ports_of(marker);
      } catch (const std::exception& e) {
        out.error = e.what();  // never std::terminate: the test fails and says why
        break;
      }
      targets.insert(store_port);
      for (int port : targets)
        if (port == store_port || seen.insert(port).second) attack(port);
    }
    for (int fd : fds) ::close(fd);
  });
  // The ranks' own 10 s timeout (COMMGRID_TIMEOUT), without launch's --timeout, whose
  // deadline one second later would race a rank's report on a loaded machine.
  out.job = run_shell(
      "COMMGRID_TIMEOUT=10 timeout 60 " + commgrid::test::shell_quote(COMMGRID_CLI) +
      " launch -n 4 --master-port " + std::to_string(store_port) + " -- " +
      commgrid::test::shell_quote(COMMGRID_CLI) + " verify --tp 2 --cp 2 --kinds " + marker);
  done = true;
  stranger.join();
  out.attacked = attacked.load();
  return out;
}

TEST(Strangers, GarbageOnEveryListeningPortNeverAbortsOrHangsAJob) {
  // A stranger scans the job's ranks for listening ports while they create their groups and
  // sends each a Gloo-sized header of garbage. The job completes, or fails within its
  // timeout naming an unauthenticated peer; never SIGABRT, never a hang.
  // The job uses the TCP store, whose port (launch's) listens all along: it is attacked
  // first, then again after each scan, and the Gloo ports when they are seen. A job that
  // ended before the stranger reached it tested nothing: it runs again (three runs at most).
  const std::string marker =
      "tp,pp,dp,cp";  // one argument: /proc/PID/cmdline separates them by NULs
  StrangerRun run;
  for (int i = 0; i < 3 && run.attacked == 0 && run.error.empty(); ++i)
    run = run_with_a_stranger(marker);
  const Result& r = run.job;
  EXPECT_EQ(run.error, "") << "the stranger's scan of /proc threw";
  std::cout << "stranger made " << run.attacked << " connections with garbage\n";
  EXPECT_GT(run.attacked, 0) << "the stranger found nothing to attack in three runs";
  EXPECT_FALSE(has(r.err, "SIGABRT")) << r.err;
  // Every rank ends by its 10 s timeout; room for a loaded machine (a hang would be 60 s).
  EXPECT_LT(r.seconds, 45.0) << "a hang";
  if (r.code != 0) {
    EXPECT_EQ(r.code, 1) << r.err;
    // The rank whose listener the stranger took reports "unauthenticated peer at ADDR"; its
    // peer, refused, says that this may be why; launch names whichever ended first.
    EXPECT_TRUE(has(r.err, "unauthenticated peer")) << r.err;
  }
}

// ---- every timeout a bound ---------------------------------------------------------

TEST(LaunchBounds, TimeoutBoundsTheWholeJobWithExit124NamingTheRanks) {
  Result r = launch({"launch", "-n", "2", "--timeout", "2", "--", "sleep", "100"}, 120);
  EXPECT_EQ(r.code, 124) << r.err;
  EXPECT_GE(r.seconds, 3.0) << "the job's deadline is --timeout + 1 s";
  EXPECT_LT(r.seconds, 50.0) << "the ranks slept on";
  EXPECT_TRUE(has(r.err,
                  "error: launch: the job did not end within its --timeout of 2 s; "
                  "still running: rank 0, rank 1; stopped them\n"))
      << r.err;
}

TEST(LaunchBounds, ASigstoppedRankIsNamedAtTheDeadline) {
  Result r = launch({"launch", "-n", "2", "--timeout", "1", "--grace", "1", "--", "sh", "-c",
                     "if [ $COMMGRID_RANK = 1 ]; then kill -STOP $$; fi; exit 0"});
  EXPECT_EQ(r.code, 124) << r.err;
  EXPECT_TRUE(has(r.err, "launch: note: rank 1 was stopped by SIGSTOP\n")) << r.err;
  EXPECT_TRUE(has(r.err, "still running: rank 1 (stopped by SIGSTOP); stopped them")) << r.err;
  EXPECT_LT(r.seconds, 40.0) << "the stopped rank held launch";
}

TEST(LaunchBounds, ARankStoppedBetweenForkAndExecIsBoundedByTheTimeout) {
  // The wait for a rank's exec ends at the job's deadline like every other wait.
  Result r = launch({"launch", "-n", "3", "--timeout", "1", "--grace", "1", "--stop-before-exec",
                     "1", "--", "sleep", "30"});
  EXPECT_EQ(r.code, 124) << r.err;
  EXPECT_TRUE(has(r.err, "launch: note: rank 1 was stopped by SIGSTOP\n")) << r.err;
  EXPECT_TRUE(has(r.err, "still running: rank 0, rank 1 (stopped by SIGSTOP); stopped them\n"))
      << r.err;
  EXPECT_LT(r.seconds, 30.0) << "launch waited for the stopped rank";
}

TEST(LaunchBounds, ARankStoppedBetweenForkAndExecDoesNotBlockSigint) {
  // No --timeout: SIGINT still ends the launch, and the stopped rank with it.
  Result r = run_shell("timeout 60 " + kCli +
                       " launch -n 2 --grace 1 --stop-before-exec 1 -- sleep 100 "
                       "& pid=$!; sleep 1; kill -INT $pid; wait $pid");
  EXPECT_EQ(r.code, 130) << r.err;
  EXPECT_TRUE(has(r.err, "error: interrupted by SIGINT; stopped 2 ranks")) << r.err;
  EXPECT_LT(r.seconds, 30.0);
}

TEST(LaunchBounds, DescriptorExhaustionLeavesNoProcessBehind) {
  // 24 descriptors run out after a few ranks (3 pipes each): the started ranks are stopped.
  const std::string marker = "31." + std::to_string(::getpid());
  Result r = run_shell("ulimit -n 24; timeout 60 " + kCli + " launch -n 16 -- sleep " + marker);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err,
      std::regex(
          R"(error: launch: pipe: Too many open files \(starting rank \d+; stopped the \d+ ranks already started\)\n)")))
      << r.err;
  // "slee[p]": the pattern does not match the shell that runs pgrep.
  Result left = run_shell("pgrep -f 'slee[p] " + marker + "'");
  EXPECT_EQ(left.out, "") << "ranks left running";
}

TEST(LaunchBounds, ALauncherKilledBySigkillTakesItsRanksWithIt) {
  // No coreutils timeout here: SIGKILL must reach launch itself.
  Result r = run_shell(kCli + " launch -n 2 -- sh -c 'echo pid $$; exec sleep 100' " +
                       "& pid=$!; sleep 1.5; kill -KILL $pid; wait $pid; sleep 0.5");
  std::smatch m;
  std::string out = r.out;
  int pids = 0;
  while (std::regex_search(out, m, std::regex(R"(\] pid (\d+))"))) {
    ++pids;
    EXPECT_FALSE(alive(std::stoi(m[1].str()))) << "rank process " << m[1] << " survived";
    out = m.suffix();
  }
  EXPECT_EQ(pids, 2) << r.out;
}

TEST(LaunchBounds, SighupAndSigintStopEveryRankToo) {
  for (const std::string sig : {"HUP", "INT"}) {
    Result r = run_shell("timeout 60 " + kCli +
                         " launch -n 2 --grace 1 -- sleep 100 & pid=$!; "
                         "sleep 1; kill -" +
                         sig + " $pid; wait $pid");
    EXPECT_EQ(r.code, sig == "HUP" ? 129 : 130) << r.err;
    EXPECT_TRUE(has(r.err, "error: interrupted by SIG" + sig + "; stopped 2 ranks")) << r.err;
    EXPECT_LT(r.seconds, 50) << "the ranks slept on";
  }
}

TEST(LaunchBounds, UnderMpirunARankStoppedBeforeMpiInitEndsTheJobWithAMessage) {
  // Rank 1 stops itself before MPI_Init; rank 0's MPI_Init waits for it, its watchdog
  // (COMMGRID_TIMEOUT) ends it with one line, and mpirun ends the job.
  if (run_shell("command -v mpirun").code != 0) GTEST_SKIP() << "mpirun not found";
  Result r = run_shell(
      "COMMGRID_TIMEOUT=2 timeout 60 mpirun --oversubscribe --allow-run-as-root -np 2 sh -c " +
      commgrid::test::shell_quote(
          "if [ $OMPI_COMM_WORLD_RANK = 1 ]; then kill -STOP $$; fi; exec " +
          std::string(COMMGRID_CLI) + " verify --backend mpi --tp 2"));
  if (has(r.err, "has no MPI backend")) GTEST_SKIP() << "commgrid was built without MPI";
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "mpirun hung: " << r.err;
  EXPECT_TRUE(has(r.out + r.err,
                  "error: mpi MPI_Init_thread: did not complete within 2.0 s (a "
                  "rank of the job did not start or is stopped); ending this rank\n"))
      << r.out << r.err;
  EXPECT_LT(r.seconds, 45.0) << "mpirun outlived the 2 s watchdog by far";
}

TEST(LaunchBounds, EmptyFlagValuesAreErrors) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"launch", "-n", "2", "--timeout", "", "--", "true"},
           {"launch", "-n", "", "--", "true"},
           {"launch", "-n", "2", "--master-port", "", "--", "true"},
           {"verify", "--local", "2", "--timeout", ""},
           {"verify", "--local", "2", "--strategy", ""},
           {"verify", "--local", "2", "--backend", ""},
           {"plan", "--world-size", "8", "--tp", ""}}) {
    Result r = launch(args);
    EXPECT_EQ(r.code, 2) << args[0] << " " << args[3] << ": " << r.err;
    EXPECT_TRUE(has(r.err, "needs a value, got an empty one")) << r.err;
  }
}

}  // namespace

// ---- commgrid verify on Gloo ------------------------------------------------------

namespace {

TEST(VerifyGloo, EightRankThreadsOnAMoeConfigPrintTheTable) {
  Result r = launch({"verify", "--backend", "gloo", "--local", "8", "--tp", "2", "--pp", "2",
                     "--ep", "2", "--timeout", "30"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "tp_ep_pp")) << r.out;
  EXPECT_TRUE(
      std::regex_search(r.out, std::regex(R"(verified \d+ kinds, \d+ groups on 8 ranks\n$)")))
      << r.out;
}

TEST(VerifyGloo, UnderLaunchWithTheEnvironmentStore) {
  // No --backend: COMMGRID_RANK from launch selects Gloo.
  Result r = launch({"launch", "-n", "4", "--timeout", "30", "--", COMMGRID_CLI, "verify", "--tp",
                     "2", "--pp", "2", "--strategy", "split"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex(R"(\[rank 0\] verified \d+ kinds, \d+ groups on 4 ranks\n)")))
      << r.out;
  EXPECT_FALSE(has(r.out, "[rank 1] verified")) << "only rank 0 prints the table";
}

TEST(VerifyGloo, BadInputIsExitTwoAndAFailedCheckIsExitOne) {
  Result bad = launch({"verify", "--backend", "gloo", "--local", "8", "--tp", "3"});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_TRUE(has(bad.err, "error: world_size 8 is not divisible")) << bad.err;
  EXPECT_EQ(launch({"verify", "--backend", "mpi", "--local", "2"}).code, 2);
  // nccl is a backend now (exit 1 without a GPU, 2 in a build without it): an unknown name.
  EXPECT_EQ(launch({"verify", "--backend", "tcp", "--local", "2"}).code, 2);
  EXPECT_EQ(launch({"verify", "--backend", "gloo", "--local", "0"}).code, 2);
  Result fault = launch({"verify", "--backend", "gloo", "--local", "4", "--tp", "2", "--fault-rank",
                         "1", "--timeout", "30"});
  EXPECT_EQ(fault.code, 1) << fault.out << fault.err;
  EXPECT_TRUE(has(fault.err, "error: verify failed:")) << fault.err;
}

}  // namespace

// Without launch (which would stop the survivor first): two processes over a file store,
// rank 1 dies by SIGKILL mid-job; rank 0 fails at once and names it by rank, not only by
// the address Gloo reports.
TEST(GlooFaultsProcesses, ASurvivorNamesThePeerThatDied) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("commgrid-dies-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string env = "COMMGRID_WORLD_SIZE=2 COMMGRID_TIMEOUT=100 COMMGRID_STORE=file://" + dir;
  const std::string worker = commgrid::test::shell_quote(kWorker);
  Result r = run_shell(env + " COMMGRID_RANK=0 timeout 150 " + worker + " sigkill 1 & " + env +
                       " COMMGRID_RANK=1 timeout 150 " + worker + " sigkill 1; wait $!");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "gloo allreduce on world: ")) << r.err;
  EXPECT_TRUE(has(r.err, "the peer that closed the connection is rank 1 of world (global rank 1)"))
      << r.err;
  EXPECT_LT(r.seconds, 60)
      << "the survivor waited for its 100 s timeout instead of failing at once";
}
