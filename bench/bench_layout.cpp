// Google Benchmark: the layout at scale. Every kind of worlds 2^10 ... 2^20 enumerated
// (tp8 pp8 cp2 ep8 etp1) next to writing as many int64 values, and one rank's group of
// the small kinds in worlds up to 2^30. See bench/README.md and docs/benchmarks.md.
// Times are CPU time (Google Benchmark's default): the work is single-threaded, and on a
// shared machine CPU time leaves out the time this process waited for a core.
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <new>
#include <vector>

#include "bench/bench_layout.hpp"
#include "commgrid/layout.hpp"

namespace {

using commgrid::GroupKind;
using commgrid::GroupList;
using commgrid::Layout;
using commgrid::Rank;
namespace cb = commgrid::bench;

// ---- heap accounting: the peak bytes an enumeration holds ---------------------------
// Replacing the global allocation functions is the only way to see every byte the
// library allocates (temporaries included) without changing it; this binary alone does.
std::atomic<std::int64_t> g_heap_now{0};
std::atomic<std::int64_t> g_heap_peak{0};

void note_alloc(void* p) noexcept {
  if (p == nullptr) return;
  const auto n = static_cast<std::int64_t>(malloc_usable_size(p));
  const std::int64_t now = g_heap_now.fetch_add(n, std::memory_order_relaxed) + n;
  std::int64_t peak = g_heap_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_heap_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {}
}

void note_free(void* p) noexcept {
  if (p != nullptr)
    g_heap_now.fetch_sub(static_cast<std::int64_t>(malloc_usable_size(p)),
                         std::memory_order_relaxed);
}

void* counted_alloc(std::size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  note_alloc(p);
  return p;
}

/// Heap bytes above the level at construction that were held at once since then.
class PeakHeap {
 public:
  PeakHeap() : start_(g_heap_now.load()) { g_heap_peak.store(start_); }
  [[nodiscard]] std::int64_t bytes() const { return g_heap_peak.load() - start_; }

