// ProcessGroups::initialize has one deadline, the world's timeout from its start, whatever
// the number of kinds it creates.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "commgrid/process_groups.hpp"
#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;

TEST(GlooInitDeadline, ManyCreationsEachWithinTheTimeoutStillEndAtTheDeadline) {
  // Every write to the store takes 25 ms: each group creation (a few writes per rank, one
  // at a time) stays well within the 3 s timeout, but the 17 kinds of tp2 pp2 on 4 ranks
  // together would take several times that. initialize must end at the deadline, on every
  // rank, and the world keep its own timeout.
  std::atomic<bool> slow{false};
  auto store = std::make_shared<HookedMemoryStore>(
      StoreHooks{.on_set = [&](const std::string&, const std::vector<char>&) {
        if (slow.load()) std::this_thread::sleep_for(25ms);
        return true;
      }});
  ParallelConfig cfg;
  cfg.world_size = 4;
  cfg.tp = 2;
  cfg.pp = 2;
  const GlooOptions o = test_options(3s);
  std::vector<std::unique_ptr<Communicator>> worlds(4);
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < 4; ++r)
      ranks.emplace_back(
          [&, r] { worlds[static_cast<size_t>(r)] = make_gloo_world(placed(store, r, 4, o)); });
  }
  slow = true;
  std::vector<std::string> errors(4);
  std::vector<double> took(4);
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < 4; ++r)
      ranks.emplace_back([&, r] {
        const auto t0 = std::chrono::steady_clock::now();
        ProcessGroups pg;
        InitOptions opts;
        opts.strategy = CreationStrategy::member;
        try {
          pg.initialize(*worlds[static_cast<size_t>(r)], cfg, opts);
          errors[static_cast<size_t>(r)] = "initialized";
        } catch (const BackendError& e) { errors[static_cast<size_t>(r)] = e.what(); }
        took[static_cast<size_t>(r)] = seconds_since(t0);
      });
  }
  int timeouts = 0;
  for (int r = 0; r < 4; ++r) {
    const std::string& e = errors[static_cast<size_t>(r)];
    EXPECT_NE(e, "initialized") << "rank " << r;
    // The 3 s deadline (the 17 kinds would take several times that); room for a loaded machine.
    EXPECT_LT(took[static_cast<size_t>(r)], 3.0 + 30.0) << "rank " << r << ": " << e;
    if (e.find("the world's timeout of 3 s bounds the whole call") != std::string::npos) ++timeouts;
    EXPECT_EQ(worlds[static_cast<size_t>(r)]->timeout(), 3000ms) << "rank " << r;
  }
  EXPECT_GT(timeouts, 0) << errors[0] << "\n"
                         << errors[1] << "\n"
                         << errors[2] << "\n"
                         << errors[3];
}

}  // namespace
}  // namespace commgrid::test
