// `commgrid launch` end to end: real processes, the file store, output prefixes, exit codes,
// and faults (a rank exiting non-zero, a rank killed by SIGKILL, a rank never arriving).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <atomic>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "free_port.hpp"

namespace {

using Result = commgrid::test::CliResult;
using commgrid::test::run_shell;
using commgrid::test::free_port;

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

// ---- starting from other launchers, across nodes ------------------------------------


const std::string kCli = commgrid::test::shell_quote(COMMGRID_CLI);

// Whether a process exists and is not a zombie (an orphan's zombie stays until its new
// parent reaps it, which a container's init may never do).
bool alive(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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
  Result r = run_shell(start_ranks(4, [&](int i) {
    return "RANK=" + std::to_string(i) + " WORLD_SIZE=4 LOCAL_RANK=" + std::to_string(i) +
           " LOCAL_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port +
           " COMMGRID_TOKEN=t0rch";
  }, kCli + " verify --tp 2 --pp 2 --timeout 20"));
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(has(r.out, "exit " + std::to_string(i) + " 0\n")) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(verified \d+ kinds, \d+ groups on 4 ranks\n)")))
      << r.out;
  EXPECT_FALSE(has(r.out + r.err, "t0rch")) << "the token was shown";
}

TEST(Launchers, SlurmStyleVariablesStartAVerifiedJob) {
  const std::string port = std::to_string(free_port());
  Result r = run_shell(start_ranks(4, [&](int i) {
    return "SLURM_PROCID=" + std::to_string(i) + " SLURM_NTASKS=4 SLURM_LOCALID=" +
           std::to_string(i % 2) + " SLURM_NTASKS_PER_NODE=2 SLURM_JOB_ID=4242 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
           port;
  }, kCli + " verify --tp 2 --timeout 20"));
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(has(r.out, "exit " + std::to_string(i) + " 0\n")) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(verified \d+ kinds, \d+ groups on 4 ranks\n)")))
      << r.out;
}

TEST(Launchers, TwoLaunchesOfTwoNodesOverLoopbackVerifyOneJob) {
  const std::string port = std::to_string(free_port());
  // Node 1's launch writes to stderr, so that the two launches' lines stay apart.
  const std::string common = "COMMGRID_JOB_ID=two-nodes COMMGRID_TOKEN=n0des timeout 60 " + kCli +
                             " launch -n 2 --nnodes 2 --master-port " + port + " --timeout 20";
  Result j = run_shell("(" + common + " --node-rank 1 -- " + kCli +
                       " verify --tp 2 --pp 2 >&2; echo \"node1 $?\" >&2) & " + common +
                       " --node-rank 0 -- " + kCli + " verify --tp 2 --pp 2; echo \"node0 $?\"; wait");
  EXPECT_TRUE(has(j.out, "node0 0\n")) << j.out << j.err;
  EXPECT_TRUE(has(j.err, "node1 0\n")) << j.out << j.err;
  EXPECT_TRUE(std::regex_search(j.out, std::regex(R"(\[rank 0\] verified \d+ kinds, \d+ groups on 4 ranks\n)")))
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
  EXPECT_LT(std::stoi(m[1].str()), 2500) << "the second job did not fail at once";
}

// ---- strangers ---------------------------------------------------------------------

// The listening TCP ports of processes whose command line contains `marker`, read from
// /proc (socket inodes of their descriptors matched against /proc/net/tcp{,6}).
std::set<int> listening_ports_of(const std::string& marker) {
  std::set<std::string> inodes;
  for (const auto& d : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = d.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmd(d.path() / "cmdline", std::ios::binary);
    std::string line((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    if (line.find(marker) == std::string::npos || std::stoi(pid) == ::getpid()) continue;
    std::error_code ec;
    for (const auto& fd : std::filesystem::directory_iterator(d.path() / "fd", ec)) {
      const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
      if (target.starts_with("socket:[")) inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::set<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string row;
    std::getline(in, row);
    while (std::getline(in, row)) {
      std::istringstream f(row);
      std::string slot, local, remote, state, skip, inode;
      f >> slot >> local >> remote >> state;
      for (int i = 0; i < 5; ++i) f >> skip;
      f >> inode;
      if (state == "0A" && inodes.count(inode) != 0)
        ports.insert(std::stoi(local.substr(local.rfind(':') + 1), nullptr, 16));
    }
  }
  return ports;
}

TEST(Strangers, GarbageOnEveryListeningPortNeverAbortsOrHangsAJob) {
  // A stranger scans the job's ranks for listening ports while they create their groups and
  // sends each a Gloo-sized header of garbage. The job completes, or fails within its
  // timeout naming an unauthenticated peer; never SIGABRT, never a hang.
  // The job uses the TCP store, whose port (rank 0's) listens all along: it is attacked
  // with a new connection every few milliseconds, the Gloo ports when they are seen.
  const std::string marker = "tp,pp,dp,cp";  // one argument: /proc/PID/cmdline separates them by NULs
  const int store_port = free_port();
  std::atomic<bool> done{false};
  std::atomic<int> attacked{0};
  std::jthread stranger([&] {
    std::vector<int> fds;
    std::set<int> seen;
    while (!done.load()) {
      std::set<int> targets = listening_ports_of(marker);
      targets.insert(store_port);  // refused until rank 0 serves it
      for (int port : targets) {
        if (port != store_port && !seen.insert(port).second) continue;
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
      }
    }
    for (int fd : fds) ::close(fd);
  });
  Result r = launch({"launch", "-n", "4", "--master-port", std::to_string(store_port), "--timeout",
                     "10", "--", COMMGRID_CLI, "verify", "--tp", "2", "--cp", "2", "--kinds",
                     "tp,pp,dp,cp"});
  done = true;
  stranger.join();
  std::cout << "stranger made " << attacked.load() << " connections with garbage\n";
  EXPECT_GT(attacked.load(), 0) << "the stranger found nothing to attack";
  EXPECT_FALSE(has(r.err, "SIGABRT")) << r.err;
  EXPECT_LT(r.seconds, 15.0) << "a hang";
  if (r.code != 0) {
    EXPECT_EQ(r.code, 1) << r.err;
    // The rank whose listener the stranger took reports "unauthenticated peer at ADDR"; its
    // peer, refused, says that this may be why; launch names whichever ended first.
    EXPECT_TRUE(has(r.err, "unauthenticated peer")) << r.err;
  }
}

// ---- every timeout a bound ---------------------------------------------------------

TEST(LaunchBounds, TimeoutBoundsTheWholeJobWithExit124NamingTheRanks) {
  Result r = launch({"launch", "-n", "2", "--timeout", "2", "--", "sleep", "30"});
  EXPECT_EQ(r.code, 124) << r.err;
  EXPECT_LT(r.seconds, 4.0);
  EXPECT_TRUE(has(r.err, "error: launch: the job did not end within its --timeout of 2 s; "
                         "still running: rank 0, rank 1; stopped them\n"))
      << r.err;
}

TEST(LaunchBounds, ASigstoppedRankIsNamedAtTheDeadline) {
  Result r = launch({"launch", "-n", "2", "--timeout", "1", "--grace", "1", "--", "sh", "-c",
                     "if [ $COMMGRID_RANK = 1 ]; then kill -STOP $$; fi; exit 0"});
  EXPECT_EQ(r.code, 124) << r.err;
  EXPECT_TRUE(has(r.err, "launch: note: rank 1 was stopped by SIGSTOP\n")) << r.err;
  EXPECT_TRUE(has(r.err, "still running: rank 1 (stopped by SIGSTOP); stopped them")) << r.err;
  EXPECT_LT(r.seconds, 6.0);
}

TEST(LaunchBounds, DescriptorExhaustionLeavesNoProcessBehind) {
  // 24 descriptors run out after a few ranks (3 pipes each): the started ranks are stopped.
  const std::string marker = "31." + std::to_string(::getpid());
  Result r = run_shell("ulimit -n 24; timeout 60 " + kCli + " launch -n 16 -- sleep " + marker);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(error: launch: pipe: Too many open files \(starting rank \d+; stopped the \d+ ranks already started\)\n)")))
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
    Result r = run_shell("timeout 60 " + kCli + " launch -n 2 --grace 1 -- sleep 100 & pid=$!; "
                         "sleep 1; kill -" + sig + " $pid; wait $pid");
    EXPECT_EQ(r.code, sig == "HUP" ? 129 : 130) << r.err;
    EXPECT_TRUE(has(r.err, "error: interrupted by SIG" + sig + "; stopped 2 ranks")) << r.err;
    EXPECT_LT(r.seconds, 10);
  }
}

TEST(LaunchBounds, UnderMpirunARankStoppedBeforeMpiInitEndsTheJobWithAMessage) {
  // Rank 1 stops itself before MPI_Init; rank 0's MPI_Init waits for it, its watchdog
  // (COMMGRID_TIMEOUT) ends it with one line, and mpirun ends the job.
  if (run_shell("command -v mpirun").code != 0) GTEST_SKIP() << "mpirun not found";
  Result r = run_shell(
      "COMMGRID_TIMEOUT=2 timeout 60 mpirun --oversubscribe --allow-run-as-root -np 2 sh -c " +
      commgrid::test::shell_quote("if [ $OMPI_COMM_WORLD_RANK = 1 ]; then kill -STOP $$; fi; exec " +
                                  std::string(COMMGRID_CLI) + " verify --backend mpi --tp 2"));
  if (has(r.err, "has no MPI backend")) GTEST_SKIP() << "commgrid was built without MPI";
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "mpirun hung: " << r.err;
  EXPECT_TRUE(has(r.out + r.err, "error: mpi MPI_Init_thread: did not complete within 2.0 s (a "
                                 "rank of the job did not start or is stopped); ending this rank\n"))
      << r.out << r.err;
  EXPECT_LT(r.seconds, 15.0);
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
  // nccl is a backend now (exit 1 without a GPU, 2 in a build without it): an unknown name.
  EXPECT_EQ(launch({"verify", "--backend", "tcp", "--local", "2"}).code, 2);
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
