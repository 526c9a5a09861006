// commgrid launch: starts N processes of one program on this machine, like torchrun: alone
// with a file store in a fresh temporary folder, or as one node of several (--nnodes) with
// the TCP store that rank 0 serves at --master-addr:--master-port.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "command.hpp"
#include "commgrid/error.hpp"
#include "layout_flags.hpp"

namespace commgrid::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::int64_t kMaxRanks = 1024;

/// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  [[nodiscard]] int get() const { return fd_; }
  [[nodiscard]] bool open() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

struct Pipe {
  Fd read, write;
};

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw Error(std::string("launch: pipe: ") + std::strerror(errno));
  return {Fd(fds[0]), Fd(fds[1])};
}

/// A fresh folder for the job's file store, removed with everything in it when the launch
/// ends, however it ends.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/commgrid-launch-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr)
      throw Error("launch: cannot create a store folder from " + pattern + ": " +
                  std::strerror(errno));
    path_ = std::filesystem::absolute(buf.data()).string();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Signals reach the loop through a self-pipe, so the handler does nothing unsafe.
int g_signal_write_fd = -1;
extern "C" void on_signal(int signo) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(signo);
  if (g_signal_write_fd >= 0) [[maybe_unused]] auto n = ::write(g_signal_write_fd, &b, 1);
  errno = saved;
}

/// Installs the launcher's handlers for SIGCHLD, SIGINT, SIGTERM and SIGHUP, and ignores
/// SIGPIPE (a closed stdout must not kill the launcher before it stops its ranks);
/// restores the previous dispositions when destroyed.
class SignalGuard {
 public:
  explicit SignalGuard(int write_fd) {
    g_signal_write_fd = write_fd;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    // Without SA_NOCLDSTOP: a rank stopped by SIGSTOP wakes the loop, which names it.
    sa.sa_flags = SA_RESTART;
    for (int s : kHandled) ::sigaction(s, &sa, &old_[index(s)]);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGPIPE, &ign, &old_pipe_);
  }
  ~SignalGuard() {
    for (int s : kHandled) ::sigaction(s, &old_[index(s)], nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    g_signal_write_fd = -1;
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

 private:
  static constexpr int kHandled[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};
  static size_t index(int s) {
    for (size_t i = 0; i < std::size(kHandled); ++i)
      if (kHandled[i] == s) return i;
    return 0;
  }
  struct sigaction old_[std::size(kHandled)] {};
  struct sigaction old_pipe_ {};
};

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGTTIN: return "SIGTTIN";
    case SIGTTOU: return "SIGTTOU";
    default: return "signal " + std::to_string(sig);
  }
}

std::string describe_status(int rank, int status) {
  if (WIFEXITED(status))
    return "rank " + std::to_string(rank) + " exited with code " +
           std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "rank " + std::to_string(rank) + " killed by signal " +
           std::to_string(WTERMSIG(status)) + " (" + signal_name(WTERMSIG(status)) + ")";
  return "rank " + std::to_string(rank) + " ended with status " + std::to_string(status);
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone (EPIPE): keep supervising the ranks
    done += static_cast<size_t>(n);
  }
}

/// One output stream of one rank, cut into lines that are each written whole with the
/// rank's prefix, so that concurrent ranks never interleave within a line.
struct Stream {
  Fd fd;
  int target = STDOUT_FILENO;
  std::string pending;

  void emit(const std::string& prefix, bool flush_partial) {
    size_t start = 0, nl;
    std::string out;
    while ((nl = pending.find('\n', start)) != std::string::npos) {
      out += prefix;
      out.append(pending, start, nl - start + 1);
      start = nl + 1;
    }
    pending.erase(0, start);
    // A line without a newline is shown when the stream ends, or once it is very long.
    if (!pending.empty() && (flush_partial || pending.size() > 65536)) {
      out += prefix + pending + "\n";
      pending.clear();
    }
    if (!out.empty()) write_all(target, out);
  }
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  bool stopped = false;  // by SIGSTOP/SIGTSTP/..., until continued
  int stop_signal = 0;
  int status = 0;
  Stream out, err;
};

/// A random hex string (std::random_device reads the kernel's getrandom on Linux).
std::string random_hex(size_t bytes) {
  std::random_device rd;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned v = rd() & 0xff;
    out += kHex[v >> 4];
    out += kHex[v & 15];
  }
  return out;
}

/// Where and how this launch's ranks meet.
struct JobSetup {
  int nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a file store in a temporary folder (one node only)
  std::string job_id, token;
};

