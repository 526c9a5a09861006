// find_package(commgrid COMPONENTS world): make_world through the umbrella header. Started by
// hand (no launcher), the world is this one process, on Gloo; the allreduce is checked.
#include <commgrid/commgrid.hpp>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

int main() {
  const auto world = commgrid::make_world({.backend = "gloo"});
  std::vector<std::int64_t> v = {world->rank() + 41};
  world->allreduce(std::span<std::int64_t>(v), commgrid::ReduceOp::sum)->wait();
  if (world->size() != 1 || v[0] != 41) {
    std::fprintf(stderr, "world of %lld rank(s), sum %lld: expected 1 and 41\n",
                 static_cast<long long>(world->size()), static_cast<long long>(v[0]));
    return 1;
  }
  std::printf("consumer_world: make_world gave a world of 1 rank, allreduce ok\n");
  return 0;
}
