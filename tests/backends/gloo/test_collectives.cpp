// Every collective and point-to-point call, every dtype and every op, on worlds of 1 to 16
// rank-threads. The results are checked element by element against a local computation.
#include <gtest/gtest.h>

#include <numeric>

#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

class GlooWorld : public ::testing::TestWithParam<int> {};

// The collectives of one world, all in one job so that each world is connected once.
void exercise_collectives(Communicator& w) {
  const int n = w.size(), me = w.rank();
  const size_t count = 5;
  EXPECT_EQ(w.backend(), "gloo");
  EXPECT_EQ(w.name(), "world");
  w.barrier()->wait();

  for (DataType t : kAllTypes) {
    const std::string ctx = std::string(datatype_name(t)) + " on " + std::to_string(n);
    for (ReduceOp op : kAllOps) {
      const std::string c = ctx + " " + std::string(reduce_op_name(op));
      // allreduce, out of place and in place
      Buffer send(t, count), recv(t, count);
      for (size_t i = 0; i < count; ++i) send.set(i, test_value(op, me, i));
      w.allreduce(send.data(), recv.data(), count, t, op)->wait();
      w.allreduce(send.data(), send.data(), count, t, op)->wait();
      for (size_t i = 0; i < count; ++i) {
        double want = test_value(op, 0, i);
        for (int r = 1; r < n; ++r) want = apply(op, want, test_value(op, r, i));
        EXPECT_EQ(recv.get(i), want) << "allreduce " << c << " element " << i;
        EXPECT_EQ(send.get(i), want) << "in-place allreduce " << c << " element " << i;
      }
      // reduce_scatter: block b of rank r holds test_value(op, r, b*count + i)
      Buffer rs_send(t, count * static_cast<size_t>(n)), rs_recv(t, count);
      for (size_t i = 0; i < rs_send.count(); ++i) rs_send.set(i, test_value(op, me, i));
      w.reduce_scatter(rs_send.data(), rs_recv.data(), count, t, op)->wait();
      for (size_t i = 0; i < count; ++i) {
        const size_t at = static_cast<size_t>(me) * count + i;
        double want = test_value(op, 0, at);
        for (int r = 1; r < n; ++r) want = apply(op, want, test_value(op, r, at));
        EXPECT_EQ(rs_recv.get(i), want) << "reduce_scatter " << c << " element " << i;
      }
    }
    // broadcast from the first and the last rank
    for (int root : {0, n - 1}) {
      Buffer b(t, count);
      for (size_t i = 0; i < count; ++i) b.set(i, me == root ? static_cast<double>(root + i) : -1);
      w.broadcast(b.data(), count, t, root)->wait();
      for (size_t i = 0; i < count; ++i)
        EXPECT_EQ(b.get(i), static_cast<double>(root + i))
            << "broadcast " << ctx << " root " << root;
    }
    // allgather: rank r contributes r*10 + i
    Buffer ag_send(t, count), ag_recv(t, count * static_cast<size_t>(n));
    for (size_t i = 0; i < count; ++i) ag_send.set(i, me * 10 + static_cast<double>(i));
    w.allgather(ag_send.data(), ag_recv.data(), count, t)->wait();
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i)
        EXPECT_EQ(ag_recv.get(static_cast<size_t>(r) * count + i), r * 10 + static_cast<double>(i))
            << "allgather " << ctx;
    // alltoall: element i of block j of rank r is (r*16 + j + 37*i) mod 256 (exact in bf16)
    Buffer a_send(t, count * static_cast<size_t>(n)), a_recv(t, count * static_cast<size_t>(n));
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < count; ++i)
        a_send.set(static_cast<size_t>(j) * count + i,
                   static_cast<double>((static_cast<size_t>(me * 16 + j) + 37 * i) % 256));
    w.alltoall(a_send.data(), a_recv.data(), count, t)->wait();
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i)
        EXPECT_EQ(a_recv.get(static_cast<size_t>(r) * count + i),
                  static_cast<double>((static_cast<size_t>(r * 16 + me) + 37 * i) % 256))
            << "alltoall " << ctx << " from rank " << r;
    // send/recv: a token around the ring, rank 0 first so that blocking sends cannot cycle
    if (n > 1) {
      Buffer token(t, count);
      const int next = (me + 1) % n, prev = (me + n - 1) % n;
      if (me == 0) {
        for (size_t i = 0; i < count; ++i) token.set(i, static_cast<double>(i));
        w.send(token.data(), count, t, next, 7)->wait();
        w.recv(token.data(), count, t, prev, 7)->wait();
        for (size_t i = 0; i < count; ++i)
          EXPECT_EQ(token.get(i), static_cast<double>(i) + n - 1) << "ring " << ctx;
      } else {
        w.recv(token.data(), count, t, prev, 7)->wait();
        for (size_t i = 0; i < count; ++i) token.set(i, token.get(i) + 1);
        w.send(token.data(), count, t, next, 7)->wait();
      }
    }
  }
  // A large allreduce crosses Gloo's segment size (several pipelined segments).
  std::vector<float> big(300000, static_cast<float>(me + 1)), out(big.size());
  w.allreduce(big.data(), out.data(), big.size(), DataType::float32, ReduceOp::sum)->wait();
  const float want = static_cast<float>(n * (n + 1) / 2);
  EXPECT_EQ(std::count(out.begin(), out.end(), want), static_cast<long>(out.size()));
  // Zero-element calls are no-ops, not errors.
  w.allreduce(nullptr, nullptr, 0, DataType::int32, ReduceOp::sum)->wait();
  w.barrier()->wait();
}

