// commgrid launch: starts N processes of one program on this machine, like torchrun: alone
// with a file store in a fresh temporary folder, or as one node of several (--nnodes) with
// the TCP store that rank 0 serves at --master-addr:--master-port. Each rank gets
// commgrid's variables and torchrun's (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), so
// a torch program's init_process_group("gloo") starts with env:// under it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
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
#include <string_view>
#include <vector>

#include "cli_errors.hpp"
#include "command.hpp"
#include "commgrid/error.hpp"
#include "commgrid/rank_map.hpp"
#include "layout_flags.hpp"
#if COMMGRID_HAS_BOOTSTRAP
#include "commgrid/resilience_keys.hpp"
#include "commgrid/store.hpp"
#endif

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
  if (g_signal_write_fd >= 0) [[maybe_unused]]
    auto n = ::write(g_signal_write_fd, &b, 1);
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
  struct sigaction old_[std::size(kHandled)]{};
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

/// How the ranks' output reaches launch's own stdout and stderr (--output).
enum class OutputMode {
  prefixed,  ///< every line of every rank, as "[rank i] line"
  raw,       ///< every line of every rank as it is (still whole lines, never interleaved)
  rank0,     ///< rank 0's lines as they are; other ranks' stderr prefixed, their stdout dropped
};

/// One output stream of one rank, cut into lines that are each written whole (with the
/// rank's prefix, if any), so that concurrent ranks never interleave within a line.
struct Stream {
  Fd fd;
  int target = STDOUT_FILENO;
  std::string prefix;  ///< "[rank i] " or ""
  bool show = true;    ///< false: read and dropped (--output rank0, another rank's stdout)
  std::string pending;

  void emit(bool flush_partial) {
    if (!show) {
      pending.clear();
      return;
    }
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
  int rank = 0;         // the process number (the rank without spares)
  int incarnation = 0;  // 0, then one more for each restart (--max-restarts)
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
  /// torch's MASTER_PORT: never commgrid's store port, which rank 0 of a commgrid program
  /// serves at the same address (--master-port + 1, or a free port on one node).
  int torch_port = 0;
  std::string job_id, token;
  /// --spares S: the last S processes of the job hold no rank; launch keeps the job going
  /// when a process dies and posts its death to the store it serves. `resilient` whenever
  /// --spares is given, 0 included (a job that shrinks when a process dies).
  int spares = 0;
  bool resilient = false;
  int max_restarts = 0;  ///< --max-restarts R: dead processes restarted as spares
};

/// The variables launch sets for each rank, commgrid's and torchrun's: an inherited value
/// of any of them (an outer launch, torchrun) is replaced, never passed on.
constexpr std::string_view kRankVariables[] = {
    "COMMGRID_RANK", "COMMGRID_WORLD_SIZE", "COMMGRID_LOCAL_RANK", "COMMGRID_LOCAL_WORLD_SIZE",
    "COMMGRID_STORE", "COMMGRID_JOB_ID", "COMMGRID_TOKEN",
    // torchrun's (torch.distributed.run), so that env:// finds its world.
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    // --spares (docs/resilience.md).
    "COMMGRID_PROCESS", "COMMGRID_NUM_PROCESSES", "COMMGRID_SPARES", "COMMGRID_INCARNATION",
    "COMMGRID_STORE_SERVED"};

bool is_rank_variable(std::string_view kv) {
  const std::string_view name = kv.substr(0, kv.find('='));
  for (std::string_view v : kRankVariables)
    if (name == v) return true;
  return false;
}

/// A TCP port that nothing listens on right now (the kernel's choice), for torch's store
/// on a one-node launch; 0 when none can be had (no sockets here: MASTER_PORT is then left
/// unset, and a torch program says so). Like torchrun's, it is free when chosen: a process
/// that takes it before rank 0 does makes rank 0's init_process_group fail, naming the port.
int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  const Fd owned(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return 0;
  return ntohs(a.sin_port);
}

double parse_seconds(const char* param, const std::string& text, bool allow_zero) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(begin, &end);
  if (text.empty() || end != begin + text.size() || errno != 0 || !std::isfinite(v) || v < 0 ||
      (!allow_zero && v == 0) || v > 1e9)
    throw InvalidValueError(param, std::string(param) + " must be a " +
                                       (allow_zero ? "non-negative" : "positive") +
                                       " number of seconds, got '" + text + "'");
  return v;
}

OutputMode parse_output(const std::string& text) {
  if (text == "prefixed") return OutputMode::prefixed;
  if (text == "raw") return OutputMode::raw;
  if (text == "rank0") return OutputMode::rank0;
  throw InvalidValueError("--output",
                          "--output: expected prefixed, raw or rank0, got '" + text + "'");
}

