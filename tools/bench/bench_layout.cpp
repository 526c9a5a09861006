#include "bench/bench_layout.hpp"

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <limits>

#include "commgrid/error.hpp"

namespace commgrid::bench {
namespace {

/// This process's CPU time (user + system, page faults included). The work measured is
/// single-threaded, and on a shared machine CPU time leaves out the time spent waiting for
/// a core, which wall time would add at random.
struct Clock {
  using time_point = double;
  static double now() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
};

double seconds_since(double start) { return Clock::now() - start; }

std::int64_t max_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<std::int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

// Keeps results observable so that the optimizer cannot drop the work that made them.
volatile std::int64_t g_sink = 0;

}  // namespace

ParallelConfig bench_config(std::int64_t world_size, BenchEdition edition) {
  ParallelConfig c;
  c.world_size = world_size;
  c.compat = edition.compat;
  c.gtp_remat = edition.gtp_remat;
  c.tp = 8;
  c.pp = 8;
  c.cp = 2;
  c.ep = 8;
  c.etp = 1;
  c.validate();
  return c;
}

void use_memory_mode(MemoryMode mode) {
  if (mode == MemoryMode::warm) {
    // No mmap at all: every block comes from the heap, freed blocks return to it, and with
    // trimming off (-1; INT_MAX is not off: 3 GiB of freed lists at 2^24 ranks exceed it)
    // the heap keeps its pages for the next repetition. glibc's largest mmap threshold,
    // 32 MiB, is not enough either: a kind's list at 2^24 ranks is 128 MiB, and a fresh
    // mmap per list made the code look 9x slower than the baseline, from page faults alone.
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, -1);
  } else {
    // A fixed threshold also turns off glibc's dynamic raising of it after each free.
    mallopt(M_MMAP_MAX, 65536);
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  }
}

std::size_t group_list_bytes(const GroupList& groups) noexcept {
  // GroupList keeps offsets only when its groups differ in size (one per group, plus one);
  // its public interface does not say, so uniformity is checked here.
  bool uniform = true;
  for (std::size_t i = 1; i < groups.size() && uniform; ++i)
    uniform = groups[i].size() == groups[0].size();
  const std::size_t offsets = uniform ? 0 : groups.size() + 1;
  return groups.members().size() * sizeof(Rank) + offsets * sizeof(std::size_t);
}

std::unique_ptr<std::int64_t[]> write_integers(std::size_t n, std::int64_t first) {
  // Default-initialized: the pages are first touched by the writes, as a GroupList's are.
  std::unique_ptr<std::int64_t[]> out(new std::int64_t[n]);
  write_integers(std::span<std::int64_t>(out.get(), n), first);
  return out;
}

void write_integers(std::span<std::int64_t> out, std::int64_t first) noexcept {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = first + static_cast<std::int64_t>(i);
}

std::vector<Rank> query_ranks(std::int64_t world_size, std::size_t n) {
  // Golden-ratio stepping visits the world evenly without a random generator, so every
  // run and both timing harnesses query the same ranks.
  std::vector<Rank> out(n);
  std::uint64_t x = 0;
  for (std::size_t i = 0; i < n; ++i) {
    x += 0x9E3779B97F4A7C15ull;
    out[i] = static_cast<Rank>(x % static_cast<std::uint64_t>(world_size));
  }
  return out;
}

std::int64_t enumeration_bytes(std::int64_t world_size, MemoryMode mode, BenchEdition edition) {
  const Layout layout(bench_config(world_size, edition));
  std::int64_t members = 0;
  for (GroupKind k : layout.kinds()) members += layout.num_members(k);
  const std::int64_t lists = members * static_cast<std::int64_t>(sizeof(Rank));
  return mode == MemoryMode::warm ? 2 * lists : lists;
}

std::int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::int64_t>(pages) * page : 0;
}

