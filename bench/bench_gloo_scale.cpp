// The largest Gloo world this machine holds: W ranks (rank-threads in P processes, each
// rank with its own connection to a tcp:// store served by this process) create the world
// and every group (member strategy), check it with an allreduce on the world and on their
// dp group, and end. Prints one markdown row: wall time, the store server's peak memory,
// the ranks' summed peak memory, the peak of TCP sockets in use on the machine.
//
//   bench_gloo_scale --world 256 --procs 16 [--tp 8 --pp 4 --cp 2 --ep 4] [--timeout 600]
//
// Each rank listens on its own loopback address (127.0.0.X): the kernel's ephemeral ports
// (about 28,000 here) are per address, and a Gloo world of W has W(W-1) pair listeners open
// at once while it connects. Exit 0 when every rank succeeded.
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commgrid/commgrid.hpp"
#include "free_port.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::int64_t world = 256, procs = 16, tp = 8, pp = 4, cp = 2, ep = 4, timeout_s = 600;
  // child only
  int port = 0;
  std::int64_t first = 0, count = 0;
  std::string token;
};

commgrid::ParallelConfig config(const Args& a) {
  commgrid::ParallelConfig c;
  c.world_size = a.world;
  c.tp = a.tp;
  c.pp = a.pp;
  c.cp = a.cp;
  c.ep = a.ep;
  return c;
}

std::int64_t status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::strlen(field)));
  return 0;
}

std::int64_t tcp_sockets_in_use() {
  std::ifstream in("/proc/net/sockstat");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("TCP:", 0) != 0) continue;
    std::istringstream words(line);
    std::string w;
    while (words >> w)
      if (w == "inuse" && words >> w) return std::stoll(w);
  }
  return 0;
}

void raise_descriptor_limit() {
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) == 0 && l.rlim_cur < l.rlim_max) {
    l.rlim_cur = l.rlim_max;
    setrlimit(RLIMIT_NOFILE, &l);
  }
}

// One process's ranks [first, first + count).
int run_child(const Args& a) {
  raise_descriptor_limit();
  const commgrid::ParallelConfig cfg = config(a);
  const auto timeout = std::chrono::seconds(a.timeout_s);
  std::mutex m;
  std::vector<std::string> errors;
  {
    std::vector<std::jthread> ranks;
    for (std::int64_t r = a.first; r < a.first + a.count; ++r) {
      ranks.emplace_back([&, r] {
        try {
          commgrid::StoreOptions so;
          so.job_id = "scale";
          so.token = a.token;
          so.timeout = timeout;
          so.rank = static_cast<int>(r);
          auto store = commgrid::open_store("tcp://127.0.0.1:" + std::to_string(a.port), so);
          commgrid::GlooOptions o;
          o.timeout = timeout;
          o.token = a.token;
          o.hostname = "127.0." + std::to_string(1 + r / 250) + "." + std::to_string(1 + r % 250);
          o.store = store;
          o.rank = static_cast<commgrid::Rank>(r);
          o.size = static_cast<commgrid::Rank>(a.world);
          const auto t0 = Clock::now();
          auto world = commgrid::make_gloo_world(o);
          const auto t1 = Clock::now();
          commgrid::ProcessGroups pg;
          commgrid::InitOptions io;
          io.strategy = commgrid::CreationStrategy::member;
          pg.initialize(*world, cfg, io);
          const auto t2 = Clock::now();
          // Every group is used once: the world and this rank's dp group sum their ranks.
          std::int64_t v = r, expect = a.world * (a.world - 1) / 2;
          world->allreduce(&v, &v, 1, commgrid::DataType::int64, commgrid::ReduceOp::sum)->wait();
          if (v != expect)
            throw std::runtime_error("world allreduce gave " + std::to_string(v) + ", expected " +
                                     std::to_string(expect));
          commgrid::Communicator& dp = pg.group(commgrid::GroupKind::dp);
          std::int64_t one = 1;
          dp.allreduce(&one, &one, 1, commgrid::DataType::int64, commgrid::ReduceOp::sum)->wait();
          if (one != dp.size())
            throw std::runtime_error("dp allreduce gave " + std::to_string(one) + ", expected " +
                                     std::to_string(dp.size()));
          world->barrier()->wait();
          if (r == 0) {
            auto s = [](auto d) { return std::chrono::duration<double>(d).count(); };
            std::lock_guard lock(m);
            std::cout << "rank 0: world " << s(t1 - t0) << " s, every group " << s(t2 - t1)
                      << " s\n"
                      << std::flush;
          }
          pg.destroy();
        } catch (const std::exception& e) {
          std::lock_guard lock(m);
          errors.push_back("rank " + std::to_string(r) + ": " + e.what());
        }
      });
    }
  }
  if (errors.empty()) return 0;
  // A failure's consequences (peers' closed or refused connections) after its cause.
  auto consequence = [](const std::string& e) {
    return e.find("Connection closed by peer") != std::string::npos ||
           e.find("Connection refused") != std::string::npos;
  };
  std::stable_partition(errors.begin(), errors.end(),
                        [&](const std::string& e) { return !consequence(e); });
  for (size_t i = 0; i < std::min<size_t>(errors.size(), 3); ++i)
    std::cerr << "error: " << errors[i] << "\n";
  if (errors.size() > 3)
    std::cerr << "error: ... and " << errors.size() - 3 << " more ranks of this process\n";
  return 1;
}

