// Gloo's allreduce and allgather algorithms side by side in one run: ring, bcube and
// commgrid's automatic choice (GlooAlgorithm), allreduces from 4 bytes to 16 MiB and
// allgathers of 8 bytes to 16 KiB per rank, under `commgrid launch` (one process per rank,
// as a job's ranks are):
//
//   build/tools/commgrid launch -n 16 -- build/bench/bench_gloo_allreduce [iterations]
//
// Every rank makes three Gloo worlds from the launcher (GlooOptions::algorithm ring, bcube,
// automatic). Each iteration of a row runs its call (one float32 sum allreduce, or one
// allgather) on every world in a rotating order after a barrier; a call's figure is the slowest
// rank's time (a max-allreduce per iteration, outside the timed part), a row's the median over the
// iterations. Rank 0 prints one markdown table; ratio = ring / bcube (above 1: bcube is faster).
// Exit 2 with `error: ...` on a bad argument.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "commgrid/commgrid.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double slowest(commgrid::Communicator& c, double t) {
  c.allreduce(std::span<double>(&t, 1), commgrid::ReduceOp::max)->wait();
  return t;
}

int run(int iterations) {
  using commgrid::GlooAlgorithm;
  const std::vector<std::pair<const char*, GlooAlgorithm>> algorithms = {
      {"ring", GlooAlgorithm::ring},
      {"bcube", GlooAlgorithm::bcube},
      {"automatic", GlooAlgorithm::automatic}};
  std::vector<std::unique_ptr<commgrid::Communicator>> worlds;
  for (const auto& [name, algorithm] : algorithms) {
    commgrid::GlooOptions o;
    o.prefix = std::string("allreduce-") + name;
    o.algorithm = algorithm;
    worlds.push_back(commgrid::make_gloo_world_from_env(o));
  }
  commgrid::Communicator& world = *worlds.front();
  const bool print = world.rank() == 0;
  const auto n = algorithms.size();
  // One row: `call` on every world, `iterations` times interleaved; the medians.
  auto row = [&](const std::function<void(commgrid::Communicator&)>& call) {
    std::vector<std::vector<double>> seconds(n);
    for (int it = 0; it < iterations; ++it) {
      for (std::size_t j = 0; j < n; ++j) {
        const std::size_t a = (static_cast<std::size_t>(it) + j) % n;
        worlds[a]->barrier()->wait();
        const auto t0 = Clock::now();
        call(*worlds[a]);
        seconds[a].push_back(
            slowest(world, std::chrono::duration<double>(Clock::now() - t0).count()));
      }
    }
    std::vector<double> median;
    for (std::vector<double>& s : seconds) {
      std::sort(s.begin(), s.end());
      median.push_back(s[s.size() / 2]);
    }
    if (print)
      std::printf("| %.3f ms | %.3f ms | %.3f ms | %.2f |\n", median[0] * 1e3, median[1] * 1e3,
                  median[2] * 1e3, median[0] / median[1]);
  };
  if (print) {
    std::printf("W = %d ranks, %d iterations; median of the slowest rank's time\n\n",
                static_cast<int>(world.size()), iterations);
    std::printf(
        "| allreduce (float32 sum), bytes | ring | bcube | automatic | ring / bcube |\n"
        "|---:|---:|---:|---:|---:|\n");
  }
  for (const std::size_t bytes :
       {std::size_t{4}, std::size_t{8}, std::size_t{32}, std::size_t{128}, std::size_t{1} << 10,
        std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{256} << 10, std::size_t{1} << 20,
        std::size_t{4} << 20, std::size_t{16} << 20}) {
    std::vector<float> buf(bytes / sizeof(float), 1.0F);
    if (print) std::printf("| %zu ", bytes);
    row([&](commgrid::Communicator& c) {
      c.allreduce(std::span<float>(buf), commgrid::ReduceOp::sum)->wait();
    });
  }
  if (print)
    std::printf(
        "\n| allgather, bytes per rank | ring | bcube | automatic | ring / bcube |\n"
        "|---:|---:|---:|---:|---:|\n");
  for (const std::size_t bytes :
       {std::size_t{8}, std::size_t{64}, std::size_t{1} << 10, std::size_t{16} << 10}) {
    std::vector<std::uint8_t> mine(bytes, static_cast<std::uint8_t>(world.rank() + 1));
    std::vector<std::uint8_t> all(bytes * static_cast<std::size_t>(world.size()));
    if (print) std::printf("| %zu ", bytes);
    row([&](commgrid::Communicator& c) {
      c.allgather(std::span<const std::uint8_t>(mine), std::span<std::uint8_t>(all))->wait();
    });
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 20;
  if (argc > 2) {
    std::fprintf(stderr, "error: usage: bench_gloo_allreduce [iterations]\n");
    return 2;
  }
  if (argc == 2) {
    char* end = nullptr;
    const long v = std::strtol(argv[1], &end, 10);
    if (end == argv[1] || *end != '\0' || v < 1 || v > 100000) {
      std::fprintf(stderr, "error: iterations must be an integer in [1, 100000], got '%s'\n",
                   argv[1]);
      return 2;
    }
    iterations = static_cast<int>(v);
  }
  try {
    return run(iterations);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
