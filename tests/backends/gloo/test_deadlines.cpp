// One deadline per Gloo collective: a peer that makes progress slowly, step after step,
// keeps every single wait of a ring allreduce under the timeout, yet the others' whole
// operation must still end within the timeout plus 2 s. The slow peer is a real rank of
// the group that runs Gloo's own ring allreduce on the group's context, with a reduction
// that pauses at every step.
#include <gloo/allreduce.h>
#include <gloo/context.h>
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <thread>

#include "deadline.hpp"
#include "gloo_test_util.hpp"
#include "gloo_testing.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kRanks = 8;
constexpr int kSlowRank = 3;
// 64 elements: every one of the 2 x 8 ring segments is non-empty, so the slow rank pauses
// at every reduce-scatter step (14 of them for 8 ranks).
constexpr size_t kCount = 64;

// The world runs Gloo's ring allreduce, as the slow peer does (GlooAlgorithm::ring: the
// automatic choice would take bcube for these 512 bytes).
GlooOptions ring_options() {
  GlooOptions o = test_options(std::chrono::seconds(60));
  o.algorithm = GlooAlgorithm::ring;
  return o;
}

std::int64_t input(int rank, size_t i) { return 1000 * rank + static_cast<std::int64_t>(i); }

std::int64_t expected_sum(size_t i) {
  std::int64_t s = 0;
  for (int r = 0; r < kRanks; ++r) s += input(r, i);
  return s;
}

// What each rank saw of the allreduce.
struct Outcome {
  std::string error;  // "" when it succeeded
  bool timeout = false;
  double seconds = 0;
  bool sum_ok = false;
  std::string after;  // the error of a barrier called afterwards, "" if it succeeded
  double after_seconds = 0;
};

// Runs one allreduce on 8 rank-threads with the given timeout; rank kSlowRank plays the slow
// peer, pausing `pause` at each of its reductions.
std::vector<Outcome> allreduce_with_slow_peer(std::chrono::milliseconds pause,
                                              std::chrono::milliseconds timeout,
                                              bool then_barrier) {
  std::vector<Outcome> out(kRanks);
  auto result = run_local_ranks_collect(
      kRanks,
      [&](Communicator& w) {
        Outcome& o = out[static_cast<size_t>(w.rank())];
        std::vector<std::int64_t> buf(kCount);
        for (size_t i = 0; i < kCount; ++i) buf[i] = input(w.rank(), i);
        w.barrier()->wait();  // every rank starts the allreduce at about the same time
        // The world was made, and met, under a generous timeout (a loaded machine may take
        // seconds to connect 8 rank-threads); the timeout under test is the allreduce's own.
        w.set_timeout(timeout);
        const auto t0 = Clock::now();
        try {
          if (w.rank() == kSlowRank) {
            gloo_backend::CollectiveForTesting c = gloo_backend::take_collective_for_testing(w);
            ::gloo::AllreduceOptions opts(c.context);
            opts.setOutput(buf.data(), kCount);
            opts.setReduceFunction([pause](void* r, const void* a, const void* b, size_t n) {
              std::this_thread::sleep_for(pause);
              for (size_t i = 0; i < n; ++i)
                static_cast<std::int64_t*>(r)[i] =
                    static_cast<const std::int64_t*>(a)[i] + static_cast<const std::int64_t*>(b)[i];
            });
            opts.setTag(c.tag);
            opts.setTimeout(w.timeout());
            ::gloo::allreduce(opts);
          } else {
            w.allreduce(buf.data(), buf.data(), kCount, DataType::int64, ReduceOp::sum)->wait();
          }
          o.sum_ok = true;
          for (size_t i = 0; i < kCount; ++i) o.sum_ok = o.sum_ok && buf[i] == expected_sum(i);
        } catch (const TimeoutError& e) {
          o.error = e.what();
          o.timeout = true;
        } catch (const std::exception& e) { o.error = e.what(); }
        o.seconds = seconds_since(t0);
        if (!then_barrier || w.rank() == kSlowRank || o.error.empty()) return;
        const auto t1 = Clock::now();
        try {
          w.barrier()->wait();
        } catch (const std::exception& e) { o.after = e.what(); }
        o.after_seconds = seconds_since(t1);
      },
      ring_options());
  EXPECT_EQ(result.first_failed_rank, -1) << result.first_failure;
  return out;
}

