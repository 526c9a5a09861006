// First steps, 3: the same under mpirun. Every process is one rank; the world size comes
// from the launcher, tp is 2 and dp fills the rest.
//
//   mpirun -np 4 example_mpi_groups
#include <commgrid/commgrid.hpp>

#include <cstdlib>
#include <iostream>
#include <vector>

int main(int argc, char** argv) {
  commgrid::MpiEnvironment env(&argc, &argv);
  try {
    const auto world = commgrid::make_mpi_world();
    commgrid::ParallelConfig config;
    config.world_size = world->size();
    config.tp = 2;
    commgrid::ProcessGroups groups;
    groups.initialize(*world, config);  // collective: every rank, the same config

    // One allreduce per group of tp and dp: each must give the sum of its members' ranks.
    bool ok = true;
    for (commgrid::GroupKind kind : {commgrid::GroupKind::tp, commgrid::GroupKind::dp}) {
      std::vector<std::int64_t> value = {groups.world_rank()};
      groups.group(kind).allreduce(std::span<std::int64_t>(value), commgrid::ReduceOp::sum)->wait();
      std::int64_t want = 0;
      for (commgrid::Rank m : groups.global_ranks(kind)) want += m;
      ok = ok && value[0] == want;
    }
    std::vector<int> all = {ok ? 1 : 0};
    world->allreduce(std::span<int>(all), commgrid::ReduceOp::min)->wait();
    if (groups.world_rank() == 0)
      std::cout << (all[0] ? "ok" : "FAILED") << ": " << groups.world_size()
                << " ranks, tp and dp groups checked\n";
    groups.destroy();
    return all[0] ? EXIT_SUCCESS : EXIT_FAILURE;
  } catch (const commgrid::Error& e) {
    std::cerr << "error: " << e.what() << '\n';
    return EXIT_FAILURE;
  }
}
