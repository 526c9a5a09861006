// Links against the installed commgrid and checks one layout answer.
#include <commgrid/backends.hpp>
#include <commgrid/layout.hpp>

#include <iostream>

int main() {
  commgrid::ParallelConfig c;
  c.world_size = 16;
  c.tp = 2;
  c.pp = 2;
  c.cp = 2;
  const commgrid::Layout layout(c);
  const auto mp = layout.group_of(commgrid::GroupKind::mp, 13);
  const std::vector<commgrid::Rank> want = {4, 5, 12, 13};
  if (!mp || mp->members != want) {
    std::cerr << "consumer: wrong mp group for rank 13\n";
    return 1;
  }
  std::cout << "consumer: ok (mpi " << COMMGRID_HAS_MPI << ", gloo " << COMMGRID_HAS_GLOO << ")\n";
  return 0;
}
