#include "launch/supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cli_errors.hpp"
#include "commgrid/error.hpp"
#include "commgrid/store.hpp"
#include "launch/child_env.hpp"

namespace commgrid::cli {
namespace {

// How long a process may take from fork to exec when --timeout does not say.
constexpr std::chrono::milliseconds kExecBound{60000};

// "4 s", "0.5 s".
std::string seconds_text(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

}  // namespace

Supervisor::Supervisor(LaunchSettings settings) : s_(std::move(settings)) {}

Supervisor::~Supervisor() = default;

void Supervisor::grant_etcd_user() const {
  const char* root = std::getenv("COMMGRID_ETCD_ROOT_PASSWORD");
  if (root == nullptr || *root == '\0' || !store_uri_.starts_with("etcd://") ||
      s_.job.token.empty())
    return;
  StoreOptions so;
  so.job_id = s_.job.job_id;
  so.token = s_.job.token;
  if (s_.timeout) so.timeout = *s_.timeout;
  if (grant_etcd_job(store_uri_, "root", root, so))
    write_all(STDERR_FILENO,
              "launch: granted etcd user 'commgrid-" + s_.job.job_id + "' the job's prefix\n");
}

int Supervisor::run() {
  std::optional<TempDir> folder;
  if (!s_.job.store_uri.empty()) {
    store_uri_ = s_.job.store_uri;
    grant_etcd_user();
  } else if (s_.job.master_port == 0) {
    folder.emplace();
    store_uri_ = "file://" + folder->path();
  } else {
    store_uri_ = "tcp://" + s_.job.master_addr + ":" + std::to_string(s_.job.master_port);
  }
  // Served here, not by rank 0 (torchrun's agent store): losing any rank loses no store.
  if (s_.job.resilient) {
    spares_ = std::make_unique<SpareKeeper>(s_, std::make_unique<JobStore>(store_uri_, s_));
    if (s_.job.nnodes > 1) end_ = std::make_unique<JobEnd>(spares_->store(), s_);
  }
  Pipe sig = make_pipe();
  ::fcntl(sig.read.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(sig.write.get(), F_SETFL, O_NONBLOCK);
  const SignalGuard guard(sig.write.get());
  signal_fd_ = std::move(sig.read);
  children_.resize(static_cast<std::size_t>(s_.nproc));
  if (s_.timeout && !s_.job.resilient) {
    // (With spares the job outlives its failures, so --timeout bounds each operation only.)
    // The ranks' operations are bounded by T each; the job as a whole by T and a second,
    // so that a rank's own timeout error (which names the missing peer) is seen first.
    job_deadline_ = Clock::now() + *s_.timeout + std::chrono::seconds(1);
  }
  if (const std::optional<int> code = start_all()) return *code;
  loop();
  if (end_) {
    end_->local_idle();
    if (interrupted_ == 0) await_job_end();
  }
  return finish();
}

// This node's processes have all ended; the job may go on on the others (node 0 serves the
// store until it ends there too). Launch's own interruption ends the wait.
void Supervisor::await_job_end() {
  for (;;) {
    pollfd p{signal_fd_.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, 200);
    if (ready < 0 && errno != EINTR)
      throw Error(std::string("launch: poll: ") + std::strerror(errno));
    if (ready > 0 && (p.revents & POLLIN)) on_signals();
    if (interrupted_ != 0) return;
    if ((end_verdict_ = end_->check())) return;
  }
}

// Starts every local process in turn; an exit code when one cannot be started (then every
// process already started is killed and reaped).
std::optional<int> Supervisor::start_all() {
  for (int i = 0; i < s_.nproc && !stopping_; ++i) {
    std::optional<std::string> failure;
    int code = 2;
    try {
      failure = start(i);
    } catch (const Error& e) {
      // Out of processes or descriptors (ulimit): nothing of this job may outlive launch.
      failure = std::string(e.what()) + " (starting rank " + std::to_string(s_.process_of(i)) +
                "; stopped the " + std::to_string(i) + " ranks already started)";
      code = 1;
    }
    if (failure) {
      stop_all(SIGKILL);
      while (any_running()) reap(true);
      print_error(*failure);
      return code;
    }
  }
  return std::nullopt;
}

// Starts local process `local` and waits until it has executed the program; returns a
// message when the program cannot be executed at all (bad usage).
std::optional<std::string> Supervisor::start(int local) {
  Child& c = children_[static_cast<std::size_t>(local)];
  std::vector<std::string> env_strings = child_environment(s_, local, c.incarnation, store_uri_);
  // Everything the child needs is prepared before fork: after it, only async-signal-safe
  // calls are allowed.
  std::vector<char*> envp, argv;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (auto& a : s_.command) argv.push_back(a.data());
  argv.push_back(nullptr);

  Pipe out = make_pipe(), err = make_pipe(), exec_status = make_pipe();
  const Fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const pid_t launcher_pid = ::getpid();
  const bool stop_first = local == s_.stop_before_exec && c.incarnation == 0;
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
      for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
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
  c.local = local;
  c.process = s_.process_of(local);
  c.pid = pid;
  c.running = true;
  c.stopped = false;
  c.final_label.reset();
  c.out = Stream(std::move(out.read), STDOUT_FILENO);
  c.err = Stream(std::move(err.read), STDERR_FILENO);
  return await_exec(c, exec_status.read.get());
}

// exec closes the CLOEXEC pipe (EOF, success) or the child reports errno through it. A
// child stopped before exec never does either: the wait ends at the job's deadline, with
// launch's own interruption, or after the exec bound (--timeout, else kExecBound): with
// --spares the child is then killed and the job goes on without it, else the launch fails.
std::optional<std::string> Supervisor::await_exec(Child& c, int exec_fd) {
  const auto bound = s_.timeout.value_or(kExecBound);
  const Clock::time_point exec_deadline = Clock::now() + bound;
  for (;;) {
    pollfd fds[2] = {{exec_fd, POLLIN, 0}, {signal_fd_.get(), POLLIN, 0}};
    const int ready = ::poll(fds, 2, wait_ms(200));
    if (ready < 0 && errno != EINTR)
      throw Error(std::string("launch: poll: ") + std::strerror(errno));
    if (ready > 0 && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      int e = 0;
      ssize_t got = 0;
      do got = ::read(exec_fd, &e, sizeof(e));
      while (got < 0 && errno == EINTR);
      if (got == static_cast<ssize_t>(sizeof(e)))
        return "cannot execute '" + s_.command.front() + "' (rank " + std::to_string(c.process) +
               "): " + std::strerror(e);
      return std::nullopt;
    }
    if (ready > 0 && (fds[1].revents & POLLIN)) on_signals();
    reap(false);  // notes a rank stopped by a signal; a failure begins the stop
    if (stopping_ || !c.running) return std::nullopt;
    if (job_deadline_ && Clock::now() >= *job_deadline_) {
      timed_out_ = true;
      still_running_ = running_list();
      begin_stop();
      return std::nullopt;
    }
    if (!job_deadline_ && Clock::now() >= exec_deadline) {
      const std::string why = who(c) + " did not start within " + seconds_text(bound) +
                              (c.stopped ? " (stopped by " + signal_name(c.stop_signal) + ")" : "");
      if (!s_.job.resilient) throw Error("launch: " + why);
      write_all(STDERR_FILENO, "launch: note: " + why + "; killed it\n");
      ::kill(-c.pid, SIGKILL);
      return std::nullopt;  // its death is reaped and posted like any other
    }
  }
}

// Milliseconds to wait in poll: at most `at_most`, less when a deadline comes sooner.
int Supervisor::wait_ms(int at_most) const {
  int ms = at_most;
  const auto until = [&](Clock::time_point t) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now());
    ms = std::min(ms, static_cast<int>(std::clamp<long long>(left.count(), 0, at_most)));
  };
  if (job_deadline_ && !stopping_) until(*job_deadline_);
  if (settle_until_ && !stopping_) until(*settle_until_);
  if (stopping_ && any_running()) until(kill_at_);
  return ms;
}

void Supervisor::loop() {
  std::optional<Clock::time_point> drain_until;
  for (;;) {
    std::vector<pollfd> fds{{signal_fd_.get(), POLLIN, 0}};
    std::vector<Stream*> owners{nullptr};
    for (auto& c : children_)
      for (Stream* st : {&c.out, &c.err})
        if (st->open()) {
          fds.push_back({st->fd(), POLLIN, 0});
          owners.push_back(st);
        }
    const bool running = any_running();
    if (!running && fds.size() == 1) return;
    if (!running && !drain_until) drain_until = Clock::now() + std::chrono::seconds(2);
    if (drain_until && Clock::now() >= *drain_until) {
      // A process the rank left behind still holds its output open; it was killed with
      // the rank's group, so what remains is not worth waiting for.
      for (auto& c : children_) {
        c.out.close();
        c.err.close();
        emit(c, true);
      }
      return;
    }
    const int ready = ::poll(fds.data(), fds.size(), wait_ms(200));
    if (ready < 0 && errno != EINTR)
      throw Error(std::string("launch: poll: ") + std::strerror(errno));
    if (ready > 0) {
      if (fds[0].revents & POLLIN) on_signals();
      std::vector<Stream*> readable;
      for (std::size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) readable.push_back(owners[i]);
      relay(readable);
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

// Reads what the ready streams hold, then writes every whole line out with its process's
// label as it is now.
void Supervisor::relay(const std::vector<Stream*>& ready) {
  for (Stream* st : ready) st->read_some();
  if (spares_) spares_->follow();  // the labels and the rank0 filter of the current epoch
  for (auto& c : children_) emit(c, false);
}

void Supervisor::emit(Child& c, bool flush_partial) {
  if (!c.out.has_pending() && !c.err.has_pending()) return;
  const Routing r = route(s_.output, label(c), holds_rank0(c));
  c.out.emit(r.out_prefix, r.show_out, flush_partial || !c.out.open());
  c.err.emit(r.err_prefix, true, flush_partial || !c.err.open());
}

void Supervisor::on_signals() {
  unsigned char b[64];
  ssize_t n = 0;
  while ((n = ::read(signal_fd_.get(), b, sizeof(b))) > 0) {
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

void Supervisor::reap(bool block) {
  std::vector<Child*> failed_now;
  bool followed = false;  // the epochs read once per pass, and only when a process ended
  for (auto& c : children_) {
    if (!c.running) continue;
    int status = 0;
    const pid_t got = ::waitpid(c.pid, &status, block ? 0 : (WNOHANG | WUNTRACED | WCONTINUED));
    if (got != c.pid) continue;
    if (WIFSTOPPED(status)) {
      c.stopped = true;
      c.stop_signal = WSTOPSIG(status);
      write_all(STDERR_FILENO,
                "launch: note: " + who(c) + " was stopped by " + signal_name(c.stop_signal) + "\n");
      continue;
    }
    if (WIFCONTINUED(status)) {
      c.stopped = false;
      continue;
    }
    if (spares_ && !followed) {
      spares_->follow();  // a process's last label is of the epoch it ended in
      followed = true;
    }
    c.final_rank0 = holds_rank0(c);  // (before final_label, which freezes both)
    c.final_label = label(c);
    c.running = false;
    c.status = status;
    // Anything the rank started in its group goes with it.
    ::kill(-c.pid, SIGKILL);
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && !stopping_) failed_now.push_back(&c);
    if (block) break;
  }
  if (!failed_now.empty()) on_failures(failed_now);
}

void Supervisor::on_failures(std::vector<Child*>& failed) {
  const auto exited_2 = [](const Child* c) {
    return WIFEXITED(c->status) && WEXITSTATUS(c->status) == 2;
  };
  if (s_.job.resilient && !std::all_of(failed.begin(), failed.end(), exited_2)) {
    // The job goes on: the survivors and spares recover (docs/resilience.md). It fails
    // only when no process finishes it.
    for (Child* c : failed) {
      const std::string what = who(*c) + " " + describe_end(c->status);
      if (!failure_) failure_ = what;
      else also_failed_.push_back(what);
      on_process_death(*c);
    }
    return;
  }
  // Processes found failed in one pass ended within moments of each other, and the order
  // in which they are reaped is fork order, not exit order. A death by signal (a crash, the
  // OOM killer) is likelier the cause than an exit code (often a peer's reaction to it),
  // so it is named first; the others are listed after it.
  std::stable_sort(failed.begin(), failed.end(), [](const Child* a, const Child* b) {
    return WIFSIGNALED(a->status) && !WIFSIGNALED(b->status);
  });
  for (const Child* c : failed) {
    const std::string what = who(*c) + " " + describe_end(c->status);
    if (!failure_) failure_ = what;
    else also_failed_.push_back(what);
  }
  // Bad input (exit 2) is found by every rank alike, before any communication: let the
  // others reach their own exit 2 and write their error line whole, for up to --grace
  // seconds, instead of cutting them short. Any other failure stops the job at once.
  if (std::all_of(failed.begin(), failed.end(), exited_2)) {
    // (an earlier failure of another kind has begun the stop already)
    if (!settle_until_) settle_until_ = Clock::now() + s_.grace;
    return;
  }
  begin_stop();
}

// A process of a job with spares died: its death is posted and the job goes on; it is
// restarted while the budget lasts.
void Supervisor::on_process_death(Child& c) {
  const SpareKeeper::Verdict v =
      spares_->on_death(c.process, c.incarnation, who(c), c.status, stopping_);
  if (!v.note.empty()) write_all(STDERR_FILENO, v.note + "\n");
  if (v.failed_epoch) tell_epoch_failed(*v.failed_epoch);
  if (!v.restart) return;
  // What the dead process wrote last, before its streams are replaced by its restart's.
  c.out.read_rest();
  c.err.read_rest();
  emit(c, true);
  ++c.incarnation;
  std::optional<std::string> failure;
  try {
    failure = start(c.local);
  } catch (const Error& e) { failure = e.what(); }
  if (failure)
    write_all(STDERR_FILENO, "launch: note: restarting process " + std::to_string(c.process) +
                                 " failed: " + *failure + "\n");
}

// Every other running process of this launch gets SIGURG with the failed epoch as its
// value: a program that armed that epoch's connections ends the collectives blocked in them
// at once (commgrid.torch's driver; python/src/epoch_sockets.hpp). SIGURG is ignored by
// default, so programs that arm nothing are unaffected.
void Supervisor::tell_epoch_failed(std::int64_t epoch) {
  sigval value{};
  value.sival_int = static_cast<int>(epoch);
  for (const auto& c : children_)
    if (c.running && !c.stopped) (void)::sigqueue(c.pid, kEpochFailureSignal, value);
}

void Supervisor::stop_all(int sig) {
  for (auto& c : children_)
    if (c.running) {
      ::kill(-c.pid, sig);
      if (sig != SIGKILL && c.stopped) ::kill(-c.pid, SIGCONT);  // else TERM waits forever
    }
}

void Supervisor::begin_stop() {
  if (stopping_) return;
  stopping_ = true;
  settle_until_.reset();
  stop_all(SIGTERM);
  kill_at_ = Clock::now() + s_.grace;
}

// The exit code and the last words, once every process has ended.
int Supervisor::finish() {
  if (timed_out_) {
    print_error("launch: the job did not end within its --timeout of " + *s_.timeout_text +
                " s; still running: " + still_running_ + "; stopped them");
    return 124;
  }
  if (interrupted_ != 0) {
    print_error("interrupted by " + signal_name(interrupted_) + "; stopped " +
                std::to_string(started_) + " ranks");
    return 128 + interrupted_;
  }
  if (s_.job.resilient) return finish_resilient();
  if (!failure_) return 0;
  // Bad input is found by every rank alike before any communication: when each one exited
  // 2, so does launch, as the program alone would have.
  if (every_process_exited(2)) {
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

// With --spares: 0 when the job finished (the program said so) and nothing failed here
// after that, or when nothing failed at all; 1 otherwise.
int Supervisor::finish_resilient() {
  const bool done = (end_verdict_ && end_verdict_->done) || spares_->done();
  const std::string problem = end_verdict_ ? end_verdict_->problem : std::string();
  if (done && !spares_->failed_after_done()) {
    // Failures the job recovered from were said above, as they happened.
    if (failure_)
      write_all(STDERR_FILENO, "launch: the job finished after recovering from: " + *failure_ +
                                   (also_failed_.empty()
                                        ? ""
                                        : " and " + std::to_string(also_failed_.size()) + " more") +
                                   "\n");
    if (!problem.empty()) write_all(STDERR_FILENO, "launch: note: " + problem + "\n");
    return 0;
  }
  if (!failure_ && problem.empty()) return 0;
  if (failure_) {
    if (const auto ended = spares_->ended()) {
      // The job could not recover (no spare and no smaller layout, a state lost): every
      // process ended with the same reason, said once here.
      print_error(*ended + " (after " + *failure_ + ")");
      return 1;
    }
  }
  if (failure_ && problem.empty() && every_process_exited(2)) {
    print_error("every rank exited with code 2 (bad input; the ranks' errors are above)");
    return 2;
  }
  std::string text = "error: " + (failure_ ? *failure_ : problem) + "\n";
  if (failure_ && !problem.empty()) text += "note: " + problem + "\n";
  if (!also_failed_.empty()) {
    text += "note: also failed:";
    for (const auto& f : also_failed_) text += " " + f + ";";
    text += "\n";
  }
  write_all(STDERR_FILENO, text);
  return 1;
}

// How launch's notes name a process: "rank 3" (its process number) without --spares; with
// them "process 4 (rank 1, epoch 1)", "process 5 (spare 1)".
std::string Supervisor::who(const Child& c) const {
  if (!spares_) return "rank " + std::to_string(c.process);
  return "process " + std::to_string(c.process) + " (" +
         spares_->view().label(c.process, c.incarnation) + ")";
}

// The prefix of a process's lines: "[rank 3]", or with --spares its label in the epochs
// launch has read ("[rank 1, epoch 2]", "[spare 0]"); frozen when the process ended.
std::string Supervisor::label(const Child& c) const {
  if (c.final_label) return *c.final_label;
  if (!spares_) return "[rank " + std::to_string(c.process) + "]";
  return "[" + spares_->view().label(c.process, c.incarnation) + "]";
}

bool Supervisor::holds_rank0(const Child& c) const {
  if (c.final_label) return c.final_rank0;
  if (!spares_) return c.process == 0;
  return spares_->view().logical_rank(c.process) == 0;
}

bool Supervisor::any_running() const {
  return std::any_of(children_.begin(), children_.end(), [](const Child& c) { return c.running; });
}

bool Supervisor::every_process_exited(int code) const {
  if (started_ != s_.nproc) return false;
  return std::all_of(children_.begin(), children_.end(), [&](const Child& c) {
    return !c.running && WIFEXITED(c.status) && WEXITSTATUS(c.status) == code;
  });
}

// The processes still running, each with "(stopped by SIGSTOP)" when it is.
std::string Supervisor::running_list() const {
  std::string out;
  for (const auto& c : children_)
    if (c.running) {
      out += (out.empty() ? "" : ", ") + who(c);
      if (c.stopped) out += " (stopped by " + signal_name(c.stop_signal) + ")";
    }
  return out;
}

}  // namespace commgrid::cli
