// Rank 1 never joins a split: rank 0's split must end the job within its timeout (2 s),
// naming the call and the group, instead of hanging. Run under mpirun -np 2.
#include <chrono>
#include <iostream>
#include <thread>

#include "commgrid/mpi.hpp"

int main(int argc, char** argv) {
  commgrid::mpi::MpiEnvironment env(&argc, &argv);
  auto world = commgrid::make_mpi_world(std::chrono::seconds(2));
  if (world->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // ended by rank 0's abort
    return 0;
  }
  auto tp = world->split(0, world->rank(), "tp#0");
  std::cout << "split returned without rank 1: wrong\n";
  return 0;
}