struct LaunchArgs {
  std::string nproc, timeout, grace = "5", nnodes = "1", node_rank, master_addr, master_port;
  std::string rdzv_id, output = "prefixed", stop_before_exec, spares, max_restarts;
  bool standalone = false;
  std::vector<std::string> command;
};

/// Blocks every signal for as long as it lives (around fork, so that no handler of launch
/// runs in a child before the child has reset them), and restores the mask.
class BlockSignals {
 public:
  BlockSignals() {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &old_);
  }
  ~BlockSignals() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  BlockSignals(const BlockSignals&) = delete;
  BlockSignals& operator=(const BlockSignals&) = delete;
  [[nodiscard]] const sigset_t& old() const { return old_; }

 private:
  sigset_t old_{};
};

class Launcher {
 public:
  Launcher(int n, std::optional<std::string> timeout, double grace, JobSetup job,
           std::vector<std::string> command, OutputMode output, int stop_before_exec)
      : n_(n), timeout_(std::move(timeout)), grace_(grace), job_(std::move(job)),
        command_(std::move(command)), output_(output), stop_before_exec_(stop_before_exec) {}

  int run() {
    std::optional<TempDir> folder;
    std::string store;
    if (job_.master_port == 0) {
      folder.emplace();
      store = "file://" + folder->path();
    } else {
      store = "tcp://" + job_.master_addr + ":" + std::to_string(job_.master_port);
    }
#if COMMGRID_HAS_BOOTSTRAP
    if (job_.resilient) {
      // Served here, not by rank 0 (torchrun's agent store): losing any rank loses no store.
      StoreOptions so;
      so.job_id = job_.job_id;
      so.token = job_.token;
      so.serve = job_.node_rank == 0;
      if (timeout_)
        so.timeout = std::chrono::milliseconds(
            std::llround(std::strtod(timeout_->c_str(), nullptr) * 1000.0));
      store_ = open_store(store, so);
    }
#endif
    Pipe sig = make_pipe();
    ::fcntl(sig.read.get(), F_SETFL, O_NONBLOCK);
    ::fcntl(sig.write.get(), F_SETFL, O_NONBLOCK);
    SignalGuard guard(sig.write.get());
    children_.resize(static_cast<size_t>(n_));
    if (timeout_ && !job_.resilient) {
      // (With spares the job outlives its failures, so --timeout bounds each operation only.)
      // The ranks' operations are bounded by T each; the job as a whole by T and a second,
      // so that a rank's own timeout error (which names the missing peer) is seen first.
      const double t = std::strtod(timeout_->c_str(), nullptr);
      job_deadline_ = Clock::now() + std::chrono::milliseconds(std::llround(t * 1000.0) + 1000);
    }
    store_uri_ = store;
    signal_fd_ = sig.read.get();
    for (int i = 0; i < n_ && !stopping_; ++i) {
      std::optional<std::string> failure;
      try {
        failure = start(i, store, sig.read.get());
      } catch (const Error& e) {
        // Out of processes or descriptors (ulimit): nothing of this job may outlive launch.
        failure = std::string(e.what()) + " (starting rank " + std::to_string(global_rank(i)) +
                  "; stopped the " + std::to_string(i) + " ranks already started)";
        stop_all(SIGKILL);
        while (any_running()) reap(true);
        print_error(*failure);
        return 1;
      }
      if (failure) {
        stop_all(SIGKILL);
        while (any_running()) reap(true);
        print_error(*failure);
        return 2;
      }
    }
    loop(sig.read.get());
    if (timed_out_) {
      print_error("launch: the job did not end within its --timeout of " + *timeout_ +
                  " s; still running: " + still_running_ + "; stopped them");
      return 124;
    }
    if (interrupted_ != 0) {
      print_error("interrupted by " + signal_name(interrupted_) + "; stopped " +
                  std::to_string(started_) + " ranks");
      return 128 + interrupted_;
    }
    if (job_.resilient && job_done() && some_exited_ok_) {
      // Failures the job recovered from were said above, as they happened.
      if (failure_)
        write_all(
            STDERR_FILENO,
            "launch: the job finished after recovering from: " + *failure_ +
                (also_failed_.empty() ? ""
                                      : " and " + std::to_string(also_failed_.size()) + " more") +
                "\n");
      return 0;
    }
    if (const auto ended = job_end(); failure_ && ended) {
      // The job could not recover (no spare and no smaller layout, a state lost): every
      // process ended with the same reason, said once here.
      print_error(*ended + " (after " + *failure_ + ")");
      return 1;
    }
    if (failure_) {
      // Bad input is found by every rank alike before any communication: when each one
      // exited 2, so does launch, as the program alone would have.
      if (every_rank_exited(2)) {
        print_error("every rank exited with code 2 (bad input; the ranks' errors are above)");
        return 2;
      }
      std::string text = "error: " + *failure_ + "\n";
      if (!also_failed_.empty()) {
        text += "note: also failed at about the same time:";
        for (const auto& f : also_failed_) text += " " + f + ";";
        text += "\n";
      }
      write_all(STDERR_FILENO, text);
      return 1;
    }
    return 0;
  }

