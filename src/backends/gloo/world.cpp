// Starting a Gloo world: the world-size check, the TCP device, the world's connections;
// and the world of a launched process (the launcher's environment, its store).
#include <csignal>

#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <numeric>
#include <span>
#include <thread>

#include "commgrid/gloo.hpp"
#include "commgrid/launch_info.hpp"
#include "connection.hpp"
#include "gloo_communicator.hpp"
#include "gloo_errors.hpp"
#include "gloo_options.hpp"
#include "mesh_view.hpp"
#include "time_text.hpp"

namespace commgrid {
namespace gloo_backend {
namespace {

using Ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Listeners bind only to the interface the job uses: the local end of this rank's
// connection to the store (127.0.0.1 for the memory and file stores).
std::string default_hostname(const commgrid::Store& store) { return store.local_address(); }

// Every rank records the world size it was given before Gloo exchanges addresses (whose
// layout depends on the size), so that a mismatch is named instead of failing inside Gloo.
// Rank 0 alone reads every rank's size and then publishes its verdict; every other rank
// reads only rank 0's size and that verdict: O(size) store reads in all, not O(size^2).
void check_world_size(commgrid::Store& store, const std::string& prefix, int rank, int size,
                      Ms timeout, Clock::time_point deadline) {
  auto key = [&](int r) { return prefix + "/size/" + std::to_string(r); };
  const std::string verdict_key = prefix + "/size/verdict";
  const std::string mine = std::to_string(size);
  auto read = [&](const std::string& k) {
    const std::vector<char> v = store.get(k);
    return std::string(v.begin(), v.end());
  };
  auto left = [&] {
    return std::max(Ms(0), std::chrono::duration_cast<Ms>(deadline - Clock::now()));
  };
  auto mismatch = [](int r, const std::string& theirs, const std::string& zeros) {
    return IncompatibleError("world_size", "gloo create world: rank " + std::to_string(r) +
                                               " says world size " + theirs + ", rank 0 says " +
                                               zeros);
  };
  auto timed_out = [&](const std::string& waiting_for) {
    return TimeoutError("gloo create world on world: timed out after " + seconds_text(timeout) +
                        " waiting for " + waiting_for + " (store " + store.uri() + ", keys " +
                        prefix + "/*)");
  };
  auto missing_ranks = [&](const std::vector<int>& missing) {
    // World ranks are global ranks: both lists are the same, written as everywhere else.
    return std::string(missing.size() == 1 ? "rank " : "ranks ") + join_ints(missing) +
           " (global " + join_ints(missing) + ") of " + std::to_string(size) + " to arrive";
  };
  guard("create world", "world",
        [&] { store.set(key(rank), std::span<const char>(mine.data(), mine.size())); });
  if (rank == 0) {
    // The verdict ("o" ok, "i" or "t" and the error) lets every rank report the same error.
    auto publish = [&](char kind, const std::string& text) {
      const std::string v = kind + text;
      guard("create world", "world",
            [&] { store.set(verdict_key, std::span<const char>(v.data(), v.size())); });
    };
    // Ranks are checked in order: each round polls only the first missing one, so the reads
    // are one per rank plus one per pause, not one per rank per pause.
    int next = 1;
    auto pause = Ms(1);
    while (next < size) {
      // Throws AbortedError once the store is aborted or this thread's WaitWatch key is set
      // (a failure elsewhere: Recovery::build).
      if (store.aborted() || WaitWatch::current() != nullptr) (void)store.wait_for({}, Ms(0));
      if (store.has(key(next))) {
        if (const std::string theirs = read(key(next)); theirs != mine) {
          const IncompatibleError e = mismatch(next, theirs, mine);
          publish('i', e.what());
          throw e;  // NOLINT(misc-throw-by-value-catch-by-reference): published, then thrown
        }
        ++next;
        pause = Ms(1);
        continue;
      }
      if (Clock::now() >= deadline) {
        // Name every rank still missing, or a later rank that did arrive with another size.
        std::vector<int> missing;
        for (int r = next; r < size; ++r) {
          if (!store.has(key(r))) {
            missing.push_back(r);
          } else if (const std::string theirs = read(key(r)); theirs != mine) {
            const IncompatibleError e = mismatch(r, theirs, mine);
            publish('i', e.what());
            throw e;  // NOLINT(misc-throw-by-value-catch-by-reference): published, then thrown
          }
        }
        const TimeoutError e = timed_out(missing_ranks(missing));
        publish('t', e.what());
        throw e;  // NOLINT(misc-throw-by-value-catch-by-reference): published, then thrown
      }
      std::this_thread::sleep_for(std::min(pause, left() + Ms(1)));
      pause = std::min(pause * 2, Ms(20));
    }
    if (size > 1) publish('o', "");
    return;
  }
  const std::string zero_key = key(0);
  if (!store.wait_for(std::span<const std::string>(&zero_key, 1), left()).empty())
    throw timed_out(missing_ranks({0}));
  if (const std::string zeros = read(zero_key); zeros != mine) throw mismatch(rank, mine, zeros);
  // Rank 0 publishes its verdict when its own deadline passes, which may be a little after
  // this rank's when it arrived later; a grace of up to a second (within the bound of the
  // timeout plus 2 s) lets this rank report rank 0's finding rather than a bare timeout.
  const Ms grace = std::min(timeout, Ms(1000));
  if (!store.wait_for(std::span<const std::string>(&verdict_key, 1), left() + grace).empty())
    throw timed_out("rank 0 to see every rank arrive (rank 0's error names those missing)");
  const std::string verdict = read(verdict_key);
  if (verdict.starts_with("i")) throw IncompatibleError("world_size", verdict.substr(1));
  if (verdict.starts_with("t")) throw TimeoutError(verdict.substr(1));
}

}  // namespace
}  // namespace gloo_backend

namespace gloo_backend {
namespace {

// What make_gloo_world and make_gloo_connections check and set up alike: the options, the
// TCP device (with its loop poker) and SIGPIPE.
std::shared_ptr<Shared> start_device(const GlooOptions& options, const char* what) {
  const std::string w = what;
  if (!options.store) throw ConfigError("store", w + ": no store given");
  if (options.size < 1 || options.size > INT_MAX)
    throw InvalidValueError("world_size", w + ": world size must be in [1, " +
                                              std::to_string(INT_MAX) + "], got " +
                                              std::to_string(options.size));
  if (options.rank < 0 || options.rank >= options.size)
    throw RankOutOfRangeError("rank", w + ": rank " + std::to_string(options.rank) +
                                          " is not in [0, " + std::to_string(options.size) + ")");
  if (options.timeout.count() <= 0)
    throw InvalidValueError(
        "timeout", w + ": timeout must be > 0 ms, got " + std::to_string(options.timeout.count()));
  if (options.prefix.empty()) throw ConfigError("prefix", w + ": empty key prefix");
  if (options.algorithm != GlooAlgorithm::automatic && options.algorithm != GlooAlgorithm::ring &&
      options.algorithm != GlooAlgorithm::bcube)
    throw InvalidValueError("algorithm", w + ": algorithm " +
                                             std::to_string(static_cast<int>(options.algorithm)) +
                                             " is not automatic, ring or bcube");
  auto shared = std::make_shared<Shared>();
  shared->store = options.store;
  shared->algorithm = options.algorithm;
  shared->token =
      effective_token(*shared->store, options.token);  // no token: the store's job secret
  ::gloo::transport::tcp::attr attr;
  attr.hostname = options.hostname.empty() ? default_hostname(*shared->store) : options.hostname;
  guard(
      "create device", "world",
      [&] { shared->device = ::gloo::transport::tcp::CreateDevice(attr); },
      "hostname " + attr.hostname);
  // Connecting and closing a pair each wait for a turn of the device's loop: at once, not
  // in up to 10 ms (loop_poke.hpp).
  shared->poker = std::make_unique<LoopPoker>(shared->device);
  // Gloo writes to peers' sockets without MSG_NOSIGNAL: a peer that died would kill this
  // rank with SIGPIPE. Ignored (unless the program chose a handler), the write fails with
  // EPIPE and the survivor reports the lost peer as an error.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL)
    ::signal(SIGPIPE, SIG_IGN);
  return shared;
}

class KeptConnections final : public GlooConnections {
 public:
  KeptConnections(std::shared_ptr<ProcessMesh> mesh) : mesh_(std::move(mesh)) {}

