// GlooOptions::algorithm: ring, bcube and the automatic choice give the same, exact results
// for allreduce and allgather on rank-threads, at world sizes that are and are not powers of
// two and for counts below and above log2(W), and blocks with zero bytes among them (a bcube
// allgather is a max over zeroed blocks); a bcube wait obeys a timeout raised after the
// world was made; an algorithm out of range is refused by name.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;

GlooOptions with(GlooAlgorithm algorithm) {
  GlooOptions o = test_options();
  o.algorithm = algorithm;
  return o;
}

std::string name_of(GlooAlgorithm a) {
  switch (a) {
    case GlooAlgorithm::automatic: return "automatic";
    case GlooAlgorithm::ring: return "ring";
    case GlooAlgorithm::bcube: return "bcube";
  }
  return "?";
}

struct Case {
  GlooAlgorithm algorithm;
  Rank world;
};

class GlooAlgorithms : public ::testing::TestWithParam<Case> {};

TEST_P(GlooAlgorithms, AllreduceIsExactForEveryOpTypeAndCount) {
  const Case c = GetParam();
  run_ranks(
      c.world,
      [&](Communicator& w) {
        // 1 and 2 elements (fewer than log2 W: ring under automatic), 7, 64 and 3000.
        for (const size_t count : {size_t{1}, size_t{2}, size_t{7}, size_t{64}, size_t{3000}})
          for (const DataType type : {DataType::float32, DataType::int64, DataType::bfloat16})
            for (const ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::prod}) {
              Buffer buf(type, count);
              for (size_t i = 0; i < count; ++i) buf.set(i, test_value(op, w.rank(), i));
              w.allreduce(buf.data(), buf.data(), count, type, op)->wait();
              for (size_t i = 0; i < count; ++i) {
                double want = test_value(op, 0, i);
                for (Rank r = 1; r < w.size(); ++r) want = apply(op, want, test_value(op, r, i));
                ASSERT_EQ(buf.get(i), want)
                    << name_of(c.algorithm) << ", " << count << " elements, element " << i;
              }
            }
      },
      with(c.algorithm));
}

TEST_P(GlooAlgorithms, AllgatherKeepsEveryBlock) {
  const Case c = GetParam();
  run_ranks(
      c.world,
      [&](Communicator& w) {
        const auto W = static_cast<size_t>(w.size());
        for (const size_t block : {size_t{1}, size_t{13}, size_t{4096}}) {
          // Bytes of every value, zero among them (a max over zeroed blocks must keep it).
          auto value = [&](size_t r, size_t i) {
            return static_cast<std::uint8_t>((r * 31 + i * 7) % 256);
          };
          std::vector<std::uint8_t> mine(block), all(block * W, 0xAB);
          for (size_t i = 0; i < block; ++i) mine[i] = value(static_cast<size_t>(w.rank()), i);
          w.allgather(std::span<const std::uint8_t>(mine), std::span<std::uint8_t>(all))->wait();
          for (size_t r = 0; r < W; ++r)
            for (size_t i = 0; i < block; ++i)
              ASSERT_EQ(all[r * block + i], value(r, i))
                  << name_of(c.algorithm) << ", block " << block << ", rank " << r;
        }
      },
      with(c.algorithm));
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, GlooAlgorithms,
    ::testing::Values(Case{GlooAlgorithm::ring, 3}, Case{GlooAlgorithm::bcube, 3},
                      Case{GlooAlgorithm::bcube, 4}, Case{GlooAlgorithm::bcube, 6},
                      Case{GlooAlgorithm::automatic, 7}, Case{GlooAlgorithm::automatic, 8}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return name_of(info.param.algorithm) + "_" + std::to_string(info.param.world);
    });

TEST(GlooAlgorithmTimeout, ABcubeWaitObeysATimeoutRaisedAfterTheWorldWasMade) {
  // The world is made with a 4 s timeout, then given 60 s; rank 0 joins the allreduce 6 s
  // late. Gloo's bcube waits take their context's timeout, so they must see the raised one
  // (with the creation's 4 s the others would time out).
  GlooOptions o = with(GlooAlgorithm::bcube);
  o.timeout = 4s;
  run_ranks(
      4,
      [&](Communicator& w) {
        w.set_timeout(60s);
        if (w.rank() == 0) std::this_thread::sleep_for(6s);
        std::vector<std::int64_t> v(64, w.rank() + 1);
        w.allreduce(std::span<std::int64_t>(v), ReduceOp::sum)->wait();
        for (const std::int64_t x : v) ASSERT_EQ(x, 1 + 2 + 3 + 4);
      },
      o);
}

TEST(GlooAlgorithmOption, AnAlgorithmOutOfRangeIsRefusedByName) {
  GlooOptions o = placed(make_memory_store(), 0, 1, test_options());
  o.algorithm = static_cast<GlooAlgorithm>(7);
  try {
    (void)make_gloo_world(o);
    FAIL() << "an algorithm out of range was accepted";
  } catch (const InvalidValueError& e) {
    EXPECT_EQ(e.parameter(), "algorithm");
    EXPECT_NE(std::string(e.what()).find("algorithm 7"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace commgrid::test
