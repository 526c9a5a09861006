// commgrid launch --spares with real processes: one is killed by SIGKILL (rank 0 too: the
// store is served by launch), two die in a row with a restart, one is stopped and, once
// declared dead, continued and fenced; each job still ends with every rank's right result.
// Bad flags exit 2. The store dying (its launcher killed) ends every process of the job.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "cli_runner.hpp"
#include "free_port.hpp"

namespace commgrid::test {
namespace {

constexpr int kSteps = 6;

CliResult launch(const std::vector<std::string>& flags, const std::vector<std::string>& worker,
                 const std::string& timeout_s = "20", int limit_s = 200) {
  std::string cmd = "COMMGRID_TIMEOUT=" + timeout_s + " timeout " + std::to_string(limit_s) + " " +
                    shell_quote(COMMGRID_CLI) + " launch";
  for (const auto& f : flags) cmd += " " + shell_quote(f);
  cmd += " -- " + shell_quote(COMMGRID_RESILIENCE_WORKER);
  for (const auto& a : worker) cmd += " " + shell_quote(a);
  return run_shell(cmd);
}

// Every logical rank of the tp 2 world of 4 printed the sums of a run without failures:
// dp groups {0, 2} and {1, 3}, step s's sum (s + 1) * 4 or (s + 1) * 6; each in epoch
// `expected_epoch` (-1: the same epoch on every rank, 1 or later).
void expect_right_sums(const CliResult& r, int expected_epoch) {
  std::map<int, std::string> got;
  std::set<int> epochs;
  std::istringstream lines(r.out);
  std::string line;
  const std::regex re(R"(rank (\d+) epoch (\d+) sums(.*))");
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, re)) continue;
    const int rank = std::stoi(m[1]);
    EXPECT_EQ(got.count(rank), 0u) << "rank " << rank << " printed twice:\n" << r.out;
    got[rank] = m[3];
    epochs.insert(std::stoi(m[2]));
    if (expected_epoch >= 0) EXPECT_EQ(std::stoi(m[2]), expected_epoch) << line;
  }
  ASSERT_EQ(got.size(), 4u) << r.out << r.err;
  if (expected_epoch < 0) EXPECT_TRUE(epochs.size() == 1 && *epochs.begin() >= 1) << r.out;
  for (int rank = 0; rank < 4; ++rank) {
    std::string want;
    for (int s = 0; s < kSteps; ++s)
      want += " " + std::to_string((s + 1) * (rank % 2 == 0 ? 4 : 6));
    EXPECT_EQ(got[rank], want) << "rank " << rank;
  }
}

