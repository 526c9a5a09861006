// `commgrid bench layout|init|collectives`: the benchmarks of docs/benchmarks.md with the
// command's own timing loops (no Google Benchmark needed), printed as a table or JSON.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "bench/bench_layout.hpp"
#include "bench/bench_runtime.hpp"
#include "cli_errors.hpp"
#if COMMGRID_HAS_BOOTSTRAP
#include "bench/bench_store.hpp"
#endif
#include "command.hpp"
#include "commgrid/backends.hpp"
#include "commgrid/error.hpp"
#include "commgrid/process_groups.hpp"
#include "layout_flags.hpp"
#include "world_runner.hpp"
#if COMMGRID_HAS_MPI
#include "bench/bench_mpi.hpp"
#include "commgrid/mpi.hpp"
#endif
#if COMMGRID_HAS_GLOO
#include "bench/bench_gloo.hpp"
#else
namespace commgrid::bench {
class GlooDirectHub;
}
#endif
#if COMMGRID_HAS_NCCL
#include "bench/bench_nccl.hpp"
#include "commgrid/nccl.hpp"
#include "nccl_world.hpp"
#endif

namespace commgrid::cli {
namespace {

using Json = nlohmann::ordered_json;
using bench::DirectCollectives;

struct BenchLayoutOptions {
  std::string worlds, query_worlds, repeats = "5", queries = "100000", memory = "warm",
                                    format = "table", compat = "seed", gtp_remat = "1";
};

void check_format(const std::string& format) {
  if (format != "table" && format != "json")
    throw ConfigError("format", "format: unknown format \"" + format + "\" (valid: table, json)");
}

std::string bench_config_text(const bench::BenchEdition& e);

std::vector<std::int64_t> parse_worlds(const char* param, const std::string& text,
                                       std::span<const std::int64_t> defaults,
                                       const bench::BenchEdition& edition) {
  if (text.empty()) return {defaults.begin(), defaults.end()};
  if (text == "none") return {};
  std::vector<std::int64_t> worlds = parse_integer_list(param, text, 1);
  for (std::int64_t w : worlds) {
    try {
      (void)bench::bench_config(w, edition);
    } catch (const ConfigError& e) {
      throw ConfigError(param, std::string(param) + ": world " + std::to_string(w) +
                                   " does not fit " + bench_config_text(edition) + " (" + e.what() +
                                   ")");
    }
  }
  return worlds;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string mib(double bytes) { return fmt("%.1f", bytes / (1024.0 * 1024.0)); }

// "tp8 pp8 cp2 ep8 etp1, dp = W/128" (under head: ", compat head, gtp_remat 2, dp = W/256").
std::string bench_config_text(const bench::BenchEdition& e) {
  std::string s = "tp8 pp8 cp2 ep8 etp1";
  if (e.compat == Compat::head) s += " compat head gtp_remat" + std::to_string(e.gtp_remat);
  return s + ", dp = W/" + std::to_string(128 * e.gtp_remat);
}

Json layout_json(const std::vector<bench::EnumerationResult>& en,
                 const std::vector<bench::QueryResult>& qs, int repeats, const std::string& memory,
                 const bench::BenchEdition& edition) {
  Json j;
  j["benchmark"] = "layout";
  j["memory"] = memory;
  j["config"] = {{"tp", 8},
                 {"pp", 8},
                 {"cp", 2},
                 {"ep", 8},
                 {"etp", 1},
                 {"compat", compat_name(edition.compat)},
                 {"gtp_remat", edition.gtp_remat},
                 {"dp", "W/" + std::to_string(128 * edition.gtp_remat)}};
  j["repeats"] = repeats;
  j["timing"] =
      "process CPU time, fastest repetition; ratio = enumeration seconds / baseline seconds";
  Json ea = Json::array();
  for (const auto& e : en) {
    Json w;
    w["world_size"] = e.world_size;
    w["kinds"] = e.kinds.size();
    w["groups"] = e.groups;
    w["members"] = e.members;
    w["bytes"] = e.bytes;
    w["largest_list_bytes"] = e.largest_bytes;
    w["rss_growth_bytes"] = e.rss_growth;
    w["seconds"] = e.seconds;
    w["baseline_seconds"] = e.baseline_seconds;
    w["ratio"] = e.seconds / e.baseline_seconds;
    Json ka = Json::array();
    for (const auto& k : e.kinds)
      ka.push_back({{"kind", kind_name(k.kind)},
                    {"groups", k.groups},
                    {"members", k.members},
                    {"bytes", k.bytes},
                    {"seconds", k.seconds},
                    {"baseline_seconds", k.baseline_seconds},
                    {"ratio", k.seconds / k.baseline_seconds}});
    w["per_kind"] = std::move(ka);
    ea.push_back(std::move(w));
  }
  j["enumeration"] = std::move(ea);
  Json qa = Json::array();
  for (const auto& q : qs)
    qa.push_back({{"world_size", q.world_size},
                  {"kind", kind_name(q.kind)},
                  {"group_size", q.group_size},
                  {"ns_per_query", q.ns_per_query}});
  j["queries"] = std::move(qa);
  return j;
}

void layout_table(std::ostream& out, const std::vector<bench::EnumerationResult>& en,
                  const std::vector<bench::QueryResult>& qs, int repeats, const std::string& memory,
                  const bench::BenchEdition& edition) {
  out << "layout benchmark: " << bench_config_text(edition) << "; CPU time, fastest of " << repeats
      << " repetitions; " << memory << " memory\n\n";
  if (!en.empty()) {
    out << "enumeration of every kind (lists held together) vs writing as many int64:\n";
    char line[256];
    std::snprintf(line, sizeof line, "%10s %5s %10s %11s %9s %9s %10s %10s %7s\n", "world", "kinds",
                  "groups", "members", "MiB", "rss_MiB", "enum_ms", "write_ms", "ratio");
    out << line;
    for (const auto& e : en) {
      std::snprintf(line, sizeof line, "%10lld %5zu %10lld %11lld %9s %9s %10.3f %10.3f %7.2f\n",
                    static_cast<long long>(e.world_size), e.kinds.size(),
                    static_cast<long long>(e.groups), static_cast<long long>(e.members),
                    mib(static_cast<double>(e.bytes)).c_str(),
                    mib(static_cast<double>(e.rss_growth)).c_str(), e.seconds * 1e3,
                    e.baseline_seconds * 1e3, e.seconds / e.baseline_seconds);
      out << line;
    }
    const auto& big = en.back();
    out << "\nper kind at world " << big.world_size << ":\n";
    std::snprintf(line, sizeof line, "%-15s %9s %11s %9s %10s %10s %7s\n", "kind", "groups",
                  "members", "MiB", "enum_ms", "write_ms", "ratio");
    out << line;
    for (const auto& k : big.kinds) {
      std::snprintf(line, sizeof line, "%-15s %9lld %11lld %9s %10.3f %10.3f %7.2f\n",
                    std::string(kind_name(k.kind)).c_str(), static_cast<long long>(k.groups),
                    static_cast<long long>(k.members), mib(static_cast<double>(k.bytes)).c_str(),
                    k.seconds * 1e3, k.baseline_seconds * 1e3, k.seconds / k.baseline_seconds);
      out << line;
    }
  }
  if (!qs.empty()) {
    out << "\none rank's group (Layout::group_of), ns per query:\n";
    char b[32];
    std::snprintf(b, sizeof b, "%10s", "world");
    out << b;
    for (GroupKind k : bench::kQueryKinds) {
      std::snprintf(b, sizeof b, "%9s", std::string(kind_name(k)).c_str());
      out << b;
    }
    out << "\n";
    for (std::size_t i = 0; i < qs.size(); i += bench::kQueryKinds.size()) {
      std::snprintf(b, sizeof b, "%10lld", static_cast<long long>(qs[i].world_size));
      out << b;
      for (std::size_t j = i; j < i + bench::kQueryKinds.size() && j < qs.size(); ++j)
        out << fmt("%9.0f", qs[j].ns_per_query);
      out << "\n";
    }
  }
}

int run_bench_layout(const BenchLayoutOptions& o) {
  check_format(o.format);
  bench::LayoutBenchOptions opts;
  if (o.memory == "cold") opts.memory = bench::MemoryMode::cold;
  else if (o.memory != "warm")
    throw ConfigError("memory", "memory: unknown mode \"" + o.memory + "\" (valid: warm, cold)");
  if (o.compat == "head") opts.edition.compat = Compat::head;
  else if (o.compat != "seed")
    throw ConfigError("compat", "compat: expected seed or head, got \"" + o.compat + "\"");
  opts.edition.gtp_remat = parse_integer("gtp_remat", o.gtp_remat, 1, 1024);
  if (opts.edition.gtp_remat != 1 && opts.edition.compat != Compat::head)
    throw ConfigError("gtp_remat", "gtp_remat = " + std::to_string(opts.edition.gtp_remat) +
                                       " requires compat head");
  opts.worlds = parse_worlds("worlds", o.worlds, bench::kEnumerationWorlds, opts.edition);
  opts.query_worlds =
      parse_worlds("query_worlds", o.query_worlds, bench::kQueryWorlds, opts.edition);
  opts.repeats = static_cast<int>(parse_integer("repeats", o.repeats, 1, 1000));
  opts.queries = static_cast<std::size_t>(parse_integer("queries", o.queries, 1, 100000000));
  const auto en = bench::run_enumeration(opts);
  const auto qs = bench::run_queries(opts);
  if (o.format == "json")
    std::cout << layout_json(en, qs, opts.repeats, o.memory, opts.edition).dump(2) << "\n";
  else layout_table(std::cout, en, qs, opts.repeats, o.memory, opts.edition);
  std::cout.flush();
  if (!std::cout) throw Error("bench: writing the output failed");
  return 0;
}

// ---- init and collectives: real ranks ----------------------------------------------

/// Flags shared by `bench init` and `bench collectives`.
struct RuntimeFlags {
  std::string backend, local, timeout = "600", format = "table", direct = "blocking";
};

struct BenchInitFlags {
  RuntimeFlags rt;
  LayoutFlags layout;
  std::string strategies = "split,member,per-group", repeats = "5";
};

struct BenchCollectivesFlags {
  RuntimeFlags rt;
  std::string sizes = "1KiB,64MiB", iterations = "1000";
};

/// What a runtime benchmark does once its world exists; returns the text rank 0 prints.
using BenchJob = std::function<std::string(Communicator& world, DirectCollectives* direct)>;

/// The backend called directly, beside commgrid, on the world the runner started: MPI on the
/// world's own communicator, Gloo on a plain context of the same rank-threads, NCCL on the
/// device world's communicator and stream.
std::unique_ptr<DirectCollectives> make_direct(Communicator& world, const WorldPlan& plan,
                                               const RuntimeFlags& rt, bench::GlooDirectHub* hub,
                                               std::chrono::milliseconds timeout) {
#if COMMGRID_HAS_NCCL
  if (plan.backend == "nccl")
    return bench::make_nccl_direct(dynamic_cast<NcclCommunicator&>(world), timeout);
#endif
#if COMMGRID_HAS_MPI
  if (plan.backend == "mpi")
    return bench::make_mpi_direct(dynamic_cast<MpiCommunicator&>(world),
                                  rt.direct == "nonblocking");
#endif
#if COMMGRID_HAS_GLOO
  if (plan.backend == "gloo" && hub != nullptr)
    return bench::make_gloo_direct(*hub, world.rank(), world.size(), timeout);
#endif
  (void)world;
  (void)rt;
  (void)hub;
  (void)timeout;
  return nullptr;
}

/// Runs `job` on the world of the runtime flags (--local N rank-threads, a launched job,
/// or mpirun's ranks); rank 0 prints what it returns. `prepare` checks the input once the
/// world size is known, on every rank alike; `needs_direct`: the job compares with the
/// backend called directly.
int run_bench_world(const RuntimeFlags& rt, const std::function<void(int world_size)>& prepare,
                    const BenchJob& job, bool needs_direct) {
  check_format(rt.format);
  if (rt.direct != "blocking" && rt.direct != "nonblocking")
    throw ConfigError(
        "direct", "direct: unknown reference \"" + rt.direct + "\" (valid: blocking, nonblocking)");
  RunnerOptions runner;
  runner.backend = rt.backend;
  runner.local = rt.local;
  runner.timeout = std::chrono::seconds(parse_integer("timeout", rt.timeout, 1, 7 * 24 * 3600));
#if COMMGRID_HAS_NCCL
  runner.device_world = nccl_device_world(runner.timeout);
#endif
#if COMMGRID_HAS_GLOO
  const std::shared_ptr<bench::GlooDirectHub> hub = bench::make_gloo_direct_hub();
#else
  const std::shared_ptr<bench::GlooDirectHub> hub;
#endif
  cli::WorldJob world_job;
  world_job.prepare = [&](const WorldPlan& plan) {
    if (needs_direct && plan.backend == "gloo" && plan.engine != WorldEngine::rank_threads)
      throw ConfigError("local",
                        "local: bench's direct Gloo reference runs on rank-threads; use "
                        "--backend gloo --local N");
    prepare(plan.size);
  };
  world_job.run = [&](Communicator& world, const WorldPlan& plan) {
    const std::unique_ptr<DirectCollectives> direct =
        needs_direct ? make_direct(world, plan, rt, hub.get(), runner.timeout) : nullptr;
    const std::string text = job(world, direct.get());
    if (world.rank() == 0) std::cout << text << std::flush;
    return 0;
  };
  return run_world(runner, world_job);
}

std::vector<CreationStrategy> parse_strategies(const std::string& text) {
  std::vector<CreationStrategy> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    const CreationStrategy s = parse_strategy(std::string_view(text).substr(
        start, comma == std::string::npos ? std::string::npos : comma - start));
    if (std::find(out.begin(), out.end(), s) != out.end())
      throw InvalidValueError(
          "strategies", "strategies: \"" + std::string(strategy_name(s)) + "\" is given twice");
    out.push_back(s);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int run_bench_init(const BenchInitFlags& f) {
  const std::vector<CreationStrategy> strategies = parse_strategies(f.strategies);
  const int repeats = static_cast<int>(parse_integer("repeats", f.repeats, 1, 1000));
  auto config = std::make_shared<ParallelConfig>();
  return run_bench_world(
      f.rt, [&](int world_size) { *config = to_config(f.layout, world_size); },
      [&](Communicator& world, DirectCollectives*) {
        const bench::InitResult r = bench::run_init_bench(world, *config, strategies, repeats);
        return f.rt.format == "json" ? bench::init_json(r, *config).dump(2) + "\n"
                                     : bench::init_table(r, *config);
      },
      /*needs_direct=*/false);
}

int run_bench_collectives(const BenchCollectivesFlags& f) {
  const std::vector<std::size_t> sizes = bench::parse_sizes("sizes", f.sizes);
  const int iterations = static_cast<int>(parse_integer("iterations", f.iterations, 1, 10000000));
  return run_bench_world(
      f.rt, [](int) {},
      [&](Communicator& world, DirectCollectives* direct) {
        const bench::CollectivesResult r =
            bench::run_collectives_bench(world, *direct, sizes, iterations);
        return f.rt.format == "json" ? bench::collectives_json(r).dump(2) + "\n"
                                     : bench::collectives_table(r);
      },
      /*needs_direct=*/true);
}

void add_runtime_flags(CLI::App& app, RuntimeFlags& rt) {
  app.add_option("--backend", rt.backend,
                 "mpi (under mpirun), gloo (--local N, or under commgrid launch) or nccl "
                 "(one GPU per rank); default: gloo with --local or under commgrid launch or "
                 "torchrun, else mpi");
  app.add_option("--local", rt.local,
                 "N ranks as threads in this process (Gloo, or NCCL over a Gloo bootstrap)")
      ->type_name("INT");
  app.add_option("--timeout", rt.timeout, "seconds any rank waits for the others (600)")
      ->type_name("SECONDS");
  app.add_option("--format", rt.format, "table (default) or json");
}

}  // namespace

Command add_bench_command(CLI::App& root) {
  CLI::App* app =
      root.add_subcommand("bench", "measure the layout, group creation and collectives");
  app->require_subcommand(1);

  auto lo = std::make_shared<BenchLayoutOptions>();
  CLI::App* layout = app->add_subcommand(
      "layout", "enumerate every kind (vs writing as many integers) and time one-rank queries");
  layout->add_option("--worlds", lo->worlds,
                     "worlds to enumerate, e.g. 1024,16384 (default 2^10,2^14,2^17,2^20; "
                     "multiples of 128; \"none\" skips)");
  layout->add_option("--query-worlds", lo->query_worlds,
                     "worlds of the one-rank queries (default 2^10 ... 2^30; \"none\" skips)");
  layout->add_option("--repeats", lo->repeats, "timed repetitions; the fastest counts (5)")
      ->type_name("INT");
  layout->add_option("--queries", lo->queries, "queries per kind and world (100000)")
      ->type_name("INT");
  layout->add_option("--memory", lo->memory,
                     "warm (default: pages reused, measures the code) or cold (fresh pages "
                     "for lists and baselines alike)");
  layout->add_option("--format", lo->format, "table (default) or json");
  layout->add_option("--compat", lo->compat, "seed (default) or head: the edition laid out");
  layout->add_option("--gtp-remat", lo->gtp_remat, "HEAD's gtp_remat size (1; head only)")
      ->type_name("INT");

  auto fi = std::make_shared<BenchInitFlags>();
  CLI::App* init = app->add_subcommand(
      "init", "time ProcessGroups::initialize with each creation strategy on real ranks");
  add_layout_flags(*init, fi->layout, /*with_world_size=*/true);
  init->add_option("--strategies", fi->strategies, "split,member,per-group (default: all three)");
  init->add_option("--repeats", fi->repeats, "repetitions; the fastest counts (5)")
      ->type_name("INT");
  add_runtime_flags(*init, fi->rt);
  init->footer(
      "Example: mpirun --oversubscribe -np 16 commgrid bench init --tp 2 --pp 2\n"
      "         commgrid bench init --backend gloo --local 16 --tp 2 --pp 2\n"
      "         commgrid bench init --backend nccl --local 8 --tp 2 --pp 2 (8 GPUs)");

  auto fc = std::make_shared<BenchCollectivesFlags>();
  CLI::App* coll = app->add_subcommand(
      "collectives",
      "allreduce, allgather, pingpong, batched exchange and alltoallv through commgrid vs the backend called directly");
  coll->add_option("--sizes", fc->sizes, "bytes per rank, e.g. 1KiB,64MiB (default)");
  coll->add_option("--iterations", fc->iterations,
                   "calls of each kind per size (1000; fewer for large sizes, at least 5)")
      ->type_name("INT");
  add_runtime_flags(*coll, fc->rt);
  coll->add_option("--direct", fc->rt.direct,
                   "MPI reference: blocking (MPI_Allreduce, default) or nonblocking "
                   "(MPI_Iallreduce + MPI_Wait, the algorithm commgrid's MPI backend uses)");
  coll->footer(
      "Example: mpirun --oversubscribe -np 4 commgrid bench collectives\n"
      "         commgrid bench collectives --backend nccl --local 2 (2 GPUs; device "
      "buffers, raw NCCL as the reference)");

#if COMMGRID_HAS_BOOTSTRAP
  const Command store = add_bench_store_command(*app);  // bench_store.cpp
#else
  const Command store;
#endif
  return {app, [layout, lo, init, fi, coll, fc, store]() -> int {
            if (store.app != nullptr && store.app->parsed()) return store.run();
            if (layout->parsed()) return run_bench_layout(*lo);
            if (init->parsed()) return run_bench_init(*fi);
            if (coll->parsed()) return run_bench_collectives(*fc);
            throw ConfigError("bench", "bench: no benchmark given (layout, init, collectives)");
          }};
}

}  // namespace commgrid::cli
