// A rank program for the launch tests: builds its world from COMMGRID_* like a user's
// program, then behaves as asked: ok | exit RANK CODE | sigkill RANK | missing RANK |
// env | sleep | hold SECONDS (world, barrier, sleep, barrier) | local | lategroup RANK.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "commgrid/gloo.hpp"

namespace {

using namespace commgrid;

// Collectives until one fails; used by the survivors of a fault.
void allreduce_forever(Communicator& w) {
  for (int k = 0; k < 100000; ++k) {
    std::int64_t v = 1, out = 0;
    w.allreduce(&v, &out, 1, DataType::int64, ReduceOp::sum)->wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  const int target = argc > 2 ? std::atoi(argv[2]) : -1;
  if (mode == "env") {
    std::cout << "store " << std::getenv("COMMGRID_STORE") << "\n"
              << "timeout "
              << (std::getenv("COMMGRID_TIMEOUT") ? std::getenv("COMMGRID_TIMEOUT") : "unset")
              << "\n";
    std::cout << "no newline at the end" << std::flush;
    std::cerr << "to stderr\n";
    return 0;
  }
  if (mode == "sleep") {
    std::this_thread::sleep_for(std::chrono::seconds(100));
    return 0;
  }
  const LaunchInfo info = read_launch_info();
  if (mode == "missing" && info.rank == target) return 0;  // never joins
  auto w = make_gloo_world_from_env();
  if (mode == "hold") {
    w->barrier()->wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(target * 1000));
    w->barrier()->wait();
    std::cout << ("rank " + std::to_string(w->rank()) + " held\n") << std::flush;
    return 0;
  }
  if (mode == "lategroup") {
    // Rank `target` joins a group 2 s after the others, who wait with their pairs
    // listening: the window a stranger would use.
    if (w->rank() == target) std::this_thread::sleep_for(std::chrono::seconds(2));
    auto g = w->split(0, w->rank(), "late");
    std::int64_t one = 1, n = 0;
    g->allreduce(&one, &n, 1, DataType::int64, ReduceOp::sum)->wait();
    std::cout << ("rank " + std::to_string(w->rank()) + " group of " + std::to_string(n) + "\n")
              << std::flush;
    return 0;
  }
  if (mode == "local") {
    std::cout << ("rank " + std::to_string(w->rank()) + " local " +
                  std::to_string(info.local_rank) + " of " + std::to_string(info.local_size) +
                  " job " + info.job_id + "\n")
              << std::flush;
    w->barrier()->wait();
    return 0;
  }
  std::int64_t v = w->rank(), sum = 0;
  w->allreduce(&v, &sum, 1, DataType::int64, ReduceOp::sum)->wait();
  if (mode == "ok") {
    auto g = w->split(w->rank() % 2, w->rank(), "parity");
    g->barrier()->wait();
    std::cout << "rank " << w->rank() << " of " << w->size() << " ok sum=" << sum << std::endl;
    return 0;
  }
  if (mode == "exit") {
    if (w->rank() == target) return argc > 3 ? std::atoi(argv[3]) : 1;
    // The others stay quiet: it is launch that must stop them.
    std::this_thread::sleep_for(std::chrono::seconds(100));
    return 0;
  }
  if (mode == "sigkill" && w->rank() == target) ::raise(SIGKILL);
  allreduce_forever(*w);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    // One write: a rank stopped right after cannot leave half a line.
    std::cerr << ("error: " + std::string(e.what()) + "\n") << std::flush;
    return 1;
  }
}
