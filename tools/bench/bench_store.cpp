// `commgrid bench store`: N simulated ranks meet through a store the way a world's creation
// does (each connects and proves the job's token, sets its address, waits for and reads its
// peers'), with rank 0's server in a process of its own so that its time, peak memory and
// threads are its alone. The same work runs against commgrid's tcp:// store and against a
// private redis-server on the loopback (through commgrid's redis:// store, the password as
// the proof), side by side in one run.
#include "bench/bench_store.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "commgrid/error.hpp"
#include "commgrid/store.hpp"
#include "layout_flags.hpp"

namespace commgrid::cli {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

struct BenchStoreFlags {
  std::string clients = "1000,10000";
  int peers = 16;
  int value_bytes = 256;
  std::string engines = "tcp,redis";
  int at_once = 0;  // 0: as many as the descriptor limit allows
  int threads = 16;
  double timeout = 300;
  std::string format = "table";
  std::string redis_server = "redis-server";
};

struct Result {
  std::string engine;
  std::int64_t clients = 0, at_once = 0;
  double connect_s = 0, set_s = 0, read_s = 0, total_s = 0;
  double server_cpu_s = 0, server_peak_mib = 0;
  long server_threads = 0;
  std::int64_t errors = 0;
  std::string first_error;
};

long status_field(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  return -1;
}

double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  long ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i)
    if (i == 14 || i == 15) ticks += std::stol(field);
  return static_cast<double>(ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// This process's descriptor limit, raised to its hard limit.
long raise_descriptors() {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  ::getrlimit(RLIMIT_NOFILE, &rl);
  return rl.rlim_cur == RLIM_INFINITY ? (1L << 20) : static_cast<long>(rl.rlim_cur);
}

// A loopback port the kernel finds free now (bound to port 0, then released).
int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  if (!ok) throw BackendError("bench store: no free loopback port");
  return ntohs(a.sin_port);
}