std::vector<EnumerationResult> run_enumeration(const LayoutBenchOptions& o) {
  // Refuse, before measuring anything, a world whose lists cannot be held: allocating them
  // would end in bad_alloc (or the OOM killer) halfway through the run.
  const std::int64_t memory = physical_memory_bytes();
  for (std::int64_t world : o.worlds) {
    const std::int64_t need = enumeration_bytes(world, o.memory, o.edition);
    if (memory > 0 && need > memory / 2) {
      char text[256];
      std::snprintf(text, sizeof text,
                    "worlds: enumerating every kind of world %lld holds about %.1f GiB at once, "
                    "more than half of this machine's %.1f GiB; choose smaller --worlds "
                    "(one-rank queries, --query-worlds, need no such memory)",
                    static_cast<long long>(world), static_cast<double>(need) / (1 << 30),
                    static_cast<double>(memory) / (1 << 30));
      throw ConfigError("worlds", text);
    }
  }
  use_memory_mode(o.memory);
  std::vector<EnumerationResult> results;
  for (std::int64_t world : o.worlds) {
    const Layout layout(bench_config(world, o.edition));
    const std::vector<GroupKind> kinds = layout.kinds();
    EnumerationResult res;
    res.world_size = world;
    res.seconds = res.baseline_seconds = std::numeric_limits<double>::infinity();
    res.kinds.resize(kinds.size());
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      res.kinds[i].kind = kinds[i];
      res.kinds[i].seconds = res.kinds[i].baseline_seconds =
          std::numeric_limits<double>::infinity();
    }
    std::vector<std::int64_t> warm_buffer;  // sized once the first repetition counted
    for (int rep = 0; rep < std::max(1, o.repeats); ++rep) {
      const std::int64_t rss_before = max_rss_bytes();
      std::vector<GroupList> lists;
      lists.reserve(kinds.size());
      double total = 0;
      for (std::size_t i = 0; i < kinds.size(); ++i) {
        const auto start = Clock::now();
        lists.push_back(layout.groups(kinds[i]));
        const double t = seconds_since(start);
        total += t;
        res.kinds[i].seconds = std::min(res.kinds[i].seconds, t);
      }
      res.seconds = std::min(res.seconds, total);
      if (rep == 0) {
        // Only the first repetition of a world can raise the peak (worlds grow), so its
        // growth is this world's footprint; measured before any baseline buffer exists.
        res.rss_growth = max_rss_bytes() - rss_before;
        for (std::size_t i = 0; i < kinds.size(); ++i) {
          KindResult& k = res.kinds[i];
          k.groups = static_cast<std::int64_t>(lists[i].size());
          k.members = static_cast<std::int64_t>(lists[i].members().size());
          k.bytes = group_list_bytes(lists[i]);
          res.groups += k.groups;
          res.members += k.members;
          res.bytes += k.bytes;
          res.largest_bytes = std::max(res.largest_bytes, k.bytes);
        }
      }
      for (const GroupList& l : lists) g_sink = g_sink + l.members().back();
      lists.clear();

      // The baselines, right after, with the same counts and the same kind of memory.
      const bool warm = o.memory == MemoryMode::warm;
      if (warm && warm_buffer.empty()) {
        warm_buffer.assign(static_cast<std::size_t>(res.members), 0);  // maps every page
      }
      // In warm mode each kind's baseline writes the part of the buffer where that kind's
      // list sits among the lists held together, so neither side finds its memory in cache
      // from the run before (a fixed 8 MiB region would, and halve the baseline's time).
      std::int64_t offset = 0;
      auto baseline = [&](std::int64_t n) {
        const auto start = Clock::now();
        std::int64_t last = 0;
        if (warm) {
          std::span<std::int64_t> out(warm_buffer.data() + offset, static_cast<std::size_t>(n));
          write_integers(out, rep);
          last = out.back();
        } else {
          auto buf = write_integers(static_cast<std::size_t>(n), rep);
          last = buf[static_cast<std::size_t>(n) - 1];
        }
        const double t = seconds_since(start);
        g_sink = g_sink + last;
        return t;
      };
      for (KindResult& k : res.kinds) {
        k.baseline_seconds = std::min(k.baseline_seconds, baseline(k.members));
        offset += k.members;
      }
      offset = 0;
      res.baseline_seconds = std::min(res.baseline_seconds, baseline(res.members));
    }
    results.push_back(std::move(res));
  }
  return results;
}

std::vector<QueryResult> run_queries(const LayoutBenchOptions& o) {
  std::vector<QueryResult> results;
  for (std::int64_t world : o.query_worlds) {
    const Layout layout(bench_config(world, o.edition));
    const std::vector<Rank> ranks = query_ranks(world, std::max<std::size_t>(1, o.queries));
    for (GroupKind kind : kQueryKinds) {
      QueryResult q;
      q.world_size = world;
      q.kind = kind;
      q.group_size = static_cast<std::int64_t>(layout.group_of(kind, 0)->members.size());
      q.ns_per_query = std::numeric_limits<double>::infinity();
      for (int rep = 0; rep < std::max(1, o.repeats); ++rep) {
        std::int64_t sum = 0;
        const auto start = Clock::now();
        for (Rank r : ranks) sum += layout.group_of(kind, r)->members.back();
        const double ns = seconds_since(start) * 1e9 / static_cast<double>(ranks.size());
        q.ns_per_query = std::min(q.ns_per_query, ns);
        g_sink = g_sink + sum;
      }
      results.push_back(q);
    }
  }
  return results;
}

}  // namespace commgrid::bench