 private:
  [[nodiscard]] int global_rank(int local) const { return job_.node_rank * n_ + local; }
  [[nodiscard]] int num_processes() const { return n_ * job_.nnodes; }
  [[nodiscard]] int world_size() const { return num_processes() - job_.spares; }

  // Whether the program said the job is finished (Recovery::mark_done).
  bool job_done() {
#if COMMGRID_HAS_BOOTSTRAP
    try {
      return store_ && store_->has(job_done_key(kResiliencePrefix));
    } catch (const Error&) { return false; }
#else
    return false;
#endif
  }

  // Why the job cannot go on (Recovery::end_job), or nullopt.
  std::optional<std::string> job_end() {
#if COMMGRID_HAS_BOOTSTRAP
    try {
      if (store_) return job_end_reason(*store_, kResiliencePrefix);
    } catch (const Error&) {}
#endif
    return std::nullopt;
  }

  // What a dead process wrote last, before its stream is replaced by its restart's.
  static void drain(Stream& s) {
    char buf[65536];
    while (s.fd.open()) {
      pollfd p{s.fd.get(), POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
      const ssize_t n = ::read(s.fd.get(), buf, sizeof(buf));
      if (n <= 0) break;
      s.pending.append(buf, static_cast<size_t>(n));
    }
    s.emit(true);
    s.fd.reset();
  }

  // A process of a job with spares died: its death is posted (the survivors need not wait
  // out a timeout for it) and the job goes on; it is restarted while the budget lasts.
  void on_process_death(Child& c) {
    // Once the job cannot go on, its processes end one by one with the reason, which is
    // said once at the end, not per process.
    if (job_end()) return;
    std::string note = "launch: note: " + describe_status(c.rank, c.status);
#if COMMGRID_HAS_BOOTSTRAP
    try {
      const std::string why = describe_status(c.rank, c.status);
      const std::span<const char> v(why.data(), why.size());
      // The current epoch: the last one decided.
      while (store_->has(epoch_decision_key(kResiliencePrefix, epoch_ + 1))) ++epoch_;
      if (store_->set_if_absent(dead_process_key(kResiliencePrefix, c.rank, c.incarnation), v)) {
        (void)store_->set_if_absent(epoch_failed_key(kResiliencePrefix, epoch_), v);
        note += "; posted it to the job's store (epoch " + std::to_string(epoch_) + ")";
      } else {
        // A decision had declared it dead already (a stopped process, fenced when it went
        // on): the epoch that replaced it is not failed by its exit.
        note += "; it had been declared dead already (epoch " + std::to_string(epoch_) + ")";
      }
    } catch (const Error& e) { note += std::string("; could not post it: ") + e.what(); }
#endif
    if (restarts_ < job_.max_restarts && !stopping_ && !job_done()) {
      ++restarts_;
      ++c.incarnation;
      note += "; restarting it as a spare (restart " + std::to_string(restarts_) + " of " +
              std::to_string(job_.max_restarts) + ")";
      write_all(STDERR_FILENO, note + "\n");
      const int local = c.rank - job_.node_rank * n_;
      drain(c.out);
      drain(c.err);
      std::optional<std::string> failure;
      try {
        failure = start(local, store_uri_, signal_fd_);
      } catch (const Error& e) { failure = e.what(); }
      if (failure) {
        write_all(STDERR_FILENO, "launch: note: restarting process " + std::to_string(c.rank) +
                                     " failed: " + *failure + "\n");
      }
      return;
    }
    write_all(STDERR_FILENO, note + "; the job goes on without it\n");
  }

  [[nodiscard]] bool every_rank_exited(int code) const {
    if (started_ != n_) return false;
    for (const auto& c : children_)
      if (c.running || !WIFEXITED(c.status) || WEXITSTATUS(c.status) != code) return false;
    return true;
  }

  [[nodiscard]] std::vector<std::string> rank_environment(int local,
                                                          const std::string& store) const {
    const int r = global_rank(local);
    const std::string world = std::to_string(world_size());
    const int incarnation = children_[static_cast<size_t>(local)].incarnation;
    std::vector<std::string> env;
    bool omp_threads = false;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view kv(*e);
      if (is_rank_variable(kv) || (timeout_ && kv.starts_with("COMMGRID_TIMEOUT="))) continue;
      omp_threads = omp_threads || kv.starts_with("OMP_NUM_THREADS=");
      env.emplace_back(kv);
    }
    std::vector<std::pair<const char*, std::string>> vars = {
        {"COMMGRID_RANK", std::to_string(r)},
        {"COMMGRID_WORLD_SIZE", world},
        {"COMMGRID_LOCAL_RANK", std::to_string(local)},
        {"COMMGRID_LOCAL_WORLD_SIZE", std::to_string(n_)},
        {"COMMGRID_STORE", store},
        {"COMMGRID_JOB_ID", job_.job_id},
        {"RANK", std::to_string(r)},
        {"WORLD_SIZE", world},
        {"LOCAL_RANK", std::to_string(local)},
        {"LOCAL_WORLD_SIZE", std::to_string(n_)},
        {"GROUP_RANK", std::to_string(job_.node_rank)},
        {"GROUP_WORLD_SIZE", std::to_string(job_.nnodes)},
        {"ROLE_RANK", std::to_string(r)},
        {"ROLE_WORLD_SIZE", world},
        {"ROLE_NAME", "default"},
        {"MASTER_ADDR", job_.master_addr},
        {"TORCHELASTIC_RUN_ID", job_.job_id},
        {"TORCHELASTIC_RESTART_COUNT", std::to_string(incarnation)},
        {"TORCHELASTIC_MAX_RESTARTS", std::to_string(job_.max_restarts)}};
    if (job_.resilient) {
      // Processes, not ranks: a spare (process >= W) holds no rank until a decision gives
      // it one, so it gets no COMMGRID_RANK or RANK.
      if (r >= world_size())
        std::erase_if(vars, [](const auto& v) {
          return std::string_view(v.first) == "COMMGRID_RANK" ||
                 std::string_view(v.first) == "RANK" || std::string_view(v.first) == "ROLE_RANK";
        });
      vars.insert(vars.end(), {{"COMMGRID_PROCESS", std::to_string(r)},
                               {"COMMGRID_NUM_PROCESSES", std::to_string(num_processes())},
                               {"COMMGRID_SPARES", std::to_string(job_.spares)},
                               {"COMMGRID_INCARNATION", std::to_string(incarnation)},
                               {"COMMGRID_STORE_SERVED", "launch"}});
    }
    for (const auto& [name, value] : vars) env.push_back(std::string(name) + "=" + value);
    if (job_.torch_port != 0) env.push_back("MASTER_PORT=" + std::to_string(job_.torch_port));
    if (!job_.token.empty()) env.push_back("COMMGRID_TOKEN=" + job_.token);
    if (timeout_) env.push_back("COMMGRID_TIMEOUT=" + *timeout_);
    // As torchrun does: N ranks on one machine each starting a thread per core would
    // oversubscribe it N times over.
    if (!omp_threads && n_ > 1) env.emplace_back("OMP_NUM_THREADS=1");
    return env;
  }

