// Links the installed commgrid::gloo (find_package(commgrid COMPONENTS gloo)) and runs four
// rank-threads: the umbrella header declares the runner, the world and ProcessGroups.
#include <commgrid/commgrid.hpp>

#include <atomic>
#include <iostream>

// What the docs call the API, declared by the umbrella header alone (a name missing from
// it fails this build): the world factories, the launcher's view, stores, the rank-threads
// runner and its errors, the runtime's collections and the layout's extras.
using commgrid::AbortedError;
using commgrid::check_topology;
using commgrid::GradCommProcessGroups;
using commgrid::HyperGridGroups;
using commgrid::kDefaultTimeout;
using commgrid::LaunchInfo;
using commgrid::make_gloo_world;
using commgrid::make_gloo_world_from_env;
using commgrid::make_memory_store;
using commgrid::ModelCommProcessGroups;
using commgrid::open_store;
using commgrid::P2POp;
using commgrid::ProcessGroupCollection;
using commgrid::RankFailedError;
using commgrid::RankMap;
using commgrid::read_launch_info;
using commgrid::run_local_ranks_collect;
using commgrid::TimeoutError;

int main() {
  commgrid::ParallelConfig c;
  c.world_size = 4;
  c.tp = 2;
  std::atomic<int> ok{0};
  commgrid::GlooOptions options;
  options.timeout = std::chrono::seconds(60);
  commgrid::run_local_ranks(
      4,
      [&](commgrid::Communicator& world) {
        commgrid::ProcessGroups pg;
        pg.initialize(world, c);
        std::int64_t mine = world.rank(), sum = 0;
        pg.group(commgrid::GroupKind::tp)
            .allreduce(&mine, &sum, 1, commgrid::DataType::int64, commgrid::ReduceOp::sum)
            ->wait();
        const std::int64_t first = world.rank() / 2 * 2;
        if (sum == first + first + 1) ++ok;
      },
      options);
  if (ok != 4) {
    std::cerr << "consumer_gloo: " << ok << " of 4 ranks got the right tp sum\n";
    return 1;
  }
  std::cout << "consumer_gloo: ok\n";
  return 0;
}
