// Times ProcessGroups::initialize with each creation strategy under mpirun; the numbers
// behind kDefaultStrategy (docs/runtime.md). Not a test: run it by hand.
//
//   mpirun -np 16 build/tests/backends/mpi/commgrid_mpi_creation_bench [repeats] [tp pp cp ep etp
//   N]
//
// Each repetition runs the three strategies in a rotating order (so that noise on a shared
// machine hits each alike), with a barrier before each; the time of one initialize is the
// slowest rank's. Prints the median and the fastest repetition per strategy.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "commgrid/mpi.hpp"
#include "commgrid/process_groups.hpp"

int main(int argc, char** argv) {
  using namespace commgrid;
  MpiEnvironment env(&argc, &argv);
  auto world = make_mpi_world({.timeout = std::chrono::minutes(5)});
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 10;
  ParallelConfig c;
  c.world_size = world->size();
  if (argc > 7) {
    c.tp = std::atoll(argv[2]);
    c.pp = std::atoll(argv[3]);
    c.cp = std::atoll(argv[4]);
    c.ep = std::atoll(argv[5]);
    c.etp = std::atoll(argv[6]);
    c.dist_opt_instances = std::atoll(argv[7]);
  } else if (world->size() % 8 == 0) {
    c.tp = c.pp = c.cp = 2;
  }
  const CreationStrategy strategies[] = {CreationStrategy::split, CreationStrategy::member,
                                         CreationStrategy::per_group};
  std::vector<double> times[3];
  std::int64_t calls[3] = {0, 0, 0};
  for (int rep = 0; rep < repeats; ++rep) {
    for (int j = 0; j < 3; ++j) {
      const int s = (rep + j) % 3;
      world->barrier()->wait();
      ProcessGroups pg;
      InitOptions o;
      o.strategy = strategies[s];
      const auto t0 = std::chrono::steady_clock::now();
      pg.initialize(*world, c, o);
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      world->allreduce(&t, &t, 1, DataType::float64, ReduceOp::max)->wait();
      times[s].push_back(t);
      std::int64_t n = 0;
      for (const KindCreation& k : pg.creation_stats()) n += k.creation_calls;
      calls[s] = n;
    }
  }
  if (world->rank() == 0) {
    std::printf("%s, %d repetitions, slowest rank per initialize\n", c.canonical().c_str(),
                repeats);
    std::printf("%-10s %12s %12s %18s\n", "strategy", "median_ms", "min_ms", "calls_per_rank");
    for (int s = 0; s < 3; ++s) {
      std::sort(times[s].begin(), times[s].end());
      std::printf("%-10s %12.2f %12.2f %18lld\n", std::string(strategy_name(strategies[s])).c_str(),
                  times[s][times[s].size() / 2] * 1e3, times[s].front() * 1e3,
                  static_cast<long long>(calls[s]));
    }
  }
  return 0;
}
