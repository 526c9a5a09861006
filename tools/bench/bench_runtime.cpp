#include "bench/bench_runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include "commgrid/error.hpp"
#include "commgrid/layout.hpp"
#include "layout_flags.hpp"

namespace commgrid::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

void barrier(Communicator& c) { c.barrier()->wait(); }

double max_over(Communicator& c, double v) {
  double out = 0;
  c.allreduce(&v, &out, 1, DataType::float64, ReduceOp::max)->wait();
  return out;
}

std::int64_t reduce_int(Communicator& c, std::int64_t v, ReduceOp op) {
  std::int64_t out = 0;
  c.allreduce(&v, &out, 1, DataType::int64, op)->wait();
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

std::string printf_string(const char* format, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

std::string size_text(std::size_t bytes) {
  if (bytes % (1u << 30) == 0) return std::to_string(bytes >> 30) + " GiB";
  if (bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

const StrategyResult* find_strategy(const InitResult& r, CreationStrategy s) {
  for (const auto& x : r.strategies)
    if (x.strategy == s) return &x;
  return nullptr;
}

}  // namespace

InitResult run_init_bench(Communicator& world, const ParallelConfig& config,
                          const std::vector<CreationStrategy>& strategies, int repeats) {
  InitResult res;
  res.backend = std::string(world.backend());
  res.world_size = world.size();
  res.repeats = std::max(1, repeats);
  {
    const Layout layout(config);
    for (GroupKind k : layout.kinds()) {
      res.kinds += layout.levels(k);
      for (int level = 0; level < layout.levels(k); ++level)
        res.groups += layout.num_groups(k, level);
    }
  }
  res.strategies.resize(strategies.size());
  for (std::size_t i = 0; i < strategies.size(); ++i) {
    res.strategies[i].strategy = strategies[i];
    res.strategies[i].seconds = std::numeric_limits<double>::infinity();
  }
  for (int rep = 0; rep < res.repeats; ++rep) {
    for (StrategyResult& s : res.strategies) {
      InitOptions options;
      options.strategy = s.strategy;
      ProcessGroups pg;
      barrier(world);
      const auto t0 = Clock::now();
      pg.initialize(world, config, options);
      const double local = seconds(Clock::now() - t0);
      double creation = 0;
      std::int64_t calls = 0;
      for (const KindCreation& k : pg.creation_stats()) {
        creation += seconds(k.time);
        calls += k.creation_calls;
      }
      pg.destroy();
      // The job waits for its slowest rank, so that rank's time is the cost.
      const double slowest = max_over(world, local);
      const double slowest_creation = max_over(world, creation);
      const std::int64_t calls_max = reduce_int(world, calls, ReduceOp::max);
      const std::int64_t calls_sum = reduce_int(world, calls, ReduceOp::sum);
      if (slowest < s.seconds) {
        s.seconds = slowest;
        s.creation_seconds = slowest_creation;
      }
      s.creation_calls_max = calls_max;
      s.creation_calls_mean = static_cast<double>(calls_sum) / world.size();
    }
  }
  return res;
}

std::shared_ptr<float> DirectCollectives::buffer(std::size_t count, float value) {
  std::shared_ptr<float> b(new float[count], std::default_delete<float[]>());
  std::fill_n(b.get(), count, value);
  return b;
}

CollectivesResult run_collectives_bench(Communicator& world, DirectCollectives& direct,
                                        const std::vector<std::size_t>& sizes, int iterations) {
  CollectivesResult res;
  res.backend = std::string(world.backend());
  res.direct = direct.description();
  res.world_size = world.size();
  const auto n_ranks = static_cast<std::size_t>(world.size());
  for (std::size_t bytes : sizes) {
    const std::size_t count = bytes / sizeof(float);
    const std::shared_ptr<float> send_buffer = direct.buffer(count * n_ranks, 1.0f);
    const std::shared_ptr<float> recv_buffer = direct.buffer(count * n_ranks, 0.0f);
    float* const send = send_buffer.get();
    float* const recv = recv_buffer.get();
    // Large sizes take long per call; 1 GiB per rank and kind keeps a run to seconds.
    constexpr std::size_t kBudget = std::size_t{1} << 30;
    const int iters = static_cast<int>(std::clamp<std::size_t>(
        kBudget / bytes, 5, static_cast<std::size_t>(std::max(5, iterations))));
    const int me = world.rank(), partner = world.rank() ^ 1;
    const bool paired = partner < world.size();
    const std::vector<std::size_t> counts(n_ranks, count);
    for (const std::string op : {"allreduce", "allgather", "pingpong", "exchange", "alltoallv"}) {
      auto via_commgrid = [&] {
        if (op == "allreduce") {
          world.allreduce(send, recv, count, DataType::float32, ReduceOp::sum)->wait();
        } else if (op == "allgather") {
          world.allgather(send, recv, count, DataType::float32)->wait();
        } else if (op == "pingpong") {
          if (!paired) return;
          const std::span<float> buf(recv, count);
          if (me < partner) {
            world.send(buf, partner, 0)->wait();
            world.recv(buf, partner, 0)->wait();
          } else {
            world.recv(buf, partner, 0)->wait();
            world.send(buf, partner, 0)->wait();
          }
        } else if (op == "exchange") {
          if (!paired) return;
          const P2POp ops[] = {P2POp::send(std::span<float>(send, count), partner, 0),
                               P2POp::recv(std::span<float>(recv, count), partner, 0)};
          world.batch_isend_irecv(ops)->wait();
        } else {
          world
              .alltoallv(std::span<const float>(send, count * n_ranks), counts,
                         std::span<float>(recv, count * n_ranks), counts)
              ->wait();
        }
      };
      auto via_direct = [&] {
        if (op == "allreduce") direct.allreduce(send, recv, count);
        else if (op == "allgather") direct.allgather(send, recv, count);
        else if (op == "pingpong" && paired) direct.pingpong(recv, count, partner, me < partner);
        else if (op == "exchange" && paired) direct.exchange(send, recv, count, partner);
        else if (op == "alltoallv") direct.alltoallv(send, counts, recv, counts);
      };
      // One untimed call each: connections, buffers and caches are set up before timing.
      via_commgrid();
      via_direct();
      std::vector<double> t_commgrid, t_direct;
      t_commgrid.reserve(static_cast<std::size_t>(iters));
      t_direct.reserve(static_cast<std::size_t>(iters));
      for (int i = 0; i < iters; ++i) {
        // Alternating, and swapping which goes first, so that neither always follows the
        // other's cache state.
        for (int j = 0; j < 2; ++j) {
          const bool commgrid_turn = (j == 0) == (i % 2 == 0);
          barrier(world);
          const auto t0 = Clock::now();
          if (commgrid_turn) via_commgrid();
          else via_direct();
          (commgrid_turn ? t_commgrid : t_direct).push_back(seconds(Clock::now() - t0));
        }
      }
      CollectiveResult r;
      r.op = op;
      r.bytes = bytes;
      r.iterations = iters;
      r.commgrid_seconds = max_over(world, median(t_commgrid));
      r.direct_seconds = max_over(world, median(t_direct));
      res.results.push_back(r);
    }
  }
  return res;
}

Json init_json(const InitResult& r, const ParallelConfig& c) {
  Json j;
  j["benchmark"] = "init";
  j["backend"] = r.backend;
  j["world_size"] = r.world_size;
  j["config"] = c.canonical();
  j["kinds"] = r.kinds;
  j["groups"] = r.groups;
  j["repeats"] = r.repeats;
  j["timing"] = "wall time of ProcessGroups::initialize on the slowest rank, fastest repetition";
  j["default_strategy"] = std::string(strategy_name(kDefaultStrategy));
  Json secs = Json::object();
  Json detail = Json::array();
  for (const auto& s : r.strategies) {
    secs[std::string(strategy_name(s.strategy))] = s.seconds;
    detail.push_back({{"strategy", std::string(strategy_name(s.strategy))},
                      {"seconds", s.seconds},
                      {"creation_seconds", s.creation_seconds},
                      {"creation_calls_per_rank_max", s.creation_calls_max},
                      {"creation_calls_per_rank_mean", s.creation_calls_mean}});
  }
  j["seconds"] = std::move(secs);
  j["strategies"] = std::move(detail);
  const StrategyResult* def = find_strategy(r, kDefaultStrategy);
  const StrategyResult* per = find_strategy(r, CreationStrategy::per_group);
  j["ratio"] = def && per ? Json(per->seconds / def->seconds) : Json(nullptr);
  return j;
}

std::string init_table(const InitResult& r, const ParallelConfig& c) {
  std::string out = "init benchmark: " + r.backend + ", " + std::to_string(r.world_size) +
                    " ranks, " + c.canonical() + "\n" + std::to_string(r.kinds) + " kinds, " +
                    std::to_string(r.groups) +
                    " groups; wall time of initialize on the "
                    "slowest rank, fastest of " +
                    std::to_string(r.repeats) + " repetitions\n";
  out += printf_string("%-10s %12s %14s %12s %12s\n", "strategy", "init_ms", "creation_ms",
                       "calls/rank", "calls_max");
  for (const auto& s : r.strategies)
    out += printf_string("%-10s %12.3f %14.3f %12.1f %12lld\n",
                         std::string(strategy_name(s.strategy)).c_str(), s.seconds * 1e3,
                         s.creation_seconds * 1e3, s.creation_calls_mean,
                         static_cast<long long>(s.creation_calls_max));
  const StrategyResult* def = find_strategy(r, kDefaultStrategy);
  const StrategyResult* per = find_strategy(r, CreationStrategy::per_group);
  if (def && per)
    out += printf_string("ratio per-group / %s (default): %.2f\n",
                         std::string(strategy_name(kDefaultStrategy)).c_str(),
                         per->seconds / def->seconds);
  return out;
}

Json collectives_json(const CollectivesResult& r) {
  Json j;
  j["benchmark"] = "collectives";
  j["backend"] = r.backend;
  j["direct"] = r.direct;
  j["world_size"] = r.world_size;
  j["timing"] = "median wall time per call on the slowest rank; calls interleaved";
  Json a = Json::array();
  for (const auto& x : r.results)
    a.push_back({{"op", x.op},
                 {"bytes", x.bytes},
                 {"iterations", x.iterations},
                 {"commgrid_seconds", x.commgrid_seconds},
                 {"direct_seconds", x.direct_seconds},
                 {"overhead_seconds", x.commgrid_seconds - x.direct_seconds},
                 {"ratio", x.commgrid_seconds / x.direct_seconds}});
  j["results"] = std::move(a);
  return j;
}

std::string collectives_table(const CollectivesResult& r) {
  std::string out = "collectives benchmark: " + r.backend + ", " + std::to_string(r.world_size) +
                    " ranks; commgrid vs " + r.direct +
                    "; float32; median per call on the "
                    "slowest rank\n";
  out += printf_string("%-10s %9s %6s %14s %14s %13s %7s\n", "op", "size", "iters", "commgrid_us",
                       "direct_us", "overhead_us", "ratio");
  for (const auto& x : r.results)
    out += printf_string("%-10s %9s %6d %14.2f %14.2f %13.2f %7.3f\n", x.op.c_str(),
                         size_text(x.bytes).c_str(), x.iterations, x.commgrid_seconds * 1e6,
                         x.direct_seconds * 1e6, (x.commgrid_seconds - x.direct_seconds) * 1e6,
                         x.commgrid_seconds / x.direct_seconds);
  return out;
}

std::vector<std::size_t> parse_sizes(const std::string& param, const std::string& text) {
  std::vector<std::size_t> out;
  std::size_t start = 0;
  for (int i = 0;; ++i) {
    const std::size_t comma = text.find(',', start);
    std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::string name = param + "[" + std::to_string(i) + "]";
    std::int64_t unit = 1;
    for (const auto& [suffix, mult] : {std::pair<const char*, std::int64_t>{"GiB", 1 << 30},
                                       {"MiB", 1 << 20},
                                       {"KiB", 1 << 10},
                                       {"B", 1}}) {
      const std::string s = suffix;
      if (item.size() > s.size() && item.compare(item.size() - s.size(), s.size(), s) == 0) {
        item.resize(item.size() - s.size());
        unit = mult;
        break;
      }
    }
    const std::int64_t max = (std::int64_t{4} << 30) / unit;  // 4 GiB per rank at most
    const std::int64_t bytes = cli::parse_integer(name, item, 1, max) * unit;
    if (bytes % 4 != 0)
      throw InvalidValueError(param, name + ": " + std::to_string(bytes) +
                                         " bytes is not a whole number of float32 values");
    out.push_back(static_cast<std::size_t>(bytes));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace commgrid::bench