TEST_P(GlooWorld, EveryCollectiveEveryTypeEveryOp) { run_ranks(GetParam(), exercise_collectives); }

INSTANTIATE_TEST_SUITE_P(Worlds1To16, GlooWorld, ::testing::Range(1, 17),
                         [](const auto& info) { return "w" + std::to_string(info.param); });

TEST(GlooCollectives, Bfloat16IsReducedInFloat32AndRoundedOnce) {
  // bfloat16 inputs whose float32 sum is exact; the result must be that sum rounded once,
  // identical on every rank.
  run_ranks(4, [](Communicator& w) {
    std::uint16_t v = float_to_bf16(1.0f), out = 0;
    w.allreduce(&v, &out, 1, DataType::bfloat16, ReduceOp::sum)->wait();
    EXPECT_EQ(bf16_to_float(out), 4.0f);
    // 3 ranks holding 1/3-ish values: the float32 sum rounded once is what every rank gets.
    float mine = 0.3f + 0.01f * static_cast<float>(w.rank());
    std::uint16_t b = float_to_bf16(mine), r = 0;
    w.allreduce(&b, &r, 1, DataType::bfloat16, ReduceOp::sum)->wait();
    float sum = 0;
    for (int k = 0; k < w.size(); ++k)
      sum += bf16_to_float(float_to_bf16(0.3f + 0.01f * static_cast<float>(k)));
    EXPECT_EQ(r, float_to_bf16(sum));
  });
}

TEST(GlooCollectives, IntegerSumsWrapInsteadOfUndefinedBehaviour) {
  run_ranks(2, [](Communicator& w) {
    std::int32_t v = INT32_MAX, out = 0;
    w.allreduce(&v, &out, 1, DataType::int32, ReduceOp::sum)->wait();
    EXPECT_EQ(out, -2);
    std::int64_t big = INT64_MAX, out64 = 0;
    w.allreduce(&big, &out64, 1, DataType::int64, ReduceOp::max)->wait();
    EXPECT_EQ(out64, INT64_MAX);
  });
}

TEST(GlooCollectives, CallerErrorsNameBackendOperationAndGroup) {
  run_ranks(2, [](Communicator& w) {
    int x = 0;
    try {
      w.broadcast(&x, 1, DataType::int32, 2)->wait();
      ADD_FAILURE() << "broadcast with root 2 of 2 did not throw";
    } catch (const RankOutOfRangeError& e) {
      EXPECT_NE(std::string(e.what()).find("gloo broadcast on world: root 2"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW((void)w.send(&x, 1, DataType::int32, w.rank(), 0), ConfigError);
    EXPECT_THROW((void)w.send(&x, 1, DataType::int32, 1 - w.rank(), -1), ConfigError);
    EXPECT_THROW((void)w.recv(&x, 1, DataType::int32, 5, 0), RankOutOfRangeError);
    EXPECT_THROW((void)w.allgather(nullptr, &x, 1, DataType::int32), ConfigError);
    std::int32_t a[2] = {0, 0};
    EXPECT_THROW((void)w.alltoall(a, a, 1, DataType::int32), ConfigError);
    w.barrier()->wait();  // the world still works after rejected calls
  });
}

}  // namespace
}  // namespace commgrid::test
