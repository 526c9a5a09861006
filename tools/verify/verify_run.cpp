#include "verify/verify_run.hpp"
#include "cli_errors.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <numeric>

namespace commgrid::cli {
namespace {

std::string list_text(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

constexpr int kTokenTag = 7;

// The checks of one group on this rank; returns the first failure, empty when all passed.
// Every member runs the same sequence of collectives whatever it finds, so that a wrong
// value on one rank never leaves the others waiting.
std::string check_group(const ProcessGroups& pg, GroupKind k, int level, bool lie) {
  Communicator& comm = pg.group(k, level);
  const std::vector<Rank>& members = pg.global_ranks(k, level);
  std::vector<Rank> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  const std::int64_t me = pg.world_rank();
  const std::string where =
      "group " + comm.name() + " " + list_text(members) + " on rank " + std::to_string(me) + ": ";
  std::string failure;
  auto fail = [&](const std::string& what) {
    if (failure.empty()) failure = where + what;
  };

  if (comm.size() != static_cast<int>(members.size()) || comm.rank() != pg.rank(k, level))
    fail("communicator is rank " + std::to_string(comm.rank()) + " of " +
         std::to_string(comm.size()) + ", the layout says rank " +
         std::to_string(pg.rank(k, level)) + " of " + std::to_string(members.size()));

  // Membership: the communicator's ranks, in rank order, are the members sorted.
  std::vector<std::int64_t> got(static_cast<std::size_t>(comm.size()), -1);
  const std::int64_t reported = lie ? me + pg.world_size() : me;
  comm.allgather(&reported, got.data(), 1, DataType::int64)->wait();
  if (got != sorted)
    fail("allgather of global ranks gave " + list_text(got) + ", expected " + list_text(sorted));

  // A reduction with a known result.
  std::int64_t sum = me + 1;
  comm.allreduce(&sum, &sum, 1, DataType::int64, ReduceOp::sum)->wait();
  const std::int64_t expected = std::accumulate(sorted.begin(), sorted.end(), std::int64_t{0}) +
                                static_cast<std::int64_t>(sorted.size());
  if (sum != expected)
    fail("allreduce(sum of rank+1) gave " + std::to_string(sum) + ", expected " +
         std::to_string(expected));

  // Pipeline ring: a token goes from each stage to the next and back to stage 0, each
  // stage adding its global rank. This proves send/recv and the next/prev getters.
  if (k == GroupKind::pp && comm.size() > 1) {
    const int n = comm.size(), r = comm.rank();
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (pg.pipeline_next_rank() != sorted[static_cast<std::size_t>(next)] ||
        pg.pipeline_prev_rank() != sorted[static_cast<std::size_t>(prev)])
      fail("pipeline next/prev ranks " + std::to_string(pg.pipeline_next_rank()) + "/" +
           std::to_string(pg.pipeline_prev_rank()) + " disagree with the ring");
    std::int64_t token = 0;
    if (r == 0) {
      token = me;
      comm.send(&token, 1, DataType::int64, next, kTokenTag)->wait();
      comm.recv(&token, 1, DataType::int64, prev, kTokenTag)->wait();
      const std::int64_t want = std::accumulate(sorted.begin(), sorted.end(), std::int64_t{0});
      if (token != want)
        fail("the token around the pipeline ring came back as " + std::to_string(token) +
             ", expected " + std::to_string(want));
    } else {
      comm.recv(&token, 1, DataType::int64, prev, kTokenTag)->wait();
      token += me;
      comm.send(&token, 1, DataType::int64, next, kTokenTag)->wait();
    }
  }
  return failure;
}

}  // namespace

bool VerifyReport::passed() const {
  return std::all_of(kinds.begin(), kinds.end(), [](const KindVerdict& v) { return v.passed; });
}

std::int64_t VerifyReport::total_groups() const {
  std::int64_t n = 0;
  for (const KindVerdict& v : kinds) n += v.groups;
  return n;
}

VerifyReport run_verify(Communicator& world, const ParallelConfig& config,
                        const VerifyOptions& options) {
  ProcessGroups pg;
  InitOptions init;
  init.kinds = options.kinds;
  init.strategy = options.strategy;
  init.share_identical_groups = options.share_identical_groups;
  init.timeout = options.timeout;
  pg.initialize(world, config, init);

  VerifyReport report;
  report.world_size = world.size();
  report.strategy = options.strategy;
  const auto& stats = pg.creation_stats();
  std::vector<std::string> failures;
  for (const KindCreation& st : stats) {
    KindVerdict v;
    v.kind = st.kind;
    v.level = st.level;
    v.label = st.label;
    v.alias = st.alias;
    v.groups = pg.layout().num_groups(st.kind, st.level);
    const bool lie = pg.world_rank() == options.fault_rank;
    failures.push_back(pg.has_group(st.kind, st.level) ? check_group(pg, st.kind, st.level, lie)
                                                       : "");
    report.kinds.push_back(std::move(v));
  }

  // Every rank's verdicts in one max-allreduce: per kind a failure flag, the creation
  // time and calls, and the group sizes (min as a negated max).
  constexpr std::size_t kPer = 5;
  const std::size_t R = report.kinds.size();
  std::vector<std::int64_t> buf(kPer * R + 2, 0);
  for (std::size_t i = 0; i < R; ++i) {
    const KindVerdict& v = report.kinds[i];
    const bool member = pg.has_group(v.kind, v.level);
    const std::int64_t size = member ? pg.size(v.kind, v.level) : 0;
    buf[kPer * i + 0] = failures[i].empty() ? 0 : 1;
    buf[kPer * i + 1] = stats[i].time.count();
    buf[kPer * i + 2] = stats[i].creation_calls;
    buf[kPer * i + 3] = member ? -size : INT64_MIN;
    buf[kPer * i + 4] = size;
  }
  buf[kPer * R] = pg.fingerprint_time().count();
  buf[kPer * R + 1] = pg.creation_time().count();
  world.allreduce(buf.data(), buf.data(), buf.size(), DataType::int64, ReduceOp::max)->wait();
  bool any_failed = false;
  for (std::size_t i = 0; i < R; ++i) {
    KindVerdict& v = report.kinds[i];
    v.passed = buf[kPer * i + 0] == 0;
    any_failed = any_failed || !v.passed;
    v.creation_seconds = static_cast<double>(buf[kPer * i + 1]) * 1e-9;
    v.creation_calls = buf[kPer * i + 2];
    v.min_size = -buf[kPer * i + 3];
    v.max_size = buf[kPer * i + 4];
  }
  report.fingerprint_seconds = static_cast<double>(buf[kPer * R]) * 1e-9;
  report.creation_seconds = static_cast<double>(buf[kPer * R + 1]) * 1e-9;
  if (!any_failed) return report;

  // Some check failed somewhere: gather every rank's failure texts (padded to the longest)
  // so that every rank can name the first failing rank of each kind.
  std::string mine;
  for (const std::string& f : failures) mine += f + '\x1f';
  std::int64_t len = static_cast<std::int64_t>(mine.size());
  world.allreduce(&len, &len, 1, DataType::int64, ReduceOp::max)->wait();
  const std::size_t words = (static_cast<std::size_t>(len) + 7) / 8;
  std::vector<std::int64_t> send(words, 0), all(words * static_cast<std::size_t>(world.size()), 0);
  std::memcpy(send.data(), mine.data(), mine.size());
  world.allgather(send.data(), all.data(), words, DataType::int64)->wait();
  for (int r = world.size() - 1; r >= 0; --r) {  // backwards: rank 0's text wins
    const char* p = reinterpret_cast<const char*>(all.data() + static_cast<std::size_t>(r) * words);
    std::string_view text(p, strnlen(p, words * 8));
    std::size_t start = 0;
    for (std::size_t i = 0; i < R && start <= text.size(); ++i) {
      const std::size_t end = std::min(text.find('\x1f', start), text.size());
      if (end > start) report.kinds[i].failure = std::string(text.substr(start, end - start));
      start = end + 1;
    }
  }
  return report;
}

ParallelConfig checked_verify_config(const LayoutFlags& layout, const VerifyOptions& options,
                                     int world_size) {
  ParallelConfig config = to_config(layout, world_size);
  const Layout l(config);
  for (GroupKind k : options.kinds)
    if (!l.has_kind(k)) (void)l.num_groups(k);  // throws, saying why the kind is absent
  return config;
}

int print_verify_report(const VerifyReport& report) {
  std::cout << format_verify_report(report) << std::flush;
  for (const KindVerdict& v : report.kinds)
    if (!v.passed) print_error("verify failed: " + v.label + ": " + v.failure);
  return report.passed() ? 0 : 1;
}

std::string format_verify_report(const VerifyReport& report) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-15s %8s %7s %-16s %12s %7s\n", "kind", "groups", "size",
                "status", "create_ms", "calls");
  out += line;
  for (const KindVerdict& v : report.kinds) {
    const std::string size = v.min_size == v.max_size
                                 ? std::to_string(v.max_size)
                                 : std::to_string(v.min_size) + "-" + std::to_string(v.max_size);
    const std::string status = !v.passed ? "FAILED" : v.alias ? "ok (alias)" : "ok";
    std::snprintf(line, sizeof line, "%-15s %8lld %7s %-16s %12.3f %7lld\n", v.label.c_str(),
                  static_cast<long long>(v.groups), size.c_str(), status.c_str(),
                  v.creation_seconds * 1e3, static_cast<long long>(v.creation_calls));
    out += line;
  }
  std::snprintf(line, sizeof line,
                "strategy %s: fingerprint %.3f ms, creation %.3f ms (slowest rank)\n",
                std::string(strategy_name(report.strategy)).c_str(),
                report.fingerprint_seconds * 1e3, report.creation_seconds * 1e3);
  out += line;
  // K counts kinds, not rows: hcp's levels are one kind.
  std::vector<GroupKind> distinct;
  for (const KindVerdict& v : report.kinds)
    if (std::find(distinct.begin(), distinct.end(), v.kind) == distinct.end())
      distinct.push_back(v.kind);
  const auto kinds = distinct.size();
  const std::string ranks =
      std::to_string(report.world_size) + (report.world_size == 1 ? " rank" : " ranks");
  if (report.passed()) {
    out += "verified " + std::to_string(kinds) + (kinds == 1 ? " kind, " : " kinds, ") +
           std::to_string(report.total_groups()) + " groups on " + ranks + "\n";
  } else {
    std::size_t failed = 0;
    for (const KindVerdict& v : report.kinds) failed += v.passed ? 0 : 1;
    out += "FAILED: " + std::to_string(failed) + " of " + std::to_string(report.kinds.size()) +
           " rows on " + ranks + "\n";
  }
  return out;
}

}  // namespace commgrid::cli
