// The runtime without a backend: the one fingerprint, the reduction kernels every backend
// shares, the Communicator contract's argument checks (a refused call never reaches the
// backend), and ProcessGroups::initialize on a world too large to enumerate.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/process_groups.hpp"
#include "fingerprint.hpp"
#include "reduce_util.hpp"

namespace commgrid {
namespace {

TEST(Fingerprint, IsSixtyFourBitFnv1a) {
  // The published FNV-1a test values: the empty input is the offset basis.
  EXPECT_EQ(detail::fingerprint(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(detail::fingerprint("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(detail::fingerprint("foobar"), 0x85944171f73967e8ULL);
  // Fed in pieces, the same as fed at once.
  EXPECT_EQ(detail::Fingerprint().text("foo").text("bar").value(), detail::fingerprint("foobar"));
  EXPECT_GE(detail::Fingerprint().text("foobar").value63(), 0);
}

TEST(Fingerprint, SeparatesNamesAndMembers) {
  const std::vector<Rank> a = {0, 1}, b = {0, 2};
  std::set<std::uint64_t> seen = {detail::group_fingerprint(a, "tp#0"),
                                  detail::group_fingerprint(b, "tp#0"),
                                  detail::group_fingerprint(a, "tp#1")};
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(detail::group_fingerprint(a, "tp#0"), detail::group_fingerprint(a, "tp#0"));
}

TEST(ReduceKernels, IntegersWrapAndFloatMaxMinKeepNaN) {
  using detail::combine;
  EXPECT_EQ((combine<ReduceOp::sum, std::int8_t>(127, 1)), std::int8_t{-128});
  EXPECT_EQ((combine<ReduceOp::prod, std::int32_t>(1 << 30, 4)), 0);
  EXPECT_EQ((combine<ReduceOp::sum, std::uint8_t>(255, 2)), std::uint8_t{1});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(combine<ReduceOp::max>(nan, 1.0f)));
  EXPECT_TRUE(std::isnan(combine<ReduceOp::max>(1.0f, nan)));
  EXPECT_TRUE(std::isnan(combine<ReduceOp::min>(nan, 1.0f)));
  EXPECT_TRUE(std::isnan(combine<ReduceOp::min>(1.0f, nan)));
  EXPECT_EQ(combine<ReduceOp::max>(2.0, 3.0), 3.0);
  EXPECT_EQ(combine<ReduceOp::min>(2.0, 3.0), 2.0);
}

TEST(ReduceKernels, BlocksReduceInRankOrderWithAvg) {
  // Three ranks' blocks of two int32: sum, max, avg (truncating).
  const std::vector<std::int32_t> blocks = {1, 10, 2, 20, 4, 31};
  std::vector<std::int32_t> out(2);
  detail::reduce_blocks(blocks.data(), out.data(), 2, DataType::int32, ReduceOp::sum, 3);
  EXPECT_EQ(out, (std::vector<std::int32_t>{7, 61}));
  detail::reduce_blocks(blocks.data(), out.data(), 2, DataType::int32, ReduceOp::max, 3);
  EXPECT_EQ(out, (std::vector<std::int32_t>{4, 31}));
  detail::reduce_blocks(blocks.data(), out.data(), 2, DataType::int32, ReduceOp::avg, 3);
  EXPECT_EQ(out, (std::vector<std::int32_t>{2, 20}));
  // bfloat16: reduced in float32 and rounded once. 1 + 2^-8 + 2^-8 = 1 + 2^-7 is a bfloat16;
  // rounding after each step would round 1 + 2^-8 to even (1) twice and give 1.
  const std::vector<std::uint16_t> halves = {float_to_bf16(1.0f), float_to_bf16(0.00390625f),
                                             float_to_bf16(0.00390625f)};
  std::uint16_t r = 0;
  detail::reduce_blocks(halves.data(), &r, 1, DataType::bfloat16, ReduceOp::sum, 3);
  EXPECT_EQ(bf16_to_float(r), 1.0078125f);
}

// A communicator whose backend only counts the calls that reach it.
class CountingComm final : public Communicator {
 public:
  explicit CountingComm(int size) : Communicator("count#0", kDefaultTimeout), size_(size) {}
  [[nodiscard]] std::string_view backend() const noexcept override { return "counting"; }
  [[nodiscard]] Rank rank() const noexcept override { return 0; }
  [[nodiscard]] Rank size() const noexcept override { return size_; }
  int reached = 0;

 protected:
  std::unique_ptr<Communicator> do_split(std::optional<std::int64_t>, std::int64_t,
                                         std::string) override {
    return hit<Communicator>();
  }
  std::unique_ptr<Communicator> do_create_group(std::span<const Rank>, std::string) override {
    return hit<Communicator>();
  }
  std::unique_ptr<Communicator> do_create_group_collective(std::span<const Rank>,
                                                           std::string) override {
    return hit<Communicator>();
  }
  std::unique_ptr<Work> do_barrier() override { return work(); }
  std::unique_ptr<Work> do_broadcast(void*, std::size_t, DataType, Rank) override { return work(); }
  std::unique_ptr<Work> do_allreduce(const void*, void*, std::size_t, DataType, ReduceOp) override {
    return work();
  }
  std::unique_ptr<Work> do_allgather(const void*, void*, std::size_t, DataType) override {
    return work();
  }
  std::unique_ptr<Work> do_reduce_scatter(const void*, void*, std::size_t, DataType,
                                          ReduceOp) override {
    return work();
  }
  std::unique_ptr<Work> do_alltoall(const void*, void*, std::size_t, DataType) override {
    return work();
  }
  std::unique_ptr<Work> do_alltoallv(const void*, std::span<const std::size_t>, void*,
                                     std::span<const std::size_t>, DataType) override {
    return work();
  }
  std::unique_ptr<Work> do_allgatherv(const void*, std::size_t, void*, std::span<const std::size_t>,
                                      DataType) override {
    return work();
  }
  std::unique_ptr<Work> do_reduce(const void*, void*, std::size_t, DataType, ReduceOp,
                                  Rank) override {
    return work();
  }
  std::unique_ptr<Work> do_gather(const void*, void*, std::size_t, DataType, Rank) override {
    return work();
  }
  std::unique_ptr<Work> do_scatter(const void*, void*, std::size_t, DataType, Rank) override {
    return work();
  }
  std::unique_ptr<Work> do_batch_isend_irecv(std::span<const P2POp>, std::string_view) override {
    return work();
  }

 private:
  template <class T>
  std::unique_ptr<T> hit() {
    ++reached;
    return nullptr;
  }
  std::unique_ptr<Work> work() {
    ++reached;
    return std::make_unique<Work>();
  }
  int size_;
};

TEST(CommunicatorContract, RefusedCallsNeverReachTheBackendAndValidOnesDo) {
  CountingComm c(4);
  std::int64_t buf[16] = {};
  EXPECT_THROW((void)c.allreduce(nullptr, buf, 1, DataType::int64, ReduceOp::sum), ConfigError);
  EXPECT_THROW((void)c.broadcast(buf, 1, DataType::int64, 4), RankOutOfRangeError);
  // Ranks are 64-bit: one that an int would wrap into the group is still out of range.
  EXPECT_THROW((void)c.broadcast(buf, 1, DataType::int64, Rank{1} << 32), RankOutOfRangeError);
  EXPECT_THROW((void)c.isend(buf, 1, DataType::int64, (Rank{1} << 32) + 1, 0), RankOutOfRangeError);
  EXPECT_THROW((void)c.isend(buf, 1, DataType::int64, 1, -1), InvalidValueError);
  EXPECT_THROW((void)c.allgather(buf + 2, buf, 1, DataType::int64),
               ConfigError);  // recv covers send
  EXPECT_THROW((void)c.split(std::int64_t{1} << 31, 0, "x#0"), InvalidValueError);
  const Rank backwards[] = {2, 1};
  EXPECT_THROW((void)c.create_group_collective(backwards, "x#0"), ConfigError);
  EXPECT_EQ(c.reached, 0);
  EXPECT_EQ(c.creation_calls(), 0);
  // In place and disjoint buffers are fine; empty buffers may be null.
  (void)c.allreduce(buf, buf, 2, DataType::int64, ReduceOp::sum);
  (void)c.allgather(buf, buf + 1, 1, DataType::int64);
  (void)c.alltoall(nullptr, nullptr, 0, DataType::int64);
  (void)c.isend(buf, 1, DataType::int64, 0, 7);  // to itself: fine when nonblocking
  const P2POp apart[] = {P2POp::send(buf, 2, DataType::int64, 1),
                         P2POp::send(buf + 1, 2, DataType::int64, 2),
                         P2POp::recv(buf + 3, 2, DataType::int64, 3)};
  (void)c.batch_isend_irecv(apart);  // sends may share memory; the receive does not
  (void)c.split(std::int64_t{3}, -5, "x#3");
  EXPECT_EQ(c.reached, 6);
  EXPECT_EQ(c.creation_calls(), 1);
  // Large batches (sorted and swept rather than compared pairwise): twelve operations, the
  // last receive overlapping the seventh send only.
  std::int64_t big[64] = {};
  std::vector<P2POp> many;
  for (int i = 0; i < 11; ++i) many.push_back(P2POp::send(big + 4 * i, 3, DataType::int64, 1));
  many.push_back(P2POp::recv(big + 3 * 4 + 2, 1, DataType::int64, 2));  // inside send 3
  try {
    (void)c.batch_isend_irecv(many);
    FAIL() << "a receive inside a send's buffer must throw";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.parameter(), "buf");
    EXPECT_NE(std::string(e.what()).find("operations 3 and 11"), std::string::npos) << e.what();
  }
  many.back() = P2POp::recv(big + 3 * 4 + 3, 1, DataType::int64, 2);  // the gap after send 3
  (void)c.batch_isend_irecv(many);
  EXPECT_EQ(c.reached, 7);
  try {
    (void)c.reduce(buf, buf + 1, 2, DataType::int64, ReduceOp::sum, 0);
    FAIL() << "overlapping reduce on root must throw";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.parameter(), "recv");
    EXPECT_STREQ(e.what(),
                 "counting reduce on count#0: send and recv buffers overlap; pass the "
                 "very same buffer (in place) or two that do not");
  }
}

// One rank of a world of any size whose every other rank agrees: a collective leaves this
// rank's data as it is (as if every rank had sent the same), and create_group gives a
// group of the members' size with this rank at its position. So ProcessGroups runs its real
// code for one rank of 2^30 without 2^30 of anything.
class AgreeingWorld final : public Communicator {
 public:
  AgreeingWorld(std::string name, int rank, int size)
      : Communicator(std::move(name), kDefaultTimeout), rank_(rank), size_(size) {}
  [[nodiscard]] std::string_view backend() const noexcept override { return "agreeing"; }
  [[nodiscard]] Rank rank() const noexcept override { return rank_; }
  [[nodiscard]] Rank size() const noexcept override { return size_; }
  std::int64_t largest_group = 0;

 protected:
  std::unique_ptr<Communicator> do_create_group(std::span<const Rank> members,
                                                std::string name) override {
    largest_group =
        std::max<std::int64_t>(largest_group, static_cast<std::int64_t>(members.size()));
    const auto at = std::lower_bound(members.begin(), members.end(), rank_) - members.begin();
    return std::make_unique<AgreeingWorld>(std::move(name), static_cast<int>(at),
                                           static_cast<int>(members.size()));
  }
  std::unique_ptr<Work> do_allreduce(const void* send, void* recv, std::size_t count, DataType type,
                                     ReduceOp) override {
    if (send != recv) std::memcpy(recv, send, count * element_size(type));
    return std::make_unique<Work>();
  }
  std::unique_ptr<Communicator> do_split(std::optional<std::int64_t>, std::int64_t,
                                         std::string) override {
    return none();
  }
  std::unique_ptr<Communicator> do_create_group_collective(std::span<const Rank>,
                                                           std::string) override {
    return none();
  }
  std::unique_ptr<Work> do_barrier() override { return std::make_unique<Work>(); }
  std::unique_ptr<Work> do_broadcast(void*, std::size_t, DataType, Rank) override { return fail(); }
  std::unique_ptr<Work> do_allgather(const void*, void*, std::size_t, DataType) override {
    return fail();
  }
  std::unique_ptr<Work> do_reduce_scatter(const void*, void*, std::size_t, DataType,
                                          ReduceOp) override {
    return fail();
  }
  std::unique_ptr<Work> do_alltoall(const void*, void*, std::size_t, DataType) override {
    return fail();
  }
  std::unique_ptr<Work> do_alltoallv(const void*, std::span<const std::size_t>, void*,
                                     std::span<const std::size_t>, DataType) override {
    return fail();
  }
  std::unique_ptr<Work> do_allgatherv(const void*, std::size_t, void*, std::span<const std::size_t>,
                                      DataType) override {
    return fail();
  }
  std::unique_ptr<Work> do_reduce(const void*, void*, std::size_t, DataType, ReduceOp,
                                  Rank) override {
    return fail();
  }
  std::unique_ptr<Work> do_gather(const void*, void*, std::size_t, DataType, Rank) override {
    return fail();
  }
  std::unique_ptr<Work> do_scatter(const void*, void*, std::size_t, DataType, Rank) override {
    return fail();
  }
  std::unique_ptr<Work> do_batch_isend_irecv(std::span<const P2POp>, std::string_view) override {
    return fail();
  }

 private:
  static std::unique_ptr<Communicator> none() {
    throw BackendError("agreeing: only create_group here");
  }
  static std::unique_ptr<Work> fail() { throw BackendError("agreeing: only allreduce here"); }
  int rank_, size_;
};

TEST(ProcessGroupsScale, InitializeOnOneRankOfTwoToTheThirtyNeverEnumeratesTheWorld) {
  // tp 8 x cp 2 x pp 8 x dp 2^23, ep 8: every kind below has at most 128 members, so the
  // member strategy's work is O(sum of this rank's group sizes); listing any kind's groups
  // would touch 2^30 ranks (gigabytes, minutes), and a world-sized allgather would fail
  // here (the fake world has none).
  ParallelConfig c;
  c.world_size = std::int64_t{1} << 30;
  c.tp = 8;
  c.cp = 2;
  c.pp = 8;
  c.ep = 8;
  InitOptions o;
  o.strategy = CreationStrategy::member;
  o.kinds = {GroupKind::tp,       GroupKind::pp,    GroupKind::mp,      GroupKind::embd,
             GroupKind::pos_embd, GroupKind::cp,    GroupKind::tp_cp,   GroupKind::ep,
             GroupKind::expt_tp,  GroupKind::tp_ep, GroupKind::tp_ep_pp};
  for (const int rank : {0, 123456789, (1 << 30) - 1}) {
    AgreeingWorld world("world", rank, 1 << 30);
    ProcessGroups pg;
    const auto t0 = std::chrono::steady_clock::now();
    pg.initialize(world, c, o);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(pg.world_rank(), rank);
    EXPECT_EQ(pg.size(GroupKind::tp), 8);
    EXPECT_EQ(pg.size(GroupKind::tp_ep_pp), 512);
    EXPECT_EQ(world.largest_group, 512);
    // Generous: milliseconds when nothing is enumerated; enumerating takes minutes.
    EXPECT_LT(seconds, 30.0) << "rank " << rank;
  }
}

}  // namespace
}  // namespace commgrid
