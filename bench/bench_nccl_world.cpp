// The NCCL world's check that no two ranks of a host chose one device (world_problem, run by
// every rank before NCCL initializes), at 10^3 ... 10^6 ranks: the sorted check against
// the pairwise scan it replaced, on worlds with no problem (the whole world is read).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <vector>

#include "nccl_host.hpp"

namespace {

using commgrid::nccl_host::HostInfo;

// 8 GPUs per host, as exchanged: a host name of a typical length and each GPU's bus id.
std::vector<HostInfo> world(std::size_t ranks) {
  std::vector<HostInfo> all(ranks);
  char buf[64];
  for (std::size_t r = 0; r < ranks; ++r) {
    std::snprintf(buf, sizeof buf, "gpu-node-%06zu.cluster", r / 8);
    all[r].host = buf;
    all[r].device = static_cast<int>(r % 8);
    all[r].device_count = 8;
    std::snprintf(buf, sizeof buf, "0000:%02zx:00.0", 0x18 + 0x10 * (r % 8));
    all[r].bus_id = buf;
  }
  return all;
}

template <std::string (*Check)(const std::vector<HostInfo>&)>
void run(benchmark::State& state) {
  const auto ranks = static_cast<std::size_t>(state.range(0));
  const std::vector<HostInfo> all = world(ranks);
  for (auto _ : state) {
    std::string problem = Check(all);
    if (!problem.empty()) state.SkipWithError("unexpected problem");
    benchmark::DoNotOptimize(problem);
  }
  state.counters["ranks"] = static_cast<double>(ranks);
  state.SetComplexityN(state.range(0));
}

void BM_WorldProblemSorted(benchmark::State& state) {
  run<&commgrid::nccl_host::world_problem>(state);
}
void BM_WorldProblemPairwise(benchmark::State& state) {
  run<&commgrid::nccl_host::world_problem_pairwise>(state);
}

BENCHMARK(BM_WorldProblemSorted)
    ->Arg(1000)
    ->Arg(3000)
    ->Arg(10000)
    ->Arg(30000)
    ->Arg(100000)
    ->Arg(1000000)
    ->Unit(benchmark::kMillisecond)
    ->Complexity(benchmark::oNLogN);
// 10^5 ranks take about 20 s per call here: pass --benchmark_filter to include it.
BENCHMARK(BM_WorldProblemPairwise)
    ->Arg(1000)
    ->Arg(3000)
    ->Arg(10000)
    ->Arg(30000)
    ->Unit(benchmark::kMillisecond)
    ->Complexity(benchmark::oNSquared);

}  // namespace

BENCHMARK_MAIN();