  // Starts rank `local` and waits until it has executed the program; returns a message when
  // the program cannot be executed at all (bad usage).
  std::optional<std::string> start(int local, const std::string& store, int signal_fd) {
    const int r = global_rank(local);
    std::vector<std::string> env_strings = rank_environment(local, store);
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
    const bool stop_first = local == stop_before_exec_;
    pid_t pid = -1;
    {
      // No signal is handled between fork and the child's reset of the dispositions: a
      // handler of launch running in the child would write into launch's signal pipe.
      const BlockSignals blocked;
      pid = ::fork();
      if (pid == 0) {
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(s, &dfl, nullptr);
        ::pthread_sigmask(SIG_SETMASK, &blocked.old(), nullptr);
        // Its own process group, so that stopping a rank stops what it started too.
        ::setpgid(0, 0);
        // A launch killed by SIGKILL cannot stop its ranks; the kernel does it for it.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != launcher_pid) ::_exit(127);
        if (devnull.open()) ::dup2(devnull.get(), STDIN_FILENO);
        ::dup2(out.write.get(), STDOUT_FILENO);
        ::dup2(err.write.get(), STDERR_FILENO);
        if (stop_first) ::raise(SIGSTOP);  // tests: a rank stopped between fork and exec
        ::execvpe(argv[0], argv.data(), envp.data());
        const int e = errno;
        [[maybe_unused]] auto n = ::write(exec_status.write.get(), &e, sizeof(e));
        ::_exit(127);
      }
    }
    if (pid < 0) throw Error(std::string("launch: fork: ") + std::strerror(errno));
    ::setpgid(pid, pid);  // also here: whichever runs first, the group exists before a kill
    out.write.reset();
    err.write.reset();
    exec_status.write.reset();
    ++started_;
    Child& c = children_[static_cast<size_t>(local)];
    c.rank = r;
    c.pid = pid;
    c.running = true;
    // --output: where each of this rank's streams goes, and with which prefix.
    const bool first = r == 0;
    const std::string prefix = "[rank " + std::to_string(r) + "] ";
    c.out.fd = std::move(out.read);
    c.out.target = STDOUT_FILENO;
    c.out.prefix = output_ == OutputMode::prefixed ? prefix : "";
    c.out.show = output_ != OutputMode::rank0 || first;
    c.err.fd = std::move(err.read);
    c.err.target = STDERR_FILENO;
    c.err.prefix =
        output_ == OutputMode::prefixed || (output_ == OutputMode::rank0 && !first) ? prefix : "";
    return await_exec(c, exec_status.read.get(), signal_fd);
  }

