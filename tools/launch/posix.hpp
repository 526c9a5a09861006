// The POSIX pieces `commgrid launch` is built from: owned descriptors and pipes, the job's
// temporary store folder, the launcher's signal handling (a self-pipe), and the words for a
// process's end. No knowledge of ranks or stores.
#pragma once

#include <csignal>

#include <cstddef>
#include <iterator>
#include <string>
#include <utility>

namespace commgrid::cli {

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
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  void reset() noexcept;
  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool open() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

/// Both ends of a pipe(2), close-on-exec.
struct Pipe {
  Fd read, write;
};

/// A close-on-exec pipe; throws commgrid::Error naming the errno.
[[nodiscard]] Pipe make_pipe();

/// A fresh folder for the job's file store (under $TMPDIR, else /tmp), removed with
/// everything in it when the launch ends, however it ends.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

/// Installs the launcher's handlers for SIGCHLD, SIGINT, SIGTERM and SIGHUP, which write the
/// signal's number into `write_fd` (a self-pipe: the handler does nothing unsafe), and
/// ignores SIGPIPE (a closed stdout must not kill the launcher before it stops its ranks);
/// restores the previous dispositions when destroyed. One at a time per process.
class SignalGuard {
 public:
  explicit SignalGuard(int write_fd);
  ~SignalGuard();
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

 private:
  static constexpr int kHandled[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_[std::size(kHandled)]{};
  struct sigaction old_pipe_ {};
};

/// Blocks every signal for as long as it lives (around fork, so that no handler of launch
/// runs in a child before the child has reset them), and restores the mask.
class BlockSignals {
 public:
  BlockSignals();
  ~BlockSignals();
  BlockSignals(const BlockSignals&) = delete;
  BlockSignals& operator=(const BlockSignals&) = delete;
  [[nodiscard]] const sigset_t& old() const noexcept { return old_; }

 private:
  sigset_t old_{};
};

/// "SIGKILL", "SIGSTOP", ..., or "signal N".
[[nodiscard]] std::string signal_name(int sig);

/// How a process ended, from its wait status: "exited with code 1", "killed by signal 9
/// (SIGKILL)".
[[nodiscard]] std::string describe_end(int status);

/// Writes all of `s` to `fd`, retrying after EINTR; gives up quietly when the descriptor is
/// gone (EPIPE: launch's own output was closed; it keeps supervising the ranks).
void write_all(int fd, const std::string& s);

/// A TCP port that nothing listens on right now (the kernel's choice), or 0 when none can
/// be had. Like torchrun's, it is free when chosen, not reserved.
[[nodiscard]] int free_tcp_port();

}  // namespace commgrid::cli
