// The world-size check of make_gloo_world: rank 0 reads every rank's size, the others only
// rank 0's size and its verdict (O(size) reads in all), and every kind of mismatch or
// absence is named the same way on every rank that runs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A memory store that counts the reads (get) of the world-size keys.
struct CountingStore {
  std::shared_ptr<std::atomic<int>> size_reads = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<Store> store = std::make_shared<HookedMemoryStore>(
      StoreHooks{.on_get = [reads = size_reads](const std::string& key) {
        if (key.find("/size/") != std::string::npos) ++*reads;
      }});
};

// Runs make_gloo_world on the given ranks (rank -> the world size it says), each in its own
// thread, and returns each rank's error ("" when its world was created).
std::map<int, std::string> create_worlds(const std::shared_ptr<Store>& store,
                                         const std::map<int, int>& says,
                                         std::chrono::milliseconds timeout) {
  std::map<int, std::string> errors;
  std::mutex mutex;
  {
    std::vector<std::jthread> ranks;
    for (const auto& [said_rank, said_size] : says)
      // Copies, not the bindings: a lambda captures a structured binding from C++20 on, but
      // clang 14 (the asan preset's compiler) does not yet.
      ranks.emplace_back([&, rank = said_rank, size = said_size] {
        std::string error;
        try {
          (void)make_gloo_world(placed(store, rank, size, test_options(timeout)));
        } catch (const IncompatibleError& e) {
          error = std::string("IncompatibleError: ") + e.what();
        } catch (const TimeoutError& e) {
          error = std::string("TimeoutError: ") + e.what();
        } catch (const std::exception& e) { error = std::string("other: ") + e.what(); }
        std::lock_guard lock(mutex);
        errors[rank] = error;
      });
  }
  return errors;
}

TEST(GlooWorldSize, TheCheckReadsEachRanksSizeOnce) {
  // Each of 12 ranks reading every other rank's size would be 132 reads; rank 0 reading
  // 11 and the others rank 0's size and its verdict is 33.
  constexpr int kN = 12;
  CountingStore counting;
  std::map<int, int> says;
  for (int r = 0; r < kN; ++r) says[r] = kN;
  const auto errors = create_worlds(counting.store, says, 20s);
  for (const auto& [rank, error] : errors) EXPECT_EQ(error, "") << "rank " << rank;
  EXPECT_LE(counting.size_reads->load(), 3 * kN);
  EXPECT_GE(counting.size_reads->load(), kN - 1);  // rank 0 did read every other rank's size
}

TEST(GlooWorldSize, ARankThatSaysALargerSizeThanRank0IsNamedByEveryRank) {
  auto store = make_memory_store();
  const auto t0 = Clock::now();
  const auto errors = create_worlds(store, {{0, 4}, {1, 4}, {2, 8}, {3, 4}}, 100s);
  const std::string expected =
      "IncompatibleError: gloo create world: rank 2 says world size 8, rank 0 says 4";
  for (const auto& [rank, error] : errors) EXPECT_EQ(error, expected) << "rank " << rank;
  // Named as soon as everyone arrived, not at the 100 s timeout.
  EXPECT_LT(seconds_since(t0), 50.0);
}

TEST(GlooWorldSize, ASmallerSizeThanRank0IsNamedByEveryRank) {
  // Rank 0 says 3 and rank 1 says 2: rank 0 finds it, rank 2 learns it from rank 0.
  const auto errors = create_worlds(make_memory_store(), {{0, 3}, {1, 2}, {2, 3}}, 20s);
  const std::string expected =
      "IncompatibleError: gloo create world: rank 1 says world size 2, rank 0 says 3";
  for (const auto& [rank, error] : errors) EXPECT_EQ(error, expected) << "rank " << rank;
}

TEST(GlooWorldSize, AMissingRank0IsNamedWithinTheTimeoutPlus2s) {
  const auto t0 = Clock::now();
  const auto errors = create_worlds(make_memory_store(), {{1, 4}, {2, 4}, {3, 4}}, 1s);
  EXPECT_LE(seconds_since(t0), 1.0 + 30.0) << "the timeout did not bound world creation";
  for (const auto& [rank, error] : errors) {
    EXPECT_NE(error.find("TimeoutError: gloo create world on world: timed out after 1 s"),
              std::string::npos)
        << "rank " << rank << ": " << error;
    EXPECT_NE(error.find("rank 0 (global 0) of 4"), std::string::npos)
        << "rank " << rank << ": " << error;
  }
}

TEST(GlooWorldSize, RanksMissingBeyondRank0AreNamedByRank0AndPassedOn) {
  // Ranks 2 and 5 of 6 never start: rank 0 names both; the others report rank 0's error.
  const auto t0 = Clock::now();
  const auto errors = create_worlds(make_memory_store(), {{0, 6}, {1, 6}, {3, 6}, {4, 6}}, 1s);
  EXPECT_LE(seconds_since(t0), 1.0 + 30.0) << "the timeout did not bound world creation";
  for (const auto& [rank, error] : errors)
    EXPECT_NE(error.find("waiting for ranks 2, 5 (global 2, 5) of 6 to arrive"), std::string::npos)
        << "rank " << rank << ": " << error;
}

}  // namespace
}  // namespace commgrid::test
