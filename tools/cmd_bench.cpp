// `commgrid bench layout|init|collectives`: the benchmarks of docs/benchmarks.md with the
// command's own timing loops (no Google Benchmark needed), printed as a table or JSON.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "bench_layout.hpp"
#include "command.hpp"
#include "commgrid/error.hpp"
#include "layout_flags.hpp"

namespace commgrid::cli {
namespace {

using Json = nlohmann::ordered_json;

struct BenchLayoutOptions {
  std::string worlds, query_worlds, repeats = "5", queries = "100000", memory = "warm",
      format = "table";
};

void check_format(const std::string& format) {
  if (format != "table" && format != "json")
    throw ConfigError("format", "format: unknown format \"" + format + "\" (valid: table, json)");
}

std::vector<std::int64_t> parse_worlds(const char* param, const std::string& text,
                                       std::span<const std::int64_t> defaults) {
  if (text.empty()) return {defaults.begin(), defaults.end()};
  if (text == "none") return {};
  std::vector<std::int64_t> worlds = parse_integer_list(param, text, 1);
  for (std::int64_t w : worlds) {
    try {
      (void)bench::bench_config(w);
    } catch (const ConfigError& e) {
      throw ConfigError(param, std::string(param) + ": world " + std::to_string(w) +
                                   " does not fit tp8 pp8 cp2 ep8 etp1 (" + e.what() + ")");
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

Json layout_json(const std::vector<bench::EnumerationResult>& en,
                 const std::vector<bench::QueryResult>& qs, int repeats,
                 const std::string& memory) {
  Json j;
  j["benchmark"] = "layout";
  j["memory"] = memory;
  j["config"] = {{"tp", 8}, {"pp", 8}, {"cp", 2}, {"ep", 8}, {"etp", 1}, {"dp", "W/128"}};
  j["repeats"] = repeats;
  j["timing"] = "process CPU time, fastest repetition; ratio = enumeration seconds / baseline seconds";
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
                  const std::vector<bench::QueryResult>& qs, int repeats,
                  const std::string& memory) {
  out << "layout benchmark: tp8 pp8 cp2 ep8 etp1, dp = W/128; CPU time, fastest of " << repeats
      << " repetitions; " << memory << " memory\n\n";
  if (!en.empty()) {
    out << "enumeration of every kind (lists held together) vs writing as many int64:\n";
    char line[256];
    std::snprintf(line, sizeof line, "%10s %5s %10s %11s %9s %9s %10s %10s %7s\n",
                  "world", "kinds", "groups", "members", "MiB", "rss_MiB", "enum_ms",
                  "write_ms", "ratio");
    out << line;
    for (const auto& e : en) {
      std::snprintf(line, sizeof line,
                    "%10lld %5zu %10lld %11lld %9s %9s %10.3f %10.3f %7.2f\n",
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
  if (o.memory == "cold")
    opts.memory = bench::MemoryMode::cold;
  else if (o.memory != "warm")
    throw ConfigError("memory", "memory: unknown mode \"" + o.memory + "\" (valid: warm, cold)");
  opts.worlds = parse_worlds("worlds", o.worlds, bench::kEnumerationWorlds);
  opts.query_worlds = parse_worlds("query_worlds", o.query_worlds, bench::kQueryWorlds);
  opts.repeats = static_cast<int>(parse_integer("repeats", o.repeats, 1, 1000));
  opts.queries = static_cast<std::size_t>(parse_integer("queries", o.queries, 1, 100000000));
  const auto en = bench::run_enumeration(opts);
  const auto qs = bench::run_queries(opts);
  if (o.format == "json")
    std::cout << layout_json(en, qs, opts.repeats, o.memory).dump(2) << "\n";
  else
    layout_table(std::cout, en, qs, opts.repeats, o.memory);
  std::cout.flush();
  if (!std::cout) throw Error("bench: writing the output failed");
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& root) {
  CLI::App* app = root.add_subcommand("bench", "measure the layout, group creation and collectives");
  app->require_subcommand(1);

  auto lo = std::make_shared<BenchLayoutOptions>();
  CLI::App* layout = app->add_subcommand(
      "layout", "enumerate every kind (vs writing as many integers) and time one-rank queries");
  layout->add_option("--worlds", lo->worlds,
                     "worlds to enumerate, e.g. 1024,16384 (default 2^10,2^14,2^17,2^20; "
                     "multiples of 128; \"none\" skips)");
  layout->add_option("--query-worlds", lo->query_worlds,
                     "worlds of the one-rank queries (default 2^10 ... 2^30; \"none\" skips)");
  layout->add_option("--repeats", lo->repeats, "timed repetitions; the fastest counts (5)");
  layout->add_option("--queries", lo->queries, "queries per kind and world (100000)");
  layout->add_option("--memory", lo->memory,
                     "warm (default: pages reused, measures the code) or cold (fresh pages "
                     "for lists and baselines alike)");
  layout->add_option("--format", lo->format, "table (default) or json");

  return {app, [app, layout, lo]() -> int {
            if (layout->parsed()) return run_bench_layout(*lo);
            throw ConfigError("bench", "bench: no benchmark given (layout, init, collectives)");
          }};
}

}  // namespace commgrid::cli