double parse_seconds(const char* param, const std::string& text, bool allow_zero) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(begin, &end);
  if (text.empty() || end != begin + text.size() || errno != 0 || !std::isfinite(v) ||
      v < 0 || (!allow_zero && v == 0) || v > 1e9)
    throw InvalidValueError(param, std::string(param) + " must be a " +
                                       (allow_zero ? "non-negative" : "positive") +
                                       " number of seconds, got '" + text + "'");
  return v;
}

struct LaunchArgs {
  std::string nproc, timeout, grace = "5", nnodes = "1", node_rank, master_addr, master_port;
  std::vector<std::string> command;
};

class Launcher {
 public:
  Launcher(int n, std::optional<std::string> timeout, double grace, JobSetup job,
           std::vector<std::string> command)
      : n_(n), timeout_(std::move(timeout)), grace_(grace), job_(std::move(job)),
        command_(std::move(command)) {}

  int run() {
    std::optional<TempDir> folder;
    std::string store;
    if (job_.master_port == 0) {
      folder.emplace();
      store = "file://" + folder->path();
    } else {
      store = "tcp://" + job_.master_addr + ":" + std::to_string(job_.master_port);
    }
    Pipe sig = make_pipe();
    ::fcntl(sig.read.get(), F_SETFL, O_NONBLOCK);
    ::fcntl(sig.write.get(), F_SETFL, O_NONBLOCK);
    SignalGuard guard(sig.write.get());
    children_.resize(static_cast<size_t>(n_));
    if (timeout_) {
      // The ranks' operations are bounded by T each; the job as a whole by T and a second,
      // so that a rank's own timeout error (which names the missing peer) is seen first.
      const double t = std::strtod(timeout_->c_str(), nullptr);
      job_deadline_ = Clock::now() + std::chrono::milliseconds(std::llround(t * 1000.0) + 1000);
    }
    for (int i = 0; i < n_; ++i) {
      std::optional<std::string> failure;
      try {
        failure = start(i, store);
      } catch (const Error& e) {
        // Out of processes or descriptors (ulimit): nothing of this job may outlive launch.
        failure = std::string(e.what()) + " (starting rank " +
                  std::to_string(global_rank(i)) + "; stopped the " + std::to_string(i) +
                  " ranks already started)";
        stop_all(SIGKILL);
        while (any_running()) reap(true);
        std::cerr << ("error: " + *failure + "\n") << std::flush;
        return 1;
      }
      if (failure) {
        stop_all(SIGKILL);
        while (any_running()) reap(true);
        std::cerr << ("error: " + *failure + "\n") << std::flush;
        return 2;
      }
    }
    loop(sig.read.get());
    if (timed_out_) {
      std::cerr << ("error: launch: the job did not end within its --timeout of " + *timeout_ +
                    " s; still running: " + still_running_ + "; stopped them\n")
                << std::flush;
      return 124;
    }
    if (interrupted_ != 0) {
      std::cerr << "error: interrupted by " << signal_name(interrupted_) << "; stopped "
                << n_ << " ranks\n";
      return 128 + interrupted_;
    }
    if (failure_) {
      std::cerr << "error: " << *failure_ << "\n";
      if (!also_failed_.empty()) {
        std::cerr << "note: also failed at about the same time:";
        for (const auto& f : also_failed_) std::cerr << " " << f << ";";
        std::cerr << "\n";
      }
      return 1;
    }
    return 0;
  }

 private:
  // Starts rank r; returns a message when the program cannot be executed at all.
  [[nodiscard]] int global_rank(int local) const { return job_.node_rank * n_ + local; }

  std::optional<std::string> start(int local, const std::string& store) {
    const int r = global_rank(local);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string_view kv(*e);
      if (kv.starts_with("COMMGRID_RANK=") || kv.starts_with("COMMGRID_WORLD_SIZE=") ||
          kv.starts_with("COMMGRID_STORE=") || kv.starts_with("COMMGRID_LOCAL_RANK=") ||
          kv.starts_with("COMMGRID_LOCAL_WORLD_SIZE=") || kv.starts_with("COMMGRID_JOB_ID=") ||
          kv.starts_with("COMMGRID_TOKEN=") ||
          (timeout_ && kv.starts_with("COMMGRID_TIMEOUT=")))
        continue;
      env_strings.emplace_back(kv);
    }
    env_strings.push_back("COMMGRID_RANK=" + std::to_string(r));
    env_strings.push_back("COMMGRID_WORLD_SIZE=" + std::to_string(n_ * job_.nnodes));
    env_strings.push_back("COMMGRID_LOCAL_RANK=" + std::to_string(local));
    env_strings.push_back("COMMGRID_LOCAL_WORLD_SIZE=" + std::to_string(n_));
    env_strings.push_back("COMMGRID_STORE=" + store);
    env_strings.push_back("COMMGRID_JOB_ID=" + job_.job_id);
    if (!job_.token.empty()) env_strings.push_back("COMMGRID_TOKEN=" + job_.token);
    if (timeout_) env_strings.push_back("COMMGRID_TIMEOUT=" + *timeout_);
    // Everything the child needs is prepared before fork: after it, only async-signal-safe
    // calls are allowed.
    std::vector<char*> envp, argv;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    for (auto& s : command_) argv.push_back(s.data());
    argv.push_back(nullptr);

