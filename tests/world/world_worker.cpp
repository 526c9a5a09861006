// One rank of a world that make_world starts from whichever launcher started this process:
//   world_worker BACKEND     (gloo, mpi, nccl or auto)
// Every rank all-reduces (sums) rank+1 and checks the sum n(n+1)/2; rank 0 prints
// "make_world: backend B, world size N, allreduce sum S" (the tests match it). Exit codes:
// 0 the sum is right, 1 it is not or the world failed, 2 bad input (a ConfigError).
#include <chrono>
#include <commgrid/commgrid.hpp>
#include <cstdint>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <typeinfo>
#include <vector>

namespace {

// The backend the world runs on, from its communicator's type.
std::string backend_of(const commgrid::Communicator& world) {
  const std::string type = typeid(world).name();
  for (const char* name : {"Gloo", "Mpi", "Nccl"})
    if (type.find(name) != std::string::npos) return name;
  return "unknown (" + type + ")";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: world_worker gloo|mpi|nccl|auto\n";
    return 2;
  }
  try {
    const std::unique_ptr<commgrid::Communicator> world =
        commgrid::make_world({.backend = argv[1], .timeout = std::chrono::seconds(60)});
    const std::int64_t n = world->size();
    std::vector<std::int64_t> value = {world->rank() + 1};
    world->allreduce(std::span<std::int64_t>(value), commgrid::ReduceOp::sum)->wait();
    if (value[0] != n * (n + 1) / 2) {
      std::cerr << "error: rank " << world->rank() << ": allreduce sum " << value[0]
                << ", expected " << n * (n + 1) / 2 << "\n";
      return 1;
    }
    if (world->rank() == 0)
      std::cout << "make_world: backend " << backend_of(*world) << ", world size " << n
                << ", allreduce sum " << value[0] << "\n";
    return 0;
  } catch (const commgrid::ConfigError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