// Rank 0's server in a process of its own: commgrid's tcp:// store (forked), or a
// redis-server (executed). Stopped when this object goes.
class ServerProcess {
 public:
  ServerProcess(const std::string& engine, int port, const std::string& token, long at_once,
                const BenchStoreFlags& f) {
    int ready[2];
    if (::pipe(ready) != 0) throw BackendError("bench store: pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw BackendError("bench store: fork failed");
    if (pid_ == 0) {
      ::close(ready[0]);
      const int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, 0);
      if (engine == "redis") {
        ::close(ready[1]);  // redis-server would hold it open: the parent waits on it only for tcp
        ::dup2(null, 1);
        ::dup2(null, 2);
        const std::string p = std::to_string(port), clients = std::to_string(at_once + 64);
        ::execlp(f.redis_server.c_str(), f.redis_server.c_str(), "--port", p.c_str(), "--bind",
                 "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning",
                 "--maxclients", clients.c_str(), "--requirepass", token.c_str(),
                 static_cast<char*>(nullptr));
        ::_exit(127);
      }
      std::shared_ptr<Store> store;
      std::string answer = "ready";
      try {
        StoreOptions o;
        o.job_id = "bench";
        o.token = token;
        o.serve = true;
        o.timeout = std::chrono::seconds(60);
        store = open_store("tcp://127.0.0.1:" + std::to_string(port), o);
      } catch (const std::exception& e) { answer = std::string("error: ") + e.what(); }
      (void)!::write(ready[1], answer.data(), answer.size());
      ::close(ready[1]);
      ::pause();  // until SIGTERM
      ::_exit(0);
    }
    ::close(ready[1]);
    if (engine == "redis") {  // ready when it answers (run_one)
      ::close(ready[0]);
      return;
    }
    std::string answer;
    char buf[512];
    for (ssize_t n; (n = ::read(ready[0], buf, sizeof buf)) > 0;)
      answer.append(buf, static_cast<size_t>(n));
    ::close(ready[0]);
    if (answer != "ready") throw BackendError("bench store: the server: " + answer);
  }
  ~ServerProcess() {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  [[nodiscard]] pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// Runs fn(i) for every i in [begin, end) on `threads` threads; the wall time. The first
// error of each client is counted.
double phase(std::int64_t begin, std::int64_t end, int threads,
             const std::function<void(std::int64_t)>& fn, Result& r, std::mutex& m) {
  const auto t0 = Clock::now();
  std::atomic<std::int64_t> next{begin};
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (std::int64_t i; (i = next.fetch_add(1)) < end;) {
        try {
          fn(i);
        } catch (const std::exception& e) {
          std::lock_guard lock(m);
          if (r.errors++ == 0) r.first_error = e.what();
        }
      }
    });
  for (auto& t : pool) t.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Result run_one(const std::string& engine, std::int64_t n, const BenchStoreFlags& f, long fds) {
  Result r;
  r.engine = engine;
  r.clients = n;
  r.at_once = f.at_once > 0 ? std::min<std::int64_t>(f.at_once, n)
                            : std::min<std::int64_t>(n, std::max<long>(16, fds - 1000));
  const int port = free_loopback_port();
  const std::string token = "bench-token-" + std::to_string(::getpid());
  ServerProcess server(engine, port, token, static_cast<long>(r.at_once), f);
  const std::string uri =
      engine == "tcp" ? "tcp://127.0.0.1:" + std::to_string(port)
                      : "redis://:" + token + "@127.0.0.1:" + std::to_string(port) + "/bench";
  StoreOptions o;
  o.job_id = "bench";
  o.token = engine == "tcp" ? token : "";  // Redis: the password is the proof
  o.timeout = std::chrono::milliseconds(static_cast<long long>(f.timeout * 1000));
  auto open = [&] { return open_store(uri, o); };
  if (engine == "redis") {
    // Ready when it answers (it starts in milliseconds; allow a few seconds on a loaded machine).
    bool up = false;
    for (int i = 0; i < 400 && !up; ++i) {
      try {
        StoreOptions probe = o;
        probe.timeout = std::chrono::seconds(2);
        (void)open_store(uri, probe);
        up = true;
      } catch (const Error&) { std::this_thread::sleep_for(std::chrono::milliseconds(25)); }
    }
    if (!up) throw BackendError("bench store: redis-server (" + f.redis_server + ") did not start");
  }
  std::atomic<bool> sampling{true};
  std::atomic<long> peak_threads{0};
  std::thread sampler([&] {
    while (sampling.load()) {
      peak_threads = std::max(peak_threads.load(), status_field(server.pid(), "Threads"));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const double cpu0 = cpu_seconds(server.pid());
  const std::string value(static_cast<size_t>(f.value_bytes), 'a');
  auto key = [](std::int64_t i) { return "addr/" + std::to_string(i); };
  // A rank's peers: k of them spread over the world (all others when the world is smaller).
  const std::int64_t k = std::min<std::int64_t>(f.peers, n - 1);
  const std::int64_t stride = std::max<std::int64_t>(1, (n - 1) / std::max<std::int64_t>(1, k));
  std::mutex m;
  std::vector<std::shared_ptr<Store>> stores(static_cast<size_t>(r.at_once));
  auto read_peers = [&](Store& s, std::int64_t i) {
    std::vector<std::string> keys;
    for (std::int64_t j = 0; j < k; ++j) keys.push_back(key((i + 1 + j * stride) % n));
    const auto missing = s.wait_for(keys, o.timeout);
    if (!missing.empty()) throw TimeoutError("bench store: " + missing.front() + " never came");
    for (const auto& kk : keys)
      if (s.get(kk).size() != value.size()) throw BackendError("bench store: " + kk + " is wrong");
  };
  const auto t0 = Clock::now();
  if (r.at_once >= n) {
    // Every rank holds its connection through the whole rendezvous, as ranks do.
    r.connect_s = phase(
        0, n, f.threads, [&](std::int64_t i) { stores[static_cast<size_t>(i)] = open(); }, r, m);
    r.set_s = phase(
        0, n, f.threads,
        [&](std::int64_t i) {
          if (auto& s = stores[static_cast<size_t>(i)]) s->set(key(i), value);
        },
        r, m);
    r.read_s = phase(
        0, n, f.threads,
        [&](std::int64_t i) {
          if (auto& s = stores[static_cast<size_t>(i)]) read_peers(*s, i);
        },
        r, m);
  } else {
    // More ranks than descriptors: waves of at_once connections, each rank connecting
    // twice (to set, then to read once every address is there).
    for (std::int64_t b = 0; b < n; b += r.at_once) {
      const std::int64_t e = std::min(n, b + r.at_once);
      r.connect_s += phase(
          b, e, f.threads, [&](std::int64_t i) { stores[static_cast<size_t>(i - b)] = open(); }, r,
          m);
      r.set_s += phase(
          b, e, f.threads,
          [&](std::int64_t i) {
            if (auto& s = stores[static_cast<size_t>(i - b)]) s->set(key(i), value);
          },
          r, m);
      for (auto& s : stores) s.reset();
    }
    for (std::int64_t b = 0; b < n; b += r.at_once) {
      const std::int64_t e = std::min(n, b + r.at_once);
      r.connect_s += phase(
          b, e, f.threads, [&](std::int64_t i) { stores[static_cast<size_t>(i - b)] = open(); }, r,
          m);
      r.read_s += phase(
          b, e, f.threads,
          [&](std::int64_t i) {
            if (auto& s = stores[static_cast<size_t>(i - b)]) read_peers(*s, i);
          },
          r, m);
      for (auto& s : stores) s.reset();
    }
  }
  r.total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  r.server_cpu_s = cpu_seconds(server.pid()) - cpu0;
  r.server_peak_mib = static_cast<double>(status_field(server.pid(), "VmHWM")) / 1024.0;
  sampling = false;
  sampler.join();
  r.server_threads = peak_threads.load();
  stores.clear();
  return r;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

int run_bench_store(const BenchStoreFlags& f) {
  if (f.format != "table" && f.format != "json")
    throw ConfigError("format", "format: unknown format \"" + f.format + "\" (valid: table, json)");
  if (f.peers < 1)
    throw ConfigError("peers", "--peers must be >= 1, got " + std::to_string(f.peers));
  if (f.value_bytes < 1 || f.value_bytes > (1 << 20))
    throw ConfigError("value-bytes", "--value-bytes must be in [1, 1048576], got " +
                                         std::to_string(f.value_bytes));
  if (f.threads < 1 || f.threads > 1024)
    throw ConfigError("threads",
                      "--threads must be in [1, 1024], got " + std::to_string(f.threads));
  if (!(f.timeout > 0) || f.timeout > 1e6)
    throw ConfigError("timeout", "--timeout must be a positive number of seconds");
  const std::vector<std::int64_t> sizes = parse_integer_list("clients", f.clients, 2);
  std::vector<std::string> engines;
  for (std::stringstream s(f.engines); s.good();) {
    std::string e;
    std::getline(s, e, ',');
    if (e != "tcp" && e != "redis")
      throw ConfigError("engines", "engines: unknown engine \"" + e + "\" (valid: tcp, redis)");
    engines.push_back(e);
  }
  ::signal(SIGPIPE, SIG_IGN);
  const long fds = raise_descriptors();
  std::vector<Result> results;
  for (std::int64_t n : sizes)
    for (const auto& e : engines) {
      results.push_back(run_one(e, n, f, fds));
      if (f.format == "table")
        std::cerr << "bench store: " << e << " with " << n
                  << " clients: " << fixed(results.back().total_s, 2) << " s\n";
    }
  if (f.format == "json") {
    Json j;
    j["benchmark"] = "store";
    j["peers"] = f.peers;
    j["value_bytes"] = f.value_bytes;
    j["client_threads"] = f.threads;
    j["descriptor_limit"] = fds;
    for (const auto& r : results)
      j["results"].push_back({{"engine", r.engine},
                              {"clients", r.clients},
                              {"at_once", r.at_once},
                              {"connect_s", r.connect_s},
                              {"set_s", r.set_s},
                              {"read_s", r.read_s},
                              {"total_s", r.total_s},
                              {"server_cpu_s", r.server_cpu_s},
                              {"server_peak_rss_mib", r.server_peak_mib},
                              {"server_threads", r.server_threads},
                              {"errors", r.errors},
                              {"first_error", r.first_error}});
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "store rendezvous: each client connects and proves the token, sets a "
              << f.value_bytes << "-byte address, waits for and reads " << f.peers << " peers'; "
              << f.threads << " client threads; descriptor limit " << fds << "\n";
    std::cout
        << "| engine | clients | at once | connect s | set s | read s | total s | server CPU s | server peak RSS MiB | server threads | errors |\n"
        << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const auto& r : results)
      std::cout << "| " << (r.engine == "tcp" ? "commgrid tcp://" : "redis-server") << " | "
                << r.clients << " | " << r.at_once << " | " << fixed(r.connect_s, 2) << " | "
                << fixed(r.set_s, 2) << " | " << fixed(r.read_s, 2) << " | " << fixed(r.total_s, 2)
                << " | " << fixed(r.server_cpu_s, 2) << " | " << fixed(r.server_peak_mib, 1)
                << " | " << r.server_threads << " | " << r.errors << " |\n";
    for (const auto& r : results)
      if (r.errors > 0)
        std::cout << r.engine << " " << r.clients << ": first error: " << r.first_error << "\n";
  }
  for (const auto& r : results)
    if (r.errors > 0) return 1;
  return 0;
}

}  // namespace

Command add_bench_store_command(CLI::App& bench) {
  auto f = std::make_shared<BenchStoreFlags>();
  CLI::App* app = bench.add_subcommand(
      "store",
      "a rendezvous of N simulated ranks through the tcp:// store, side by side with redis-server");
  app->add_option("--clients", f->clients,
                  "simulated ranks, e.g. 1000,10000,100000 (default 1000,10000)");
  app->add_option("--peers", f->peers, "peers' addresses each rank reads (16)")->type_name("INT");
  app->add_option("--value-bytes", f->value_bytes, "bytes of each address (256)")->type_name("INT");
  app->add_option("--engines", f->engines, "tcp,redis (default both)");
  app->add_option("--at-once", f->at_once,
                  "most connections held at once (default: the descriptor limit less 1000; "
                  "fewer than the clients: in waves)")
      ->type_name("INT");
  app->add_option("--threads", f->threads, "client threads (16)")->type_name("INT");
  app->add_option("--timeout", f->timeout, "seconds each store operation may take (300)");
  app->add_option("--redis-server", f->redis_server,
                  "the redis-server program (default: from PATH)");
  app->add_option("--format", f->format, "table (default) or json");
  app->footer(
      "Example: commgrid bench store --clients 1000,10000\n"
      "         commgrid bench store --clients 100000 --engines tcp");
  return {app, [f] { return run_bench_store(*f); }};
}

}  // namespace commgrid::cli