    Pipe out = make_pipe(), err = make_pipe(), exec_status = make_pipe();
    Fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    const pid_t launcher_pid = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) throw Error(std::string("launch: fork: ") + std::strerror(errno));
    if (pid == 0) {
      // Its own process group, so that stopping a rank stops what it started too.
      ::setpgid(0, 0);
      // A launch killed by SIGKILL cannot stop its ranks; the kernel does it for it.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher_pid) ::_exit(127);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(s, &dfl, nullptr);
      if (devnull.open()) ::dup2(devnull.get(), STDIN_FILENO);
      ::dup2(out.write.get(), STDOUT_FILENO);
      ::dup2(err.write.get(), STDERR_FILENO);
      ::execvpe(argv[0], argv.data(), envp.data());
      const int e = errno;
      [[maybe_unused]] auto n = ::write(exec_status.write.get(), &e, sizeof(e));
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here: whichever runs first, the group exists before a kill
    out.write.reset();
    err.write.reset();
    exec_status.write.reset();
    Child& c = children_[static_cast<size_t>(local)];
    c.rank = r;
    c.pid = pid;
    c.running = true;
    c.out.fd = std::move(out.read);
    c.out.target = STDOUT_FILENO;
    c.err.fd = std::move(err.read);
    c.err.target = STDERR_FILENO;
    // exec closes the CLOEXEC pipe (EOF, success) or the child reports errno through it.
    int e = 0;
    ssize_t got;
    do got = ::read(exec_status.read.get(), &e, sizeof(e));
    while (got < 0 && errno == EINTR);
    if (got == static_cast<ssize_t>(sizeof(e)))
      return "cannot execute '" + command_.front() + "' (rank " + std::to_string(r) +
             "): " + std::strerror(e);
    return std::nullopt;
  }

  bool any_running() const {
    for (const auto& c : children_)
      if (c.running) return true;
    return false;
  }

  void stop_all(int sig) {
    for (auto& c : children_)
      if (c.running) {
        ::kill(-c.pid, sig);
        if (sig != SIGKILL && c.stopped) ::kill(-c.pid, SIGCONT);  // else TERM waits forever
      }
  }

  // The ranks still running, each with "(stopped by SIGSTOP)" when it is.
  std::string running_list() const {
    std::string out;
    for (const auto& c : children_)
      if (c.running) {
        out += (out.empty() ? "rank " : ", rank ") + std::to_string(c.rank);
        if (c.stopped) out += " (stopped by " + signal_name(c.stop_signal) + ")";
      }
    return out;
  }

  void begin_stop() {
    if (stopping_) return;
    stopping_ = true;
    stop_all(SIGTERM);
    kill_at_ = Clock::now() + std::chrono::milliseconds(static_cast<long long>(grace_ * 1000));
  }

  void reap(bool block) {
    std::vector<Child*> failed_now;
    for (auto& c : children_) {
      if (!c.running) continue;
      int status = 0;
      pid_t got = ::waitpid(c.pid, &status, block ? 0 : (WNOHANG | WUNTRACED | WCONTINUED));
      if (got != c.pid) continue;
      if (WIFSTOPPED(status)) {
        c.stopped = true;
        c.stop_signal = WSTOPSIG(status);
        std::cerr << ("launch: note: rank " + std::to_string(c.rank) + " was stopped by " +
                      signal_name(c.stop_signal) + "\n")
                  << std::flush;
        continue;
      }
      if (WIFCONTINUED(status)) {
        c.stopped = false;
        continue;
      }
      c.running = false;
      c.status = status;
      // Anything the rank started in its group goes with it.
      ::kill(-c.pid, SIGKILL);
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !stopping_) failed_now.push_back(&c);
      if (block) break;
    }
    if (failed_now.empty()) return;
    // Ranks found failed in one pass ended within moments of each other, and the order in
    // which they are reaped is fork order, not exit order. A death by signal (a crash, the
    // OOM killer) is likelier the cause than an exit code (often a peer's reaction to it),
    // so it is named first; the others are listed after it.
    std::stable_sort(failed_now.begin(), failed_now.end(), [](const Child* a, const Child* b) {
      return WIFSIGNALED(a->status) && !WIFSIGNALED(b->status);
    });
    failure_ = describe_status(failed_now.front()->rank, failed_now.front()->status);
    for (size_t i = 1; i < failed_now.size(); ++i)
      also_failed_.push_back(describe_status(failed_now[i]->rank, failed_now[i]->status));
    begin_stop();
  }

  void loop(int signal_fd) {
    std::optional<Clock::time_point> drain_until;
    for (;;) {
      std::vector<pollfd> fds{{signal_fd, POLLIN, 0}};
      std::vector<std::pair<Child*, Stream*>> owners{{nullptr, nullptr}};
      for (auto& c : children_)
        for (Stream* s : {&c.out, &c.err})
          if (s->fd.open()) {
            fds.push_back({s->fd.get(), POLLIN, 0});
            owners.emplace_back(&c, s);
          }
      const bool running = any_running();
      if (!running && fds.size() == 1) return;
      if (!running && !drain_until) drain_until = Clock::now() + std::chrono::seconds(2);
      if (drain_until && Clock::now() >= *drain_until) {
        // A process the rank left behind still holds its output open; it was killed with
        // the rank's group, so what remains is not worth waiting for.
        for (auto& c : children_) {
          c.out.emit(prefix(c.rank), true);
          c.err.emit(prefix(c.rank), true);
          c.out.fd.reset();
          c.err.fd.reset();
        }
        return;
      }
      int wait_ms = 200;
      if (job_deadline_ && !stopping_) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*job_deadline_ - Clock::now());
        wait_ms = static_cast<int>(std::clamp<long long>(left.count(), 0, 200));
      }
      if (stopping_ && running) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at_ - Clock::now());
        wait_ms = static_cast<int>(std::clamp<long long>(left.count(), 0, 200));
      }
      int ready = ::poll(fds.data(), fds.size(), wait_ms);
      if (ready < 0 && errno != EINTR)
        throw Error(std::string("launch: poll: ") + std::strerror(errno));
      if (ready > 0) {
        if (fds[0].revents & POLLIN) on_signals(signal_fd);
        for (size_t i = 1; i < fds.size(); ++i) {
          if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          auto [child, stream] = owners[i];
          char buf[65536];
          ssize_t n = ::read(stream->fd.get(), buf, sizeof(buf));
          if (n > 0) {
            stream->pending.append(buf, static_cast<size_t>(n));
            stream->emit(prefix(child->rank), false);
          } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
            stream->emit(prefix(child->rank), true);
            stream->fd.reset();
          }
        }
      }
      reap(false);
      if (job_deadline_ && !stopping_ && any_running() && Clock::now() >= *job_deadline_) {
        timed_out_ = true;
        still_running_ = running_list();
        begin_stop();
      }
      if (stopping_ && any_running() && Clock::now() >= kill_at_) stop_all(SIGKILL);
    }
  }

  void on_signals(int signal_fd) {
    unsigned char b[64];
    ssize_t n;
    while ((n = ::read(signal_fd, b, sizeof(b))) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        if (b[i] == SIGCHLD) continue;  // reaped after every wake-up
        if (interrupted_ != 0) {
          stop_all(SIGKILL);  // a second Ctrl-C means now
          continue;
        }
        interrupted_ = b[i];
        begin_stop();
      }
    }
  }

  static std::string prefix(int rank) { return "[rank " + std::to_string(rank) + "] "; }

  int n_;
  std::optional<std::string> timeout_;
  double grace_;
  JobSetup job_;
  std::vector<std::string> command_;
  std::optional<Clock::time_point> job_deadline_;
  bool timed_out_ = false;
  std::string still_running_;
  std::vector<Child> children_;
  std::optional<std::string> failure_;
  std::vector<std::string> also_failed_;
  bool stopping_ = false;
  Clock::time_point kill_at_{};
  int interrupted_ = 0;
};

}  // namespace