int run_parent(const Args& a) {
  raise_descriptor_limit();
  if (a.world < 1 || a.procs < 1 || a.procs > a.world) {
    std::cerr << "error: --world " << a.world << " --procs " << a.procs
              << ": need 1 <= procs <= world\n";
    return 2;
  }
  config(a).validate();
  std::mt19937_64 gen(std::random_device{}());
  std::ostringstream tok;
  tok << std::hex << gen() << gen() << gen() << gen();
  const std::string token = tok.str();
  const int port = commgrid::test::free_port();
  commgrid::StoreOptions so;
  so.job_id = "scale";
  so.token = token;
  so.serve = true;
  so.timeout = std::chrono::seconds(a.timeout_s);
  auto server = commgrid::open_store("tcp://127.0.0.1:" + std::to_string(port), so);
  const std::int64_t sockets0 = tcp_sockets_in_use();
  std::atomic<bool> done{false};
  std::atomic<std::int64_t> peak_sockets{0};
  std::jthread sampler([&] {
    while (!done) {
      peak_sockets = std::max(peak_sockets.load(), tcp_sockets_in_use() - sockets0);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  const auto t0 = Clock::now();
  std::vector<pid_t> children;
  for (std::int64_t p = 0; p < a.procs; ++p) {
    const std::int64_t first = a.world * p / a.procs, last = a.world * (p + 1) / a.procs;
    std::vector<std::string> argv_s{"/proc/self/exe",
                                    "--child",
                                    std::to_string(port),
                                    std::to_string(first),
                                    std::to_string(last - first),
                                    token,
                                    "--world",
                                    std::to_string(a.world),
                                    "--tp",
                                    std::to_string(a.tp),
                                    "--pp",
                                    std::to_string(a.pp),
                                    "--cp",
                                    std::to_string(a.cp),
                                    "--ep",
                                    std::to_string(a.ep),
                                    "--timeout",
                                    std::to_string(a.timeout_s)};
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // no rank outlives the benchmark
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    if (pid < 0) {
      std::cerr << "error: fork failed: " << std::strerror(errno) << "\n";
      return 1;
    }
    children.push_back(pid);
  }
  int failed = 0;
  std::int64_t rss_kib = 0;
  for (pid_t pid : children) {
    int status = 0;
    rusage ru{};
    wait4(pid, &status, 0, &ru);
    rss_kib += ru.ru_maxrss;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  done = true;
  std::cout << "| " << a.world << " | " << a.procs << " x " << (a.world + a.procs - 1) / a.procs
            << " | tp " << a.tp << " pp " << a.pp << " cp " << a.cp << " ep " << a.ep << " | "
            << (failed == 0 ? "yes" : "NO (" + std::to_string(failed) + " processes failed)")
            << " | " << wall << " s | " << status_kib("VmHWM:") / 1024 << " MiB | "
            << rss_kib / 1024 << " MiB | " << peak_sockets.load() << " |\n";
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  bool child = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string s = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(s + " needs a value");
        return argv[++i];
      };
      if (s == "--child") {
        child = true;
        a.port = std::stoi(next());
        a.first = std::stoll(next());
        a.count = std::stoll(next());
        a.token = next();
      } else if (s == "--world") a.world = std::stoll(next());
      else if (s == "--procs") a.procs = std::stoll(next());
      else if (s == "--tp") a.tp = std::stoll(next());
      else if (s == "--pp") a.pp = std::stoll(next());
      else if (s == "--cp") a.cp = std::stoll(next());
      else if (s == "--ep") a.ep = std::stoll(next());
      else if (s == "--timeout") a.timeout_s = std::stoll(next());
      else throw std::invalid_argument("unknown argument '" + s + "'");
    }
  } catch (const std::exception& e) {
    std::cerr
        << "error: " << e.what()
        << " (usage: bench_gloo_scale --world W --procs P [--tp --pp --cp --ep N] [--timeout S])\n";
    return 2;
  }
  try {
    return child ? run_child(a) : run_parent(a);
  } catch (const commgrid::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