TEST(LaunchSpares, AKilledRankIsReplacedByTheSpareAndTheRunIsUnchanged) {
  const CliResult r =
      launch({"-n", "5", "--spares", "1"}, {std::to_string(kSteps), "kill", "1", "2"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  expect_right_sums(r, 1);
  EXPECT_NE(
      r.err.find(
          "process 1 (rank 1) killed by signal 9 (SIGKILL); posted it to the job's store (epoch 0)"),
      std::string::npos)
      << r.err;
}

TEST(LaunchSpares, RankZeroDiesAndTheStoreLivesOnInLaunch) {
  const CliResult r =
      launch({"-n", "5", "--spares", "1"}, {std::to_string(kSteps), "kill", "0", "3"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  expect_right_sums(r, 1);
}

TEST(LaunchSpares, TwoFailuresInARowWithARestartedProcessAsTheSecondSpare) {
  // Process 1 dies at step 2; the spare (process 4) takes rank 1 and dies at step 4; the
  // restarted process 1 takes it back.
  const CliResult r = launch({"-n", "5", "--spares", "1", "--max-restarts", "1"},
                             {std::to_string(kSteps), "kill", "1", "2", "kill", "4", "4"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  expect_right_sums(r, 2);
  EXPECT_NE(r.err.find("restarting it as a spare (restart 1 of 1)"), std::string::npos) << r.err;
}

TEST(LaunchSpares, ASpareThatDiesDuringTheRecoveryIsReplacedByTheNext) {
  // Process 1 dies at step 2; spare 4, chosen for its rank, dies right after the decision,
  // before the new world exists: the others' world creation fails (at its 6 s timeout),
  // and epoch 2 gives the rank to spare 5.
  const CliResult r = launch({"-n", "6", "--spares", "2"},
                             {std::to_string(kSteps), "kill", "1", "2", "killrec", "4", "1"}, "6");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  expect_right_sums(r, 2);
}

TEST(LaunchSpares, AStoppedRankIsDeclaredDeadAndFencedWhenContinued) {
  // Process 2 stops itself (SIGSTOP); after its peers' timeout (6 s) they declare it dead;
  // continued, it finds itself fenced and exits 1 saying so. The job finishes.
  const CliResult r =
      launch({"-n", "5", "--spares", "1"}, {std::to_string(kSteps), "stop", "2", "2"}, "6");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  expect_right_sums(r, 1);
  EXPECT_NE(r.err.find("process 2 was declared dead in epoch 1 and is fenced: it may not rejoin"),
            std::string::npos)
      << r.err;
}

// The test process as the subreaper of whatever it starts: a process whose parent dies is
// re-parented here, not to init, so none escapes unseen, and none is reaped by anyone else:
// its pid stays its own until this process reaps it, so a kill by pid hits no stranger.
class Reaper {
 public:
  Reaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }
  ~Reaper() {
    (void)kill_leftovers();
    ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  }
  Reaper(const Reaper&) = delete;
  Reaper& operator=(const Reaper&) = delete;

  // Starts `commgrid launch ARGS` with `env` added, stdout and stderr to files in dir.
  pid_t launch(const std::vector<std::string>& args, const std::vector<std::string>& env,
               const std::filesystem::path& out, const std::filesystem::path& err) {
    std::vector<std::string> argv_s{COMMGRID_CLI, "launch"}, env_s(env);
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    for (char** e = environ; *e != nullptr; ++e) env_s.emplace_back(*e);
    std::vector<char*> argv, envp;
    for (auto& a : argv_s) argv.push_back(a.data());
    for (auto& e : env_s) envp.push_back(e.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(in, STDIN_FILENO);
      ::dup2(o, STDOUT_FILENO);
      ::dup2(e, STDERR_FILENO);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    const int fork_errno = errno;
    for (int fd : {in, o, e}) ::close(fd);
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(fork_errno));
    return pid;
  }

  // Reaps every child, re-parented ones too, until none is left (true) or `limit` passes.
  bool reap_all(std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid > 0) {
        status_[pid] = status;
        continue;
      }
      if (pid < 0 && errno == ECHILD) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // The children of this process still running, each "PID (COMMAND)", killed and reaped.
  std::vector<std::string> kill_leftovers() {
    std::vector<std::string> seen;
    std::set<pid_t> killed;
    for (int round = 0; round < 500 && !reap_all(std::chrono::seconds(0)); ++round) {
      for (const auto& d : std::filesystem::directory_iterator("/proc")) {
        const std::string name = d.path().filename().string();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        const std::string stat = slurp(d.path() / "stat");
        const auto close = stat.rfind(')');
        if (close == std::string::npos) continue;
        char state = 0;
        int ppid = 0;
        std::istringstream(stat.substr(close + 1)) >> state >> ppid;
        if (ppid != ::getpid() || state == 'Z') continue;
        const pid_t pid = std::stoi(name);
        if (killed.insert(pid).second) seen.push_back(stat.substr(0, close + 1));
        ::kill(pid, SIGKILL);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return seen;
  }

  // The reaped processes' wait statuses.
  [[nodiscard]] const std::map<pid_t, int>& statuses() const { return status_; }

 private:
  std::map<pid_t, int> status_;
};

// What a process's wait status says, for messages.
std::string ended(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

bool killed_by(int status, int sig) { return WIFSIGNALED(status) && WTERMSIG(status) == sig; }

// A failure: killed by a signal, or an exit code other than 0.
bool failed(int status) {
  return WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
}

// A job under `commgrid launch --spares`: one launch of 5 processes (1 spare), or NODES
// launches of 2 (loopback "nodes" sharing node 0's store at --master-port; the last node's
// 2 are the spares), each running the worker with `worker` (its steps and faults); every
// process is reaped here, and each launch's stdout and stderr kept.
struct Job {
  Reaper reaper;
  std::vector<pid_t> launchers;
  std::vector<std::string> out, err;
  bool all_ended = false;  // every process ended within the bound
  std::vector<std::string> leftovers;
  std::string store;

  Job(int nodes, const std::vector<std::string>& worker, const std::string& timeout = "15") {
    const std::string port = std::to_string(free_port());
    store = "tcp://127.0.0.1:" + port;
    const auto dir = std::filesystem::temp_directory_path();
    const std::string stem = "commgrid-launch-job-" + std::to_string(::getpid()) + "-";
    const std::vector<std::string> env{"COMMGRID_JOB_ID=launch-job-" + port, "COMMGRID_TOKEN=sd"};
    for (int node = 0; node < nodes; ++node) {
      std::vector<std::string> flags{
          "-n",    nodes > 1 ? "2" : "5", "--spares", nodes > 1 ? "2" : "1", "--timeout",
          timeout, "--master-port",       port};
      if (nodes > 1)
        flags.insert(flags.end(),
                     {"--nnodes", std::to_string(nodes), "--node-rank", std::to_string(node)});
      flags.insert(flags.end(), {"--", COMMGRID_RESILIENCE_WORKER});
      flags.insert(flags.end(), worker.begin(), worker.end());
      const auto o = dir / (stem + std::to_string(node) + ".out"),
                 e = dir / (stem + std::to_string(node) + ".err");
      launchers.push_back(reaper.launch(flags, env, o, e));
      out.push_back(o.string());
      err.push_back(e.string());
    }
    // Far beyond the job's timeout: only a hang reaches it.
    all_ended = reaper.reap_all(std::chrono::seconds(150));
    leftovers = reaper.kill_leftovers();
    for (auto* files : {&out, &err})
      for (auto& f : *files) {
        const std::string path = std::exchange(f, slurp(f));
        std::filesystem::remove(path);
      }
  }

  [[nodiscard]] int status(std::size_t node) const { return reaper.statuses().at(launchers[node]); }
  // The processes reaped here that this test did not start: the orphans of a dead launcher.
  [[nodiscard]] std::vector<int> orphans() const {
    std::vector<int> v;
    for (auto [pid, st] : reaper.statuses())
      if (std::find(launchers.begin(), launchers.end(), pid) == launchers.end()) v.push_back(st);
    return v;
  }
  // Every node's stdout, node after node.
  [[nodiscard]] CliResult all_out() const {
    CliResult r;
    for (const auto& o : out) r.out += o;
    r.err = all();
    return r;
  }
  [[nodiscard]] std::string all() const {
    std::string s;
    for (std::size_t i = 0; i < err.size(); ++i)
      s += "--- node " + std::to_string(i) + " (" + ended(status(i)) + "):\n" + out[i] + err[i];
    return s;
  }
  // Every launcher exited 0 and nothing was left running.
  void expect_every_launcher_exits_zero() const {
    EXPECT_TRUE(all_ended) << all();
    EXPECT_TRUE(leftovers.empty()) << ::testing::PrintToString(leftovers) << all();
    for (std::size_t node = 0; node < launchers.size(); ++node)
      EXPECT_TRUE(WIFEXITED(status(node)) && WEXITSTATUS(status(node)) == 0)
          << "node " << node << ": " << ended(status(node)) << "\n"
          << all();
  }
};

// Process 0 SIGKILLs node 0's launcher, and with it the store, at step 2, once every
// process is up.
struct StoreDeath : Job {
  explicit StoreDeath(int nodes) : Job(nodes, {std::to_string(kSteps), "killlaunch", "0", "2"}) {}

  // Every process ended within the bound, none was left running, node 0's launcher was
  // SIGKILLed, and its processes (orphans_of_node_0 of them) failed (killed, or an exit
  // code).
  void expect_ended(std::size_t orphans_of_node_0) const {
    EXPECT_TRUE(all_ended) << all();
    EXPECT_TRUE(leftovers.empty()) << ::testing::PrintToString(leftovers) << all();
    EXPECT_TRUE(killed_by(status(0), SIGKILL)) << ended(status(0)) << all();
    // (At least: a sanitizer's helper process may be orphaned too.)
    const std::vector<int> v = orphans();
    std::string statuses;
    for (int st : v) statuses += " " + ended(st);
    EXPECT_GE(static_cast<std::size_t>(std::count_if(v.begin(), v.end(), failed)),
              orphans_of_node_0)
        << statuses << "\n"
        << all();
  }
};

TEST(LaunchSpares, OnOneNodeTheStoresLauncherTakesEveryProcessWithIt) {
  // One node: the store dies only with launch, and its processes die with it
  // (PR_SET_PDEATHSIG), or fail on the store's closed connections a moment before: none
  // is left waiting on a dead store.
  const StoreDeath job(1);
  job.expect_ended(5);
}

TEST(LaunchSpares, TheStoreDiesWithNodeZeroAndEveryOtherProcessEndsNamingIt) {
  // Three loopback nodes of 2: ranks 0-1, ranks 2-3, spares 4-5. Node 0's launcher, which
  // serves the store, is SIGKILLed with its ranks; the ranks of node 1 (blocked on them)
  // and the spares of node 2 (waiting on the store) end at once with a one-line error
  // naming the store and why, and their launchers exit 1.
  const StoreDeath job(3);
  job.expect_ended(2);
  for (std::size_t node : {1u, 2u}) {
    EXPECT_TRUE(WIFEXITED(job.status(node)) && WEXITSTATUS(job.status(node)) == 1)
        << "node " << node << ": " << ended(job.status(node)) << job.all();
    for (int p : {2 * static_cast<int>(node), 2 * static_cast<int>(node) + 1}) {
      // Node 2's processes are the spares, 0 and 1: they hold no rank.
      const std::string tag =
          (p < 4 ? "[rank " + std::to_string(p) : "[spare " + std::to_string(p - 4)) + "] ";
      std::istringstream lines(job.err[node]);
      std::vector<std::string> said;
      for (std::string line; std::getline(lines, line);)
        if (line.starts_with(tag)) said.push_back(line);
      ASSERT_EQ(said.size(), 1u) << "process " << p << " wrote one line\n" << job.all();
      EXPECT_TRUE(said[0].starts_with(tag + "error: ")) << said[0];
      EXPECT_NE(said[0].find(job.store), std::string::npos) << "names the store\n" << said[0];
      // and why, even where a first store error was caught on the way (Gloo's error path)
      EXPECT_NE(said[0].find("ended or failed"), std::string::npos) << "says why\n" << said[0];
      EXPECT_NE(job.err[node].find("process " + std::to_string(p) + " (" +
                                   tag.substr(1, tag.size() - 3) + ") exited with code 1"),
                std::string::npos)
          << job.all();
    }
  }
}

TEST(LaunchSpares, ASuccessfulMultiNodeJobExitsZeroOnEveryNodeItsUnusedSparesToo) {
  // Three loopback nodes of 2, no failure: the spares of node 2 end with 0 once the job is
  // done, because node 0's launcher serves the store until every node's processes ended.
  const Job job(3, {std::to_string(kSteps)});
  job.expect_every_launcher_exits_zero();
  expect_right_sums(job.all_out(), 0);
  EXPECT_EQ(job.err[2].find("exited with code"), std::string::npos) << job.all();
}

TEST(LaunchSpares, BothProcessesOfNodeZeroDieAndItsLauncherServesTheStoreToTheEnd) {
  // Node 0's two processes die at step 2: its launcher has no process left but serves the
  // store until the job ends; the spares of node 2 take logical ranks 0 and 1 and the job
  // finishes; every launcher exits 0.
  const Job job(3, {std::to_string(kSteps), "kill", "0", "2", "kill", "1", "2"});
  job.expect_every_launcher_exits_zero();
  expect_right_sums(job.all_out(), -1);
  EXPECT_NE(job.err[0].find("the job finished after recovering from: process "), std::string::npos)
      << job.all();
}

TEST(LaunchSpares, ALostNodeEndsTheWaitOfNodeZeroWithinItsBound) {
  // Process 2 SIGKILLs node 1's launcher (a lost host: its processes die with it); the
  // spares take ranks 2 and 3 and the job finishes. Node 0, whose processes are done, waits
  // for node 1's beats, finds none within the bound, and ends (exit 0: the job finished).
  // (--timeout 10: beats every 2.5 s, a node lost after 20 s without one.)
  const Job job(3, {std::to_string(kSteps), "killlaunch", "2", "2"}, "10");
  EXPECT_TRUE(job.all_ended) << job.all();
  EXPECT_TRUE(job.leftovers.empty()) << ::testing::PrintToString(job.leftovers) << job.all();
  EXPECT_TRUE(killed_by(job.status(1), SIGKILL)) << job.all();
  for (std::size_t node : {0u, 2u})
    EXPECT_TRUE(WIFEXITED(job.status(node)) && WEXITSTATUS(job.status(node)) == 0)
        << "node " << node << "\n"
        << job.all();
  EXPECT_NE(job.err[0].find("node 1's launcher sent no beat for "), std::string::npos) << job.all();
  expect_right_sums(job.all_out(), -1);
}

TEST(LaunchSpares, AProcessStoppedBeforeExecIsKilledAfterTheTimeout) {
  // Process 1 stops itself between fork and exec: launch waits --timeout for its exec, not
  // forever, then kills it and posts its death like any other. (Whether the job then goes on
  // is the program's: this worker recovers from failures once its first world exists.)
  const CliResult r =
      launch({"-n", "5", "--spares", "1", "--timeout", "10", "--stop-before-exec", "1"},
             {std::to_string(kSteps)}, "10", 120);
  EXPECT_NE(r.code, 124) << "launch waited on: " << r.err;
  EXPECT_TRUE(r.code == 0 || r.code == 1) << r.code << r.err;
  EXPECT_NE(r.err.find("launch: note: process 1 (rank 1) was stopped by SIGSTOP\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("launch: note: process 1 (rank 1) did not start within 10 s (stopped by "
                       "SIGSTOP); killed it\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("process 1 (rank 1) killed by signal 9 (SIGKILL); posted it to the job's "
                       "store (epoch 0)"),
            std::string::npos)
      << r.err;
  if (r.code == 0) expect_right_sums(r, 1);
}

TEST(LaunchSpares, BadFlagsExitTwo) {
  for (const auto& flags :
       std::vector<std::vector<std::string>>{{"-n", "4", "--spares", "1", "--max-restarts", "-1"},
                                             {"-n", "4", "--spares", "4"},
                                             {"-n", "4", "--spares", "-1"},
                                             {"-n", "4", "--max-restarts", "1"},
                                             {"-n", "2", "--nnodes", "2", "--node-rank", "0",
                                              "--master-port", "29999", "--spares", "1"}}) {
    const CliResult r = launch(flags, {"1"});
    std::string all;
    for (const auto& f : flags) all += f + " ";
    EXPECT_EQ(r.code, 2) << all << r.err;
    EXPECT_NE(r.err.find("error: "), std::string::npos) << all << r.err;
  }
}

}  // namespace
}  // namespace commgrid::test