  // exec closes the CLOEXEC pipe (EOF, success) or the child reports errno through it. A
  // child stopped before exec never does either: the wait ends at the job's deadline or
  // with launch's own interruption, like every other wait of launch.
  std::optional<std::string> await_exec(Child& c, int exec_fd, int signal_fd) {
    for (;;) {
      int wait_ms = 200;
      if (job_deadline_) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(*job_deadline_ - Clock::now());
        wait_ms = static_cast<int>(std::clamp<long long>(left.count(), 0, 200));
      }
      pollfd fds[2] = {{exec_fd, POLLIN, 0}, {signal_fd, POLLIN, 0}};
      const int ready = ::poll(fds, 2, wait_ms);
      if (ready < 0 && errno != EINTR)
        throw Error(std::string("launch: poll: ") + std::strerror(errno));
      if (ready > 0 && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
        int e = 0;
        ssize_t got;
        do got = ::read(exec_fd, &e, sizeof(e));
        while (got < 0 && errno == EINTR);
        if (got == static_cast<ssize_t>(sizeof(e)))
          return "cannot execute '" + command_.front() + "' (rank " + std::to_string(c.rank) +
                 "): " + std::strerror(e);
        return std::nullopt;
      }
      if (ready > 0 && (fds[1].revents & POLLIN)) on_signals(signal_fd);
      reap(false);  // notes a rank stopped by a signal; a failure begins the stop
      if (stopping_) return std::nullopt;
      if (job_deadline_ && Clock::now() >= *job_deadline_) {
        timed_out_ = true;
        still_running_ = running_list();
        begin_stop();
        return std::nullopt;
      }
    }
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
    settle_until_.reset();
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
        write_all(STDERR_FILENO, "launch: note: rank " + std::to_string(c.rank) +
                                     " was stopped by " + signal_name(c.stop_signal) + "\n");
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
      some_exited_ok_ = some_exited_ok_ || ok;
      if (!ok && !stopping_) failed_now.push_back(&c);
      if (block) break;
    }
    if (failed_now.empty()) return;
    if (job_.resilient && !std::all_of(failed_now.begin(), failed_now.end(), [](const Child* c) {
          return WIFEXITED(c->status) && WEXITSTATUS(c->status) == 2;
        })) {
      // The job goes on: the survivors and spares recover (docs/resilience.md). It fails
      // only when no process finishes it.
      for (Child* c : failed_now) {
        if (!failure_) failure_ = describe_status(c->rank, c->status);
        else also_failed_.push_back(describe_status(c->rank, c->status));
        on_process_death(*c);
      }
      return;
    }
    // Ranks found failed in one pass ended within moments of each other, and the order in
    // which they are reaped is fork order, not exit order. A death by signal (a crash, the
    // OOM killer) is likelier the cause than an exit code (often a peer's reaction to it),
    // so it is named first; the others are listed after it.
    std::stable_sort(failed_now.begin(), failed_now.end(), [](const Child* a, const Child* b) {
      return WIFSIGNALED(a->status) && !WIFSIGNALED(b->status);
    });
    for (const Child* c : failed_now) {
      const std::string what = describe_status(c->rank, c->status);
      if (!failure_) failure_ = what;
      else also_failed_.push_back(what);
    }
    // Bad input (exit 2) is found by every rank alike, before any communication: let the
    // others reach their own exit 2 and write their error line whole, for up to --grace
    // seconds, instead of cutting them short. Any other failure stops the job at once.
    const bool bad_input = std::all_of(failed_now.begin(), failed_now.end(), [](const Child* c) {
      return WIFEXITED(c->status) && WEXITSTATUS(c->status) == 2;
    });
    if (bad_input) {  // (an earlier failure of another kind has begun the stop already)
      if (!settle_until_)
        settle_until_ =
            Clock::now() + std::chrono::milliseconds(static_cast<long long>(grace_ * 1000));
      return;
    }
    begin_stop();
  }

  void loop(int signal_fd) {
    std::optional<Clock::time_point> drain_until;
    for (;;) {
      signal_fd_ = signal_fd;
      std::vector<pollfd> fds{{signal_fd, POLLIN, 0}};
      std::vector<Stream*> owners{nullptr};
      for (auto& c : children_)
        for (Stream* s : {&c.out, &c.err})
          if (s->fd.open()) {
            fds.push_back({s->fd.get(), POLLIN, 0});
            owners.push_back(s);
          }
      const bool running = any_running();
      if (!running && fds.size() == 1) return;
      if (!running && !drain_until) drain_until = Clock::now() + std::chrono::seconds(2);
      if (drain_until && Clock::now() >= *drain_until) {
        // A process the rank left behind still holds its output open; it was killed with
        // the rank's group, so what remains is not worth waiting for.
        for (auto& c : children_) {
          c.out.emit(true);
          c.err.emit(true);
          c.out.fd.reset();
          c.err.fd.reset();
        }
        return;
      }
      int wait_ms = 200;
      auto until = [&](Clock::time_point t) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now());
        wait_ms = std::min(wait_ms, static_cast<int>(std::clamp<long long>(left.count(), 0, 200)));
      };
      if (job_deadline_ && !stopping_) until(*job_deadline_);
      if (settle_until_ && !stopping_) until(*settle_until_);
      if (stopping_ && running) until(kill_at_);
      int ready = ::poll(fds.data(), fds.size(), wait_ms);
      if (ready < 0 && errno != EINTR)
        throw Error(std::string("launch: poll: ") + std::strerror(errno));
      if (ready > 0) {
        if (fds[0].revents & POLLIN) on_signals(signal_fd);
        for (size_t i = 1; i < fds.size(); ++i) {
          if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          Stream* stream = owners[i];
          char buf[65536];
          ssize_t n = ::read(stream->fd.get(), buf, sizeof(buf));
          if (n > 0) {
            stream->pending.append(buf, static_cast<size_t>(n));
            stream->emit(false);
          } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
            stream->emit(true);
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
      if (settle_until_ && !stopping_ && any_running() && Clock::now() >= *settle_until_)
        begin_stop();
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

  int n_;
  std::optional<std::string> timeout_;
  double grace_;
  JobSetup job_;
  std::vector<std::string> command_;
  OutputMode output_;
  int stop_before_exec_;  // a local rank, or -1
  int started_ = 0;
  std::optional<Clock::time_point> job_deadline_;
  bool timed_out_ = false;
  std::string still_running_;
  std::vector<Child> children_;
  std::optional<std::string> failure_;
  std::vector<std::string> also_failed_;
  std::optional<Clock::time_point> settle_until_;  // after a first exit 2: see reap()
  bool stopping_ = false;
  Clock::time_point kill_at_{};
  int interrupted_ = 0;
  // --spares: the store launch serves, the epoch it last saw decided, restarts used.
#if COMMGRID_HAS_BOOTSTRAP
  std::shared_ptr<Store> store_;
#endif
  std::string store_uri_;
  int signal_fd_ = -1;
  std::int64_t epoch_ = 0;
  int restarts_ = 0;
  bool some_exited_ok_ = false;
};

}  // namespace

