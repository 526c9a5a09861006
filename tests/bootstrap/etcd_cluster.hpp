// Real etcd servers for a test: one member or a cluster of several on free loopback ports,
// their data in a fresh temporary folder, every member killed and the folder removed at the
// end. available() is false (the test then skips, saying why) when etcd is not installed.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "commgrid/store.hpp"
#include "free_port.hpp"

namespace commgrid::test {

class EtcdCluster {
 public:
  explicit EtcdCluster(int members) {
    const std::string exe = COMMGRID_ETCD;
    if (exe.empty() || ::access(exe.c_str(), X_OK) != 0) {
      why_ = "etcd is not installed (Debian's etcd-server; scripts/install-deps installs it)";
      return;
    }
    char tmpl[] = "/tmp/commgrid-etcd-test-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      why_ = "cannot create a temporary folder";
      return;
    }
    dir_ = tmpl;
    std::string initial;
    for (int i = 0; i < members; ++i) {
      Member m;
      m.name = "m" + std::to_string(i);
      m.client_port = free_port();
      do m.peer_port = free_port();
      while (m.peer_port == m.client_port);
      initial += (i ? "," : "") + m.name + "=http://127.0.0.1:" + std::to_string(m.peer_port);
      members_.push_back(m);
    }
    for (auto& m : members_) {
      m.args = {exe, "--name", m.name, "--data-dir", dir_ + "/" + m.name, "--listen-client-urls",
                "http://127.0.0.1:" + std::to_string(m.client_port), "--advertise-client-urls",
                "http://127.0.0.1:" + std::to_string(m.client_port), "--listen-peer-urls",
                "http://127.0.0.1:" + std::to_string(m.peer_port), "--initial-advertise-peer-urls",
                "http://127.0.0.1:" + std::to_string(m.peer_port), "--initial-cluster", initial,
                "--initial-cluster-state", "new", "--initial-cluster-token",
                "commgrid-test-" + std::to_string(::getpid()),
                // Fast elections: a lost leader is replaced within about a second.
                "--heartbeat-interval", "50", "--election-timeout", "500", "--log-level", "error",
                "--logger", "zap"};
      start(m);
    }
    // Ready when a write goes through (every member up, a leader elected).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int attempt = 0; std::chrono::steady_clock::now() < deadline; ++attempt) {
      try {
        StoreOptions o;
        o.job_id = "probe-" + std::to_string(attempt);
        o.timeout = std::chrono::seconds(2);
        (void)open_store(uri(), o);
        ready_ = true;
        return;
      } catch (const Error&) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }
    }
    why_ = "the etcd cluster did not become ready within 60 s";
  }
  ~EtcdCluster() {
    for (auto& m : members_) stop(m);
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  [[nodiscard]] bool available() const { return ready_; }
  [[nodiscard]] const std::string& why_not() const { return why_; }
  [[nodiscard]] std::size_t size() const { return members_.size(); }
  /// "host:port" of member i's client URL.
  [[nodiscard]] std::string endpoint(std::size_t i) const {
    return "127.0.0.1:" + std::to_string(members_[i].client_port);
  }
  /// etcd://every member[/prefix].
  [[nodiscard]] std::string uri(const std::string& prefix = "") const {
    std::string out = "etcd://";
    for (std::size_t i = 0; i < members_.size(); ++i) out += (i ? "," : "") + endpoint(i);
    return prefix.empty() ? out : out + "/" + prefix;
  }
  /// Kills member i (SIGKILL) and reaps it.
  void kill(std::size_t i) { stop(members_[i]); }
  /// Sends member i a signal (SIGSTOP, SIGCONT).
  void signal(std::size_t i, int sig) const {
    if (members_[i].pid > 0) ::kill(members_[i].pid, sig);
  }
  /// The member every live member names as its leader (etcdctl endpoint status); -1 when
  /// they do not agree yet, none answers, or etcdctl is not installed.
  [[nodiscard]] int leader() const {
    const std::string exe = COMMGRID_ETCDCTL;
    if (exe.empty() || ::access(exe.c_str(), X_OK) != 0) return -1;
    auto number_after = [](const std::string& text, const std::string& name) {
      const std::size_t at = text.find("\"" + name + "\":");
      return at == std::string::npos
                 ? std::string()
                 : text.substr(at + name.size() + 3,
                               text.find_first_of(",}", at) - at - name.size() - 3);
    };
    std::string leader_id;
    int found = -1;
    for (std::size_t i = 0; i < members_.size(); ++i) {
      if (members_[i].pid <= 0) continue;
      const std::string cmd = "ETCDCTL_API=3 " + exe + " --endpoints " + endpoint(i) +
                              " --dial-timeout 2s endpoint status -w json 2>/dev/null";
      FILE* p = ::popen(cmd.c_str(), "r");
      if (p == nullptr) return -1;
      std::string out;
      char buf[4096];
      for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
      ::pclose(p);
      const std::string id = number_after(out, "member_id"), leads = number_after(out, "leader");
      if (id.empty() || leads.empty() || leads == "0") return -1;
      if (!leader_id.empty() && leads != leader_id) return -1;
      leader_id = leads;
      if (id == leads) found = static_cast<int>(i);
    }
    return found;
  }
  /// Runs etcdctl against member 0 with `args` (a shell fragment); its exit code. -1 when
  /// etcdctl is not installed.
  [[nodiscard]] int etcdctl(const std::string& args) const {
    const std::string exe = COMMGRID_ETCDCTL;
    if (exe.empty() || ::access(exe.c_str(), X_OK) != 0) return -1;
    const std::string cmd = "ETCDCTL_API=3 " + exe + " --endpoints " + endpoint(0) +
                            " --dial-timeout 5s " + args + " >/dev/null 2>&1";
    return std::system(cmd.c_str());
  }

 private:
  struct Member {
    std::string name;
    int client_port = 0, peer_port = 0;
    std::vector<std::string> args;
    pid_t pid = -1;
  };
  static void start(Member& m) {
    std::vector<char*> argv;
    for (auto& a : m.args) argv.push_back(a.data());
    argv.push_back(nullptr);
    m.pid = ::fork();
    if (m.pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  static void stop(Member& m) {
    if (m.pid <= 0) return;
    ::kill(m.pid, SIGCONT);
    ::kill(m.pid, SIGKILL);
    ::waitpid(m.pid, nullptr, 0);
    m.pid = -1;
  }
  std::vector<Member> members_;
  std::string dir_, why_;
  bool ready_ = false;
};

}  // namespace commgrid::test
