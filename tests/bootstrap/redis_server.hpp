// A redis-server on a free loopback port, started for a test and stopped after.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "commgrid/store.hpp"
#include "free_port.hpp"

namespace commgrid::test {

class RedisServer {
 public:
  /// With a password, the server requires it (--requirepass).
  explicit RedisServer(const std::string& password = "") {
    const std::string exe = COMMGRID_REDIS_SERVER;
    if (exe.empty() || ::access(exe.c_str(), X_OK) != 0) return;
    port_ = free_port();
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string port = std::to_string(port_);
      if (password.empty())
        ::execl(exe.c_str(), exe.c_str(), "--port", port.c_str(), "--bind", "127.0.0.1", "--save",
                "", "--appendonly", "no", "--loglevel", "warning", static_cast<char*>(nullptr));
      else
        ::execl(exe.c_str(), exe.c_str(), "--port", port.c_str(), "--bind", "127.0.0.1", "--save",
                "", "--appendonly", "no", "--loglevel", "warning", "--requirepass",
                password.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Ready when it accepts connections (a few milliseconds usually).
    for (int i = 0; i < 200 && !ready_; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
      try {
        make_redis_store("127.0.0.1", port_, "probe", password, StoreOptions{});
        ready_ = true;
      } catch (const BackendError&) {}
    }
  }
  ~RedisServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);  // a test may have stopped it
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  [[nodiscard]] bool available() const { return ready_; }
  [[nodiscard]] std::string uri(const std::string& prefix) const {
    return "redis://127.0.0.1:" + std::to_string(port_) + "/" + prefix;
  }
  [[nodiscard]] int port() const { return port_; }
  /// Sends the server a signal (SIGKILL, SIGSTOP, SIGCONT), as a failure would.
  void signal(int sig) const {
    if (pid_ > 0) ::kill(pid_, sig);
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  bool ready_ = false;
};

}  // namespace commgrid::test