TEST(GlooDeadline, ASlowPeerThatFitsTheTimeoutJoinsTheRingAllreduce) {
  // The control: the slow peer really takes part in the group's ring (same tag, same
  // algorithm) and everyone gets the right sum when 14 pauses of 20 ms fit the timeout
  // (a generous one: the machine may be loaded).
  const std::vector<Outcome> out = allreduce_with_slow_peer(20ms, 60s, false);
  for (int r = 0; r < kRanks; ++r) {
    const Outcome& o = out[static_cast<size_t>(r)];
    EXPECT_EQ(o.error, "") << "rank " << r;
    EXPECT_TRUE(o.sum_ok) << "rank " << r;
  }
  // The pauses are serial along the ring: the whole operation took at least their sum.
  EXPECT_GT(out[0].seconds, 14 * 0.02 * 0.9);
}

TEST(GlooDeadline, AGroupWithAPeerSlowAtEveryStepEndsWithinTheTimeoutPlus2s) {
  // 14 pauses of 300 ms: each wait of the others lasts about one pause (well under the 1 s
  // timeout), the whole allreduce about 4.2 s. Without one deadline for the operation the
  // others would wait it out and succeed; with it they end near 1 s.
  const std::vector<Outcome> out = allreduce_with_slow_peer(300ms, 1s, true);
  int timeouts = 0;
  for (int r = 0; r < kRanks; ++r) {
    const Outcome& o = out[static_cast<size_t>(r)];
    std::cout << "rank " << r << (r == kSlowRank ? " (slow)" : "") << ": " << o.seconds << " s, "
              << (o.error.empty() ? "completed" : o.error) << "\n";
    if (r == kSlowRank) continue;
    EXPECT_NE(o.error, "") << "rank " << r << " finished the allreduce after " << o.seconds
                           << " s: its timeout did not bound the whole operation";
    // Bounded: the timeout plus 2 s on an idle machine (the bound leaves room for a
    // loaded one; without the deadline the ranks succeed, which the check above catches). A
    // rank whose peer gave up first reports the lost peer (AbortedError) rather than its
    // own timeout; both end the operation in time.
    EXPECT_LE(o.seconds, 1.0 + 30.0) << "rank " << r << ": " << o.error;
    if (o.timeout) {
      ++timeouts;
      EXPECT_NE(o.error.find("gloo allreduce on world: timed out after 1 s"), std::string::npos)
          << o.error;
    }
    // The group is unusable afterwards, and says so at once or within the bound.
    if (o.error.empty()) continue;
    EXPECT_NE(o.after, "") << "rank " << r << ": a barrier after the timeout succeeded";
    EXPECT_LE(o.after_seconds, 1.0 + 30.0) << "rank " << r << ": " << o.after;
  }
  EXPECT_GE(timeouts, 1) << "no rank reported its own deadline";
}