  std::unique_ptr<Communicator> world(const std::string& prefix, std::int64_t epoch,
                                      const std::vector<std::int64_t>& process_of,
                                      const std::vector<std::int64_t>& renew) override {
    const auto deadline = Clock::now() + mesh_->timeout();
    const int me = mesh_->process();
    std::vector<int> processes;
    int rank = -1;
    for (const std::int64_t p : process_of) {
      if (p < 0 || p >= mesh_->processes())
        throw RankOutOfRangeError("process_of", "gloo kept connections: process " +
                                                    std::to_string(p) + " is not in [0, " +
                                                    std::to_string(mesh_->processes()) + ")");
      if (p == me) rank = static_cast<int>(processes.size());
      processes.push_back(static_cast<int>(p));
    }
    if (rank < 0)
      throw ConfigError("process_of", "gloo kept connections: process " + std::to_string(me) +
                                          " is not in the world of epoch " + std::to_string(epoch));
    mesh_->begin_epoch(epoch);
    std::vector<int> peers;
    // Only pairs within this epoch's world: a dead process's are never used again, a
    // spare's wait until it joins a world (the pair stays listed until then).
    for (const std::int64_t p : renew)
      if (p != me && std::find(process_of.begin(), process_of.end(), p) != process_of.end())
        peers.push_back(static_cast<int>(p));
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    mesh_->connect(prefix + "/renew", peers, static_cast<std::uint32_t>(epoch), deadline);
    // The world's view is named by the epoch (a derived namespace, alike everywhere), or,
    // past the derived ones, by rank 0 through the store.
    const std::optional<std::uint32_t> base = mesh_->derived_base(epoch);
    const std::uint32_t ns = base ? *base
                                  : agree_namespaces(*mesh_, {prefix + "/namespace"}, {rank == 0},
                                                     deadline, "create world", "world")
                                        .front();
    std::vector<int> global(processes.size());
    std::iota(global.begin(), global.end(), 0);
    auto ctx = std::make_shared<MeshViewContext>(mesh_, std::move(processes), rank, ns);
    if (base) ctx->view().set_derived(*base);
    // No barrier: the pairs made anew were proven by both ends, the others were connected
    // already, and a view connects nothing.
    return std::make_unique<GlooCommunicator>("world", mesh_->shared(), std::move(ctx),
                                              std::move(global), prefix, mesh_->timeout());
  }