Command add_launch_command(CLI::App& root) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* app = root.add_subcommand(
      "launch",
      "Start N processes of PROGRAM on this machine with COMMGRID_RANK, COMMGRID_WORLD_SIZE, "
      "COMMGRID_STORE, COMMGRID_JOB_ID and COMMGRID_TOKEN (alone: a file store in a fresh "
      "temporary folder; with --nnodes or --master-port: the TCP store rank 0 serves); "
      "prefix their output with [rank i]; stop all if one fails");
  app->add_option("-n,--nproc,--nproc-per-node", args->nproc,
                  "Number of processes (ranks) on this node, 1-1024")->required()->type_name("INT");
  app->add_option("--nnodes", args->nnodes, "Number of nodes (launches) of the job (default 1)")->type_name("INT");
  app->add_option("--node-rank", args->node_rank,
                  "This node's index, 0 ... nnodes-1: its ranks are node_rank*n ... "
                  "node_rank*n+n-1 (required with --nnodes > 1)")->type_name("INT");
  app->add_option("--master-addr", args->master_addr,
                  "Address of node 0, where rank 0 serves the TCP store (default 127.0.0.1)");
  app->add_option("--master-port", args->master_port,
                  "Port of the TCP store on node 0 (required with --nnodes > 1)")->type_name("INT");
  app->add_option("--timeout", args->timeout,
                  "Seconds: bound of every rendezvous and collective of the ranks (exported as "
                  "COMMGRID_TIMEOUT) and, one second later, of the whole job (exit 124)")->type_name("SECONDS");
  app->add_option("--grace", args->grace,
                  "Seconds between SIGTERM and SIGKILL when stopping the ranks (default 5)");
  app->add_option("command", args->command, "-- PROGRAM ARGS...")->required();
  return {app, [args]() -> int {
            const auto n = parse_integer("-n", args->nproc, 1, kMaxRanks);
            JobSetup job;
            job.nnodes = static_cast<int>(parse_integer("--nnodes", args->nnodes, 1, kMaxRanks));
            if (n * job.nnodes > kMaxRanks)
              throw InvalidValueError("--nnodes", "launch: -n " + std::to_string(n) +
                                                      " times --nnodes " +
                                                      std::to_string(job.nnodes) +
                                                      " exceeds " + std::to_string(kMaxRanks) +
                                                      " ranks");
            if (!args->node_rank.empty())
              job.node_rank = static_cast<int>(
                  parse_integer("--node-rank", args->node_rank, 0, job.nnodes - 1));
            else if (job.nnodes > 1)
              throw ConfigError("--node-rank", "launch: --nnodes " + std::to_string(job.nnodes) +
                                                   " needs --node-rank (0 ... " +
                                                   std::to_string(job.nnodes - 1) + ")");
            if (!args->master_addr.empty()) job.master_addr = args->master_addr;
            if (!args->master_port.empty())
              job.master_port = static_cast<int>(parse_integer("--master-port", args->master_port, 1, 65535));
            else if (job.nnodes > 1)
              throw ConfigError("--master-port", "launch: --nnodes " + std::to_string(job.nnodes) +
                                                     " needs --master-port (the TCP store of node 0)");
            // The job's identity: the user's or scheduler's, else (one node) a fresh one.
            // Several nodes must share it, so they cannot each make one up.
            const char* id = std::getenv("COMMGRID_JOB_ID");
            const char* token = std::getenv("COMMGRID_TOKEN");
            if (id != nullptr && *id == '\0')
              throw InvalidValueError("COMMGRID_JOB_ID", "COMMGRID_JOB_ID is set but empty");
            if (token != nullptr && *token == '\0')
              throw InvalidValueError("COMMGRID_TOKEN", "COMMGRID_TOKEN is set but empty");
            if (job.nnodes > 1) {
              job.job_id = id ? id : "launch-" + job.master_addr + "-" + std::to_string(job.master_port);
              job.token = token ? token : "";
              if (!token)
                std::cerr << "launch: note: COMMGRID_TOKEN is not set: the ranks of this "
                             "multi-node job do not authenticate each other (set the same "
                             "COMMGRID_JOB_ID and COMMGRID_TOKEN on every node; see "
                             "docs/security.md)\n" << std::flush;
            } else {
              job.job_id = id ? id : "launch-" + random_hex(8);
              job.token = token ? token : random_hex(32);
            }
            std::optional<std::string> timeout;
            if (!args->timeout.empty()) {
              parse_seconds("--timeout", args->timeout, false);
              timeout = args->timeout;
            }
            const double grace = parse_seconds("--grace", args->grace, true);
            if (args->command.empty() || args->command.front().empty())
              throw ConfigError("command", "launch: no program given (usage: commgrid launch "
                                           "-n N -- PROGRAM ARGS...)");
            std::cout.flush();
            return Launcher(static_cast<int>(n), timeout, grace, job, args->command).run();
          }};
}

}  // namespace commgrid::cli