TEST(GlooDeadline, AStormOfCollectivesStillPasses) {
  // Every collective registers with the watchdog; hundreds back to back, mixed, must pass
  // and give the right results.
  constexpr int kN = 4;
  constexpr int kRounds = 120;
  run_local_ranks(
      kN,
      [&](Communicator& w) {
        const int me = w.rank();
        for (int k = 0; k < kRounds; ++k) {
          std::int64_t v = me + k, sum = 0;
          w.allreduce(&v, &sum, 1, DataType::int64, ReduceOp::sum)->wait();
          ASSERT_EQ(sum, 4 * k + 6) << "round " << k;
          std::int32_t mine = me * 10 + k % 7;
          std::vector<std::int32_t> all(kN);
          w.allgather(&mine, all.data(), 1, DataType::int32)->wait();
          for (int r = 0; r < kN; ++r) ASSERT_EQ(all[static_cast<size_t>(r)], r * 10 + k % 7);
          std::vector<std::int32_t> send(kN), recv(kN);
          for (int r = 0; r < kN; ++r) send[static_cast<size_t>(r)] = me * 100 + r;
          w.alltoall(send.data(), recv.data(), 1, DataType::int32)->wait();
          for (int r = 0; r < kN; ++r) ASSERT_EQ(recv[static_cast<size_t>(r)], r * 100 + me);
          std::int64_t b = me == k % kN ? k : -1;
          w.broadcast(&b, 1, DataType::int64, k % kN)->wait();
          ASSERT_EQ(b, k);
          // A rooted collective (point to point under the hood) and a ring exchange.
          std::vector<std::int32_t> gathered(kN);
          w.gather(&mine, gathered.data(), 1, DataType::int32, k % kN)->wait();
          if (me == k % kN) {
            for (int r = 0; r < kN; ++r)
              ASSERT_EQ(gathered[static_cast<size_t>(r)], r * 10 + k % 7);
          }
          std::int32_t from_left = -1;
          const P2POp ring[] = {P2POp::send(&mine, 1, DataType::int32, (me + 1) % kN, k),
                                P2POp::recv(&from_left, 1, DataType::int32, (me + kN - 1) % kN, k)};
          w.batch_isend_irecv(ring)->wait();
          ASSERT_EQ(from_left, ((me + kN - 1) % kN) * 10 + k % 7);
          if (k % 10 == 0) w.barrier()->wait();
        }
      },
      test_options(20s));
}

TEST(GlooDeadline, ABatchWhosePeerSendsSlowlyEndsAtItsDeadline) {
  // Eight receives in one batch from a peer that sends one every 300 ms: each message comes
  // well within the 1 s timeout, the batch as a whole does not; one deadline ends it.
  std::string error;
  double took = 0;
  auto r = run_local_ranks_collect(
      2,
      [&](Communicator& w) {
        std::vector<std::int32_t> v(8, -1);
        w.barrier()->wait();
        if (w.rank() == 1) {
          try {
            for (int k = 0; k < 8; ++k) {
              std::this_thread::sleep_for(300ms);
              v[static_cast<size_t>(k)] = k;
              w.send(&v[static_cast<size_t>(k)], 1, DataType::int32, 0, k)->wait();
            }
          } catch (const std::exception&) {
            // Expected once rank 0 gave up and closed its connections.
          }
          return;
        }
        std::vector<P2POp> batch;
        for (int k = 0; k < 8; ++k)
          batch.push_back(P2POp::recv(&v[static_cast<size_t>(k)], 1, DataType::int32, 1, k));
        const auto t0 = Clock::now();
        try {
          w.batch_isend_irecv(batch)->wait();
        } catch (const TimeoutError& e) { error = e.what(); }
        took = seconds_since(t0);
      },
      test_options(1s));
  EXPECT_EQ(r.first_failed_rank, -1) << r.first_failure;
  EXPECT_NE(error.find("gloo batch_isend_irecv on world: timed out after 1 s"), std::string::npos)
      << error;
  EXPECT_NE(error.find("peer rank 1 (global 1)"), std::string::npos) << error;
  EXPECT_LE(took, 1.0 + 30.0) << "the deadline did not end the batch";
}

TEST(GlooDeadline, RegisteringAnOperationCostsLittle) {
  // The guard of every collective: a lock and an ordered insert, no thread per operation.
  auto context = std::make_shared<::gloo::Context>(0, 1);
  const std::string group = "world";
  constexpr int kTimes = 4000, kRounds = 5;
  // The fastest of five rounds: a round the scheduler interrupts (a loaded machine) does
  // not count.
  double each_us = 1e9;
  for (int round = 0; round < kRounds; ++round) {
    const auto t0 = Clock::now();
    for (int i = 0; i < kTimes; ++i) {
      gloo_backend::DeadlineGuard guard(context, "allreduce", group, 1s);
      ASSERT_FALSE(guard.release());
    }
    each_us = std::min(each_us, seconds_since(t0) * 1e6 / kTimes);
  }
  std::cout << "deadline guard: " << each_us << " us per operation\n";
  // About 0.1 us here, a few under the sanitizers; the bound only catches a gross regression
  // (a thread or a system call per operation) on a loaded machine.
  EXPECT_LT(each_us, 50.0);
}

}  // namespace
}  // namespace commgrid::test
