// A rank that never joins: rank 0's call must end the job within its timeout (2 s), naming
// the call and the group, instead of hanging. Run under mpirun -np 2, with the argument
// "split" (a group creation, a blocking MPI call) or "blocking-allreduce" (a collective of a
// world whose collectives are blocking MPI calls).
#include <chrono>
#include <iostream>
#include <string>
#include <thread>

#include "commgrid/mpi.hpp"

int main(int argc, char** argv) {
  commgrid::MpiEnvironment env(&argc, &argv);
  const std::string what = argc > 1 ? argv[1] : "split";
  auto world = commgrid::make_mpi_world(
      {.timeout = std::chrono::seconds(2),
       .collective_calls = what == "blocking-allreduce"
                               ? commgrid::MpiCollectiveCalls::blocking
                               : commgrid::MpiCollectiveCalls::nonblocking});
  if (world->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // ended by rank 0's abort
    return 0;
  }
  if (what == "blocking-allreduce") {
    int x = 1;
    world->allreduce(&x, &x, 1, commgrid::DataType::int32, commgrid::ReduceOp::sum)->wait();
    std::cout << "allreduce returned without rank 1: wrong\n";
    return 0;
  }
  auto tp = world->split(0, world->rank(), "tp#0");
  std::cout << "split returned without rank 1: wrong\n";
  return 0;
}