 private:
  std::int64_t start_;
};

// ---- the workload -----------------------------------------------------------------
const Layout& layout_of(std::int64_t world) {
  static std::map<std::int64_t, Layout> cache;
  auto it = cache.find(world);
  if (it == cache.end()) it = cache.emplace(world, Layout(cb::bench_config(world))).first;
  return it->second;
}

// Members of every kind of a world (kind < 0) or of one kind, counted once by enumerating.
std::int64_t members_of(std::int64_t world, std::int64_t kind) {
  static std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> cache;
  const std::pair key{world, kind};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const Layout& layout = layout_of(world);
  std::int64_t n = 0;
  for (GroupKind k : layout.kinds())
    if (kind < 0 || k == static_cast<GroupKind>(kind))
      n += static_cast<std::int64_t>(layout.groups(k).members().size());
  return cache[key] = n;
}

// A buffer mapped before timing, so the baseline measures writing and not page faults;
// the lists land in pages the allocator kept from earlier iterations (warm memory mode).
std::vector<std::int64_t>& warm_buffer(std::size_t n) {
  static std::vector<std::int64_t> buf;
  if (buf.size() < n) buf.assign(n, 0);
  return buf;
}

void set_counters(benchmark::State& state, std::int64_t members, std::int64_t list_bytes,
                  std::int64_t peak_bytes) {
  state.counters["members"] = static_cast<double>(members);
  state.counters["ints/s"] =
      benchmark::Counter(static_cast<double>(members) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  if (list_bytes >= 0) state.counters["list_MiB"] = static_cast<double>(list_bytes) / (1 << 20);
  if (peak_bytes >= 0) state.counters["peak_MiB"] = static_cast<double>(peak_bytes) / (1 << 20);
}

// Every kind of the world, held together as a caller that wants the whole layout would.
void BM_EnumerateAll(benchmark::State& state) {
  const Layout& layout = layout_of(state.range(0));
  const std::vector<GroupKind> kinds = layout.kinds();
  std::int64_t members = 0, bytes = 0, peak = 0;
  {
    // One untimed round, held together like the timed ones, maps the pages that the timed
    // rounds reuse (warm memory).
    std::vector<GroupList> warmup;
    for (GroupKind k : kinds) warmup.push_back(layout.groups(k));
    benchmark::DoNotOptimize(warmup.data());
  }
  for (auto _ : state) {
    std::vector<GroupList> lists;
    lists.reserve(kinds.size());
    {
      const PeakHeap heap;
      for (GroupKind k : kinds) lists.push_back(layout.groups(k));
      peak = heap.bytes();
    }
    state.PauseTiming();  // releasing is not part of enumerating (nor of the baseline)
    members = bytes = 0;
    for (const GroupList& l : lists) {
      members += static_cast<std::int64_t>(l.members().size());
      bytes += static_cast<std::int64_t>(cb::group_list_bytes(l));
    }
    benchmark::DoNotOptimize(lists.data());
    lists.clear();
    state.ResumeTiming();
  }
  set_counters(state, members, bytes, peak);
}

// Writing as many int64 values as BM_EnumerateAll produces (or BM_EnumerateKind with a kind).
void BM_WriteIntegers(benchmark::State& state) {
  const std::int64_t n = members_of(state.range(0), state.range(1));
  std::vector<std::int64_t>& buf = warm_buffer(static_cast<std::size_t>(n));
  std::int64_t first = 0;
  for (auto _ : state) {
    cb::write_integers(std::span(buf.data(), static_cast<std::size_t>(n)), ++first);
    benchmark::DoNotOptimize(buf.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, n, -1, -1);
}

void BM_EnumerateKind(benchmark::State& state) {
  const Layout& layout = layout_of(state.range(0));
  const auto kind = static_cast<GroupKind>(state.range(1));
  state.SetLabel(std::string(commgrid::kind_name(kind)));
  std::int64_t members = 0, bytes = 0, peak = 0;
  benchmark::DoNotOptimize(layout.groups(kind).members().data());  // untimed: maps pages
  for (auto _ : state) {
    const PeakHeap heap;
    GroupList l = layout.groups(kind);
    peak = heap.bytes();
    members = static_cast<std::int64_t>(l.members().size());
    bytes = static_cast<std::int64_t>(cb::group_list_bytes(l));
    benchmark::DoNotOptimize(l.members().data());
    state.PauseTiming();
    l = GroupList();
    state.ResumeTiming();
  }
  set_counters(state, members, bytes, peak);
}

// One rank's group: the same ranks for every kind, spread over the world.
void BM_GroupOf(benchmark::State& state) {
  const std::int64_t world = std::int64_t{1} << state.range(0);
  const auto kind = static_cast<GroupKind>(state.range(1));
  state.SetLabel(std::string(commgrid::kind_name(kind)));
  const Layout layout(cb::bench_config(world));
  const std::vector<Rank> ranks = cb::query_ranks(world, 4096);
  std::size_t i = 0;
  for (auto _ : state) {
    auto g = layout.group_of(kind, ranks[i++ & 4095]);
    benchmark::DoNotOptimize(g->members.data());
  }
}

void enumeration_args(benchmark::internal::Benchmark* b) {
  for (std::int64_t w : cb::kEnumerationWorlds) b->Args({w, -1});
}

void kind_args(benchmark::internal::Benchmark* b) {
  // Per kind at the largest world only: the smaller ones add time, not insight.
  const std::int64_t w = cb::kEnumerationWorlds.back();
  for (GroupKind k : layout_of(w).kinds()) b->Args({w, static_cast<std::int64_t>(k)});
}

void query_args(benchmark::internal::Benchmark* b) {
  for (std::int64_t w : cb::kQueryWorlds) {
    int log2 = 0;
    while ((std::int64_t{1} << log2) < w) ++log2;
    for (GroupKind k : cb::kQueryKinds) b->Args({log2, static_cast<std::int64_t>(k)});
  }
}

BENCHMARK(BM_EnumerateAll)->Apply(enumeration_args)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WriteIntegers)->Apply(enumeration_args)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EnumerateKind)->Apply(kind_args)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WriteIntegers)
    ->Name("BM_WriteIntegersKind")
    ->Apply(kind_args)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GroupOf)->Apply(query_args)->Unit(benchmark::kNanosecond);

}  // namespace

// The counting allocation functions (see PeakHeap). Aligned forms keep the library's.
void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept {
  note_free(p);
  std::free(p);
}
void operator delete[](void* p) noexcept {
  note_free(p);
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  note_free(p);
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  note_free(p);
  std::free(p);
}

int main(int argc, char** argv) {
  // Warm memory, as `commgrid bench layout` by default: freed lists stay mapped.
  cb::use_memory_mode(cb::MemoryMode::warm);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