Command add_launch_command(CLI::App& root) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* app = root.add_subcommand(
      "launch",
      "Start N processes of PROGRAM on this machine, like torchrun: each gets COMMGRID_RANK, "
      "COMMGRID_WORLD_SIZE, COMMGRID_STORE, COMMGRID_JOB_ID, COMMGRID_TOKEN and torchrun's "
      "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ... (alone: a "
      "file store in a fresh temporary folder; with --nnodes or --master-port: the TCP store "
      "rank 0 serves); prefix their output with [rank i]; stop all if one fails");
  // torchrun's flag names, with its underscore spellings too (--nproc_per_node).
  app->add_option("-n,--nproc,--nproc-per-node,--nproc_per_node", args->nproc,
                  "Number of processes (ranks) on this node, 1-1024")
      ->required()
      ->type_name("INT");
  app->add_option("--nnodes", args->nnodes, "Number of nodes (launches) of the job (default 1)")
      ->type_name("INT");
  app->add_option("--node-rank,--node_rank", args->node_rank,
                  "This node's index, 0 ... nnodes-1: its ranks are node_rank*n ... "
                  "node_rank*n+n-1 (required with --nnodes > 1)")
      ->type_name("INT");
  app->add_option("--master-addr,--master_addr", args->master_addr,
                  "Address of node 0 (default 127.0.0.1): rank 0 serves the TCP store there "
                  "and torch's MASTER_ADDR is it");
  app->add_option("--master-port,--master_port", args->master_port,
                  "Port of commgrid's TCP store on node 0 (required with --nnodes > 1); torch's "
                  "MASTER_PORT is the next port (without it, on one node: a free port)")
      ->type_name("INT");
  app->add_option("--rdzv-id,--rdzv_id", args->rdzv_id,
                  "The job's id (COMMGRID_JOB_ID, TORCHELASTIC_RUN_ID); the same on every node "
                  "(default: COMMGRID_JOB_ID, else a fresh one on one node)")
      ->type_name("ID");
  app->add_flag("--standalone", args->standalone,
                "torchrun's one-node mode: the default without --nnodes (accepted for torchrun "
                "command lines)");
  app->add_option("--output", args->output,
                  "prefixed (default: every line as \"[rank i] line\"), raw (every line as it "
                  "is) or rank0 (rank 0's lines as they are, the other ranks' stderr prefixed "
                  "and their stdout dropped: one rank's JSON pipes cleanly)")
      ->type_name("MODE");
  app->add_option("--timeout", args->timeout,
                  "Seconds: bound of every rendezvous and collective of the ranks (exported as "
                  "COMMGRID_TIMEOUT) and, one second later, of the whole job (exit 124)")
      ->type_name("SECONDS");
  app->add_option("--grace", args->grace,
                  "Seconds between SIGTERM and SIGKILL when stopping the ranks (default 5)");
  app->add_option("--spares", args->spares,
                  "Hot spares: the last S of the job's processes hold no rank; when a process "
                  "dies the job goes on (the program recovers: docs/resilience.md) and launch "
                  "serves the TCP store itself; --spares 0: the job goes on without spares "
                  "(a program that shrinks)")
      ->type_name("S");
  app->add_option("--max-restarts,--max_restarts", args->max_restarts,
                  "With --spares: restart up to R dead processes, which rejoin as spares "
                  "(torchrun's name for the budget; default 0)")
      ->type_name("R");
  // Hidden (empty group): a rank stops itself between fork and exec, to test launch's bound.
  app->add_option("--stop-before-exec", args->stop_before_exec)->group("");
  app->add_option("command", args->command, "-- PROGRAM ARGS...")->required();
  app->footer(
      "Examples: commgrid launch -n 8 -- commgrid verify --tp 2 --pp 2 --ep 2\n"
      "          commgrid launch -n 8 -- python3 train.py   (init_process_group(\"gloo\"), env://)\n"
      "          commgrid launch --output rank0 -n 4 -- commgrid-train-gpt --pp 2 --format json\n"
      "Exit codes: 0 every rank exited 0, 1 a rank failed, 2 bad usage or every rank exited 2, "
      "124 --timeout, 128+N interrupted by signal N.");
  return {
      app, [args]() -> int {
        const auto n = parse_integer("-n", args->nproc, 1, kMaxRanks);
        JobSetup job;
        job.nnodes = static_cast<int>(parse_integer("--nnodes", args->nnodes, 1, kMaxRanks));
        if (n * job.nnodes > kMaxRanks)
          throw InvalidValueError("--nnodes", "launch: -n " + std::to_string(n) +
                                                  " times --nnodes " + std::to_string(job.nnodes) +
                                                  " exceeds " + std::to_string(kMaxRanks) +
                                                  " ranks");
        if (args->standalone && job.nnodes > 1)
          throw IncompatibleError("--standalone",
                                  "launch: --standalone is one node; it does "
                                  "not go with --nnodes " +
                                      std::to_string(job.nnodes));
        if (!args->node_rank.empty())
          job.node_rank =
              static_cast<int>(parse_integer("--node-rank", args->node_rank, 0, job.nnodes - 1));
        else if (job.nnodes > 1)
          throw ConfigError("--node-rank", "launch: --nnodes " + std::to_string(job.nnodes) +
                                               " needs --node-rank (0 ... " +
                                               std::to_string(job.nnodes - 1) + ")");
        if (!args->master_addr.empty()) job.master_addr = args->master_addr;
        if (!args->master_port.empty()) {
          // torch's store takes the next port: both must be ports.
          job.master_port =
              static_cast<int>(parse_integer("--master-port", args->master_port, 1, 65534));
          job.torch_port = job.master_port + 1;
        } else if (job.nnodes > 1) {
          throw ConfigError("--master-port", "launch: --nnodes " + std::to_string(job.nnodes) +
                                                 " needs --master-port (the TCP store of node 0)");
        }
        const OutputMode output = parse_output(args->output);
        // The job's identity: --rdzv-id, the user's or scheduler's, else (one node) a
        // fresh one. Several nodes must share it, so they cannot each make one up.
        const char* id = std::getenv("COMMGRID_JOB_ID");
        const char* token = std::getenv("COMMGRID_TOKEN");
        if (id != nullptr && *id == '\0')
          throw InvalidValueError("COMMGRID_JOB_ID", "COMMGRID_JOB_ID is set but empty");
        if (token != nullptr && *token == '\0')
          throw InvalidValueError("COMMGRID_TOKEN", "COMMGRID_TOKEN is set but empty");
        if (!args->rdzv_id.empty()) {
          if (args->rdzv_id.find_first_of("/ \n\t") != std::string::npos ||
              args->rdzv_id.size() > 200)
            throw InvalidValueError("--rdzv-id",
                                    "--rdzv-id: a job id has at most 200 "
                                    "characters and no '/', spaces or newlines");
          id = args->rdzv_id.c_str();
        }
        if (job.nnodes > 1) {
          job.job_id =
              id ? id : "launch-" + job.master_addr + "-" + std::to_string(job.master_port);
          job.token = token ? token : "";
          if (!token)
            write_all(STDERR_FILENO,
                      "launch: note: COMMGRID_TOKEN is not set: the ranks of this multi-node "
                      "job do not authenticate each other (set the same COMMGRID_JOB_ID and "
                      "COMMGRID_TOKEN on every node; see docs/security.md)\n");
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
        const int stop_before_exec =
            args->stop_before_exec.empty()
                ? -1
                : static_cast<int>(
                      parse_integer("--stop-before-exec", args->stop_before_exec, 0, n - 1));
        if (args->command.empty() || args->command.front().empty())
          throw ConfigError("command",
                            "launch: no program given (usage: commgrid launch "
                            "-n N -- PROGRAM ARGS...)");
        if (!args->spares.empty()) {
          job.spares = static_cast<int>(parse_integer("--spares", args->spares, 0, kMaxRanks));
          job.resilient = true;
          const std::int64_t procs = n * job.nnodes;
          if (job.spares >= procs)
            throw InvalidValueError("--spares", "launch: --spares " + std::to_string(job.spares) +
                                                    " leaves no process for the world (" +
                                                    std::to_string(procs) + " processes)");
          // The placement RankMap checks: on several nodes, spares are whole nodes.
          SparePlacement placement;
          placement.spares = job.spares;
          if (job.nnodes > 1) placement.gpus_per_node = n;
          if (job.spares > 0) (void)RankMap(procs - job.spares, placement);
        }
        if (!args->max_restarts.empty()) {
          job.max_restarts =
              static_cast<int>(parse_integer("--max-restarts", args->max_restarts, 0, kMaxRanks));
          if (job.max_restarts > 0 && !job.resilient)
            throw IncompatibleError("--max-restarts", "launch: --max-restarts " +
                                                          args->max_restarts +
                                                          " needs --spares (a restarted process "
                                                          "rejoins as a spare)");
        }
        if (job.resilient) {
#if !COMMGRID_HAS_BOOTSTRAP
          throw IncompatibleError("--spares",
                                  "launch: --spares needs the bootstrap library "
                                  "(OpenSSL), which this build lacks");
#endif
          if (job.master_port == 0) {
            // The TCP store launch serves: on a free port of this machine.
            job.master_port = free_tcp_port();
            if (job.master_port == 0)
              throw Error("launch: --spares: no free TCP port for the store");
          }
        }
        if (job.torch_port == 0) job.torch_port = free_tcp_port();
        std::cout.flush();
        return Launcher(static_cast<int>(n), timeout, grace, job, args->command, output,
                        stop_before_exec)
            .run();
      }};
}

}  // namespace commgrid::cli