  std::vector<std::int64_t> end_epoch() override {
    const std::vector<int> peers = mesh_->end_epoch();
    return {peers.begin(), peers.end()};
  }

  [[nodiscard]] std::int64_t notices_sent() const override { return mesh_->notices_sent(); }

 private:
  std::shared_ptr<ProcessMesh> mesh_;
};

}  // namespace
}  // namespace gloo_backend

std::unique_ptr<Communicator> make_gloo_world(const GlooOptions& options) {
  using namespace gloo_backend;
  auto shared = start_device(options, "gloo world");
  // Gloo numbers ranks with int; both were checked to fit.
  const int rank = static_cast<int>(options.rank);
  const int size = static_cast<int>(options.size);
  std::vector<int> global(static_cast<size_t>(size));
  std::iota(global.begin(), global.end(), 0);
  // One deadline for the whole creation: the size check, the connections and the barrier.
  const auto deadline = Clock::now() + options.timeout;
  check_world_size(*shared->store, options.prefix, rank, size, options.timeout, deadline);
  auto ctx = connect_group(*shared, options.prefix, rank, global, "create world", "world",
                           options.timeout, deadline);
  return std::make_unique<GlooCommunicator>("world", shared, std::move(ctx), std::move(global),
                                            options.prefix, options.timeout);
}

std::shared_ptr<GlooConnections> make_gloo_connections(const GlooOptions& options) {
  using namespace gloo_backend;
  auto shared = start_device(options, "gloo kept connections");
  const int process = static_cast<int>(options.rank);
  const int processes = static_cast<int>(options.size);
  const auto deadline = Clock::now() + options.timeout;
  check_world_size(*shared->store, options.prefix, process, processes, options.timeout, deadline);
  auto mesh = std::make_shared<ProcessMesh>(shared, process, processes, options.timeout);
  mesh->connect(options.prefix, mesh->others(), 0, deadline);
  return std::make_shared<KeptConnections>(std::move(mesh));
}

std::unique_ptr<Communicator> make_gloo_world_from_env(GlooOptions options) {
  gloo_backend::check_unset_placement(options, "gloo world from the launcher");
  const LaunchEnv env = read_launch_env();
  const LaunchInfo info = launch_info_of(env);
  if (info.timeout) options.timeout = *info.timeout;
  // The one Gloo-specific variable: which interface the pairs listen on.
  if (env.gloo_hostname) options.hostname = *env.gloo_hostname;
  options.store = open_launch_store(info, options.timeout);
  if (options.hostname.empty()) options.hostname = options.store->local_address();
  options.prefix = info.job_id + "/" + options.prefix;
  options.token = info.token;
  options.rank = info.rank;
  options.size = info.size;
  return make_gloo_world(options);
}

}  // namespace commgrid
