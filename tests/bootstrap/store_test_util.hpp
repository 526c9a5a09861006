// Helpers for the store tests: a tcp:// store served by a forked child (so that the test can
// measure it, limit it, and see it crash without crashing itself), raw connections as a
// stranger makes them, and what /proc says about a process.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commgrid/store.hpp"
#include "free_port.hpp"

namespace commgrid::test {

/// A fresh temporary folder, removed afterwards.
class TempFolder {
 public:
  TempFolder() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "commgrid-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempFolder() { std::filesystem::remove_all(path_); }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string tcp_uri(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }

inline StoreOptions job(const std::string& id, const std::string& token, bool serve,
                        std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  StoreOptions o;
  o.job_id = id;
  o.token = token;
  o.serve = serve;
  o.timeout = timeout;
  return o;
}

/// A line of /proc/PID/status ("VmRSS", "Threads"), as its number (kB for sizes); -1 if absent.
inline long proc_status(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  return -1;
}

/// User plus system CPU time of a process, in clock ticks (/proc/PID/stat fields 14, 15).
inline long cpu_ticks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

/// Raises this process's descriptor limit to `want` (at most its hard limit); the new soft limit.
inline long raise_descriptor_limit(long want) {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < static_cast<rlim_t>(want)) {
    rl.rlim_cur = std::min<rlim_t>(static_cast<rlim_t>(want), rl.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  ::getrlimit(RLIMIT_NOFILE, &rl);
  return static_cast<long>(rl.rlim_cur);
}

/// A TCP connection to 127.0.0.1:port as a stranger makes it (blocking); -1 on failure.
inline int raw_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/// Reads what the other side sends until it closes the connection: the bytes read, or -1 when
/// the connection is still open after `wait` (a generous bound: a loaded machine).
inline long bytes_until_closed(int fd, std::chrono::milliseconds wait = std::chrono::seconds(30)) {
  long got = 0;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return -1;
    char buf[256];
    const ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) return got;
    got += r;
  }
}

/// A tcp:// store served by a forked child process for `options` (serve is set). `before`
/// runs in the child before it serves (e.g. setrlimit); `command(byte)` is run by the child
/// for each byte the test sends with tell() (its answer, a line, comes back from tell).
class ServerChild {
 public:
  explicit ServerChild(StoreOptions options, std::function<void()> before = {},
                       std::function<std::string(char)> command = {}) {
    port_ = free_port();
    int to_child[2], from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(to_child[1]);
      ::close(from_child[0]);
      std::string answer = "ready\n";
      std::shared_ptr<Store> store;
      try {
        if (before) before();
        options.serve = true;
        store = open_store(tcp_uri(port_), options);
      } catch (const std::exception& e) { answer = std::string("error: ") + e.what() + "\n"; }
      (void)!::write(from_child[1], answer.data(), answer.size());
      char c = 0;
      while (::read(to_child[0], &c, 1) == 1) {
        const std::string reply = (command ? command(c) : std::string("?")) + "\n";
        (void)!::write(from_child[1], reply.data(), reply.size());
      }
      store.reset();  // the test closed its end: stop serving
      ::_exit(0);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    to_ = to_child[1];
    from_ = from_child[0];
    status_ = read_line();
  }
  ~ServerChild() {
    if (to_ >= 0) ::close(to_);
    if (from_ >= 0) ::close(from_);
    if (pid_ > 0 && !reaped_) {
      // Give it a moment to end by itself; then make sure.
      for (int i = 0; i < 100 && ::waitpid(pid_, &wstatus_, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, WNOHANG);
    }
  }
  ServerChild(const ServerChild&) = delete;
  ServerChild& operator=(const ServerChild&) = delete;

  /// "ready" once it serves, or "error: ..." when it could not.
  [[nodiscard]] const std::string& status() const { return status_; }
  [[nodiscard]] pid_t pid() const { return pid_; }
  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] std::string uri() const { return tcp_uri(port_); }
  /// Whether the child is still running (not crashed, not exited).
  [[nodiscard]] bool alive() {
    if (reaped_) return false;
    if (::waitpid(pid_, &wstatus_, WNOHANG) == pid_) reaped_ = true;
    return !reaped_;
  }
  /// How it ended, once !alive(): "exit N" or "signal N".
  [[nodiscard]] std::string ending() const {
    if (!reaped_) return "running";
    return WIFSIGNALED(wstatus_) ? "signal " + std::to_string(WTERMSIG(wstatus_))
                                 : "exit " + std::to_string(WEXITSTATUS(wstatus_));
  }
  /// Sends the child a command byte; its one-line answer.
  std::string tell(char c) {
    (void)!::write(to_, &c, 1);
    return read_line();
  }

 private:
  std::string read_line() {
    std::string line;
    char c = 0;
    while (::read(from_, &c, 1) == 1 && c != '\n') line += c;
    return line;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  int to_ = -1, from_ = -1;
  int wstatus_ = 0;
  bool reaped_ = false;
  std::string status_;
};

}  // namespace commgrid::test
