// MpiCommunicator on real processes: every collective on every type, group creation, the
// errors and the timeouts. Assertions hold for any world size.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>
#include <set>
#include <thread>

#include "commgrid/group_kind.hpp"
#include "commgrid/mpi.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<MpiCommunicator> make_world(std::chrono::milliseconds timeout = 60s) {
  return make_mpi_world({.timeout = timeout});
}

// A value per rank and element, exactly representable in every type (bfloat16 included).
double value(int rank, std::size_t i) {
  return static_cast<double>(rank + 1 + static_cast<int>(i % 3));
}

// Buffers of any DataType, filled from doubles and read back as doubles.
struct Buffer {
  DataType type;
  std::vector<std::uint8_t> bytes;
  Buffer(DataType t, std::size_t n) : type(t), bytes(n * element_size(t)) {}
  void* data() { return bytes.data(); }
  [[nodiscard]] std::size_t size() const { return bytes.size() / element_size(type); }
  void set(std::size_t i, double v) {
    switch (type) {
      case DataType::float32: reinterpret_cast<float*>(data())[i] = static_cast<float>(v); break;
      case DataType::float64: reinterpret_cast<double*>(data())[i] = v; break;
      case DataType::bfloat16:
        reinterpret_cast<std::uint16_t*>(data())[i] = float_to_bf16(static_cast<float>(v));
        break;
      case DataType::int32:
        reinterpret_cast<std::int32_t*>(data())[i] = static_cast<std::int32_t>(v);
        break;
      case DataType::int64:
        reinterpret_cast<std::int64_t*>(data())[i] = static_cast<std::int64_t>(v);
        break;
      case DataType::float16:
        reinterpret_cast<std::uint16_t*>(data())[i] = float_to_fp16(static_cast<float>(v));
        break;
      case DataType::int8:
        reinterpret_cast<std::int8_t*>(data())[i] = static_cast<std::int8_t>(v);
        break;
      case DataType::uint8:
        reinterpret_cast<std::uint8_t*>(data())[i] = static_cast<std::uint8_t>(v);
        break;
    }
  }
  double get(std::size_t i) {
    switch (type) {
      case DataType::float32: return reinterpret_cast<float*>(data())[i];
      case DataType::float64: return reinterpret_cast<double*>(data())[i];
      case DataType::bfloat16: return bf16_to_float(reinterpret_cast<std::uint16_t*>(data())[i]);
      case DataType::int32: return reinterpret_cast<std::int32_t*>(data())[i];
      case DataType::int64: return static_cast<double>(reinterpret_cast<std::int64_t*>(data())[i]);
      case DataType::float16: return fp16_to_float(reinterpret_cast<std::uint16_t*>(data())[i]);
      case DataType::int8: return reinterpret_cast<std::int8_t*>(data())[i];
      case DataType::uint8: return reinterpret_cast<std::uint8_t*>(data())[i];
    }
    return NAN;
  }
};

constexpr DataType kTypes[] = {DataType::float32, DataType::float64, DataType::bfloat16,
                               DataType::int32, DataType::int64};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::prod};

double reduce_expected(ReduceOp op, int n, std::size_t i) {
  double acc = value(0, i);
  for (int r = 1; r < n; ++r) {
    const double v = value(r, i);
    switch (op) {
      case ReduceOp::sum: acc += v; break;
      case ReduceOp::max: acc = std::max(acc, v); break;
      case ReduceOp::min: acc = std::min(acc, v); break;
      case ReduceOp::prod: acc *= v; break;
      case ReduceOp::avg: acc += v; break;  // divided below
    }
  }
  return op == ReduceOp::avg ? acc / n : acc;
}

// Products grow fast; keep them inside what bfloat16 (8 significant bits) and int32 hold.
bool exact(DataType t, ReduceOp op, int n) {
  if (op != ReduceOp::prod) return true;
  if (t == DataType::bfloat16) return n <= 2;  // (1..3)*(2..4) <= 12: exact in 8 bits
  return n <= 8;
}

TEST(MpiCommunicator, TheFactoryAndTheEnvironmentRefuseATimeoutOfZero) {
  try {
    (void)make_mpi_world({.timeout = 0ms});
    ADD_FAILURE() << "no error";
  } catch (const InvalidValueError& e) { EXPECT_EQ(e.parameter(), "timeout") << e.what(); }
  // Checked before MPI is asked anything (MPI is already initialized here).
  try {
    const MpiEnvironment env(MpiThreadSupport::serialized, -1ms);
    ADD_FAILURE() << "no error";
  } catch (const InvalidValueError& e) { EXPECT_EQ(e.parameter(), "init_timeout") << e.what(); }
}

TEST(MpiCommunicator, IdentityMatchesMpiCommWorld) {
  auto world = make_world();
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(world->rank(), rank);
  EXPECT_EQ(world->size(), size);
  EXPECT_EQ(world->backend(), "mpi");
  EXPECT_EQ(world->name(), "world");
  EXPECT_EQ(world->timeout(), 60s);
  EXPECT_EQ(world->creation_calls(), 0);
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(world->native(), MPI_COMM_WORLD, &cmp);
  EXPECT_EQ(cmp, MPI_CONGRUENT) << "world() must be a duplicate, not MPI_COMM_WORLD itself";
  world->barrier()->wait();
}

TEST(MpiCommunicator, AllreduceEveryTypeAndOp) {
  auto world = make_world();
  const Rank n = world->size(), me = world->rank();
  constexpr std::size_t count = 5;
  for (DataType t : kTypes)
    for (ReduceOp op : kOps) {
      Buffer send(t, count), recv(t, count), inplace(t, count);
      for (std::size_t i = 0; i < count; ++i) {
        send.set(i, value(me, i));
        inplace.set(i, value(me, i));
      }
      auto work = world->allreduce(send.data(), recv.data(), count, t, op);
      EXPECT_TRUE(work->done());
      work->wait();
      world->allreduce(inplace.data(), inplace.data(), count, t, op)->wait();  // send == recv
      if (!exact(t, op, n)) continue;
      for (std::size_t i = 0; i < count; ++i) {
        EXPECT_EQ(recv.get(i), reduce_expected(op, n, i))
            << datatype_name(t) << " " << reduce_op_name(op) << " element " << i;
        EXPECT_EQ(inplace.get(i), reduce_expected(op, n, i))
            << "in place: " << datatype_name(t) << " " << reduce_op_name(op);
      }
    }
}

TEST(MpiCommunicator, Bfloat16ReducesInFloat32ArithmeticAndKeepsNaN) {
  // 1 + 2^-7 is the bfloat16 after 1. Two ranks contribute it and the rest 1: each step of
  // the reduction computes in float32 and rounds to bfloat16, so the result is within one
  // rounding per step of the exact sum.
  auto world = make_world();
  const Rank n = world->size(), me = world->rank();
  const float mine = me < 2 ? 1.0f + 0x1p-7f : 1.0f;
  std::uint16_t v = float_to_bf16(mine);
  ASSERT_EQ(bf16_to_float(v), mine);
  world->allreduce(&v, &v, 1, DataType::bfloat16, ReduceOp::sum)->wait();
  const float exact_sum = static_cast<float>(n) + (n >= 2 ? 2 * 0x1p-7f : 0x1p-7f);
  EXPECT_NEAR(bf16_to_float(v), exact_sum, static_cast<float>(n) * exact_sum * 0x1p-8f);
  // max keeps NaN visible.
  std::uint16_t nan_or_one = me == n - 1 ? float_to_bf16(NAN) : float_to_bf16(1.0f);
  world->allreduce(&nan_or_one, &nan_or_one, 1, DataType::bfloat16, ReduceOp::max)->wait();
  EXPECT_TRUE(std::isnan(bf16_to_float(nan_or_one)));
}

TEST(MpiCommunicator, BroadcastAllgatherReduceScatterAlltoallEveryType) {
  auto world = make_world();
  const Rank n = world->size(), me = world->rank();
  const auto un = static_cast<std::size_t>(n);
  constexpr std::size_t count = 3;
  for (DataType t : kTypes) {
    SCOPED_TRACE(std::string(datatype_name(t)));
    // broadcast from the last rank
    Buffer b(t, count);
    for (std::size_t i = 0; i < count; ++i) b.set(i, me == n - 1 ? value(n - 1, i) : -1);
    world->broadcast(b.data(), count, t, n - 1)->wait();
    for (std::size_t i = 0; i < count; ++i) EXPECT_EQ(b.get(i), value(n - 1, i));

    // allgather: block r holds rank r's values
    Buffer send(t, count), all(t, count * un);
    for (std::size_t i = 0; i < count; ++i) send.set(i, value(me, i));
    world->allgather(send.data(), all.data(), count, t)->wait();
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < count; ++i)
        EXPECT_EQ(all.get(static_cast<std::size_t>(r) * count + i), value(r, i));

    // reduce_scatter (sum): block j of every rank's send is value(rank, j); rank me keeps
    // the sum over ranks of value(rank, me).
    Buffer rs_send(t, count * un), rs_recv(t, count);
    for (std::size_t j = 0; j < un; ++j)
      for (std::size_t i = 0; i < count; ++i) rs_send.set(j * count + i, value(me, j));
    world->reduce_scatter(rs_send.data(), rs_recv.data(), count, t, ReduceOp::sum)->wait();
    for (std::size_t i = 0; i < count; ++i)
      EXPECT_EQ(rs_recv.get(i), reduce_expected(ReduceOp::sum, n, static_cast<std::size_t>(me)));

    // alltoall: block j sent to rank j is 100*me + j; block i received is 100*i + me.
    Buffer a_send(t, count * un), a_recv(t, count * un);
    for (std::size_t j = 0; j < un; ++j)
      for (std::size_t i = 0; i < count; ++i)
        a_send.set(j * count + i, (me % 2) * 2 + static_cast<double>(j % 4));
    world->alltoall(a_send.data(), a_recv.data(), count, t)->wait();
    for (int src = 0; src < n; ++src)
      for (std::size_t i = 0; i < count; ++i)
        EXPECT_EQ(a_recv.get(static_cast<std::size_t>(src) * count + i),
                  (src % 2) * 2 + static_cast<double>(me % 4));
  }
}

TEST(MpiCommunicator, SendRecvRingEveryType) {
  auto world = make_world();
  const Rank n = world->size(), me = world->rank();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  for (DataType t : kTypes) {
    Buffer out(t, 4), in(t, 4);
    for (std::size_t i = 0; i < 4; ++i) out.set(i, value(me, i));
    // Even ranks send first: a ring that cannot deadlock for any n (odd n: the last rank is
    // even and its successor 0 is even too, but 0 posts its receive after its send, which
    // completes eagerly for 4 elements).
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    if (me % 2 == 0) {
      world->send(out.data(), 4, t, next, 3)->wait();
      world->recv(in.data(), 4, t, prev, 3)->wait();
    } else {
      world->recv(in.data(), 4, t, prev, 3)->wait();
      world->send(out.data(), 4, t, next, 3)->wait();
    }
    for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(in.get(i), value(prev, i)) << datatype_name(t);
  }
}

TEST(MpiCommunicator, ErrorsNameBackendOperationAndGroup) {
  auto world = make_world();
  const Rank n = world->size(), me = world->rank();
  std::int64_t x = 1, y[2] = {0, 0};
  try {
    (void)world->send(&x, 1, DataType::int64, n, 0);
    FAIL() << "send to rank n must throw";
  } catch (const RankOutOfRangeError& e) {  // the contract's error, as on every backend
    EXPECT_STREQ(e.what(), ("mpi send on world: peer " + std::to_string(n) + " is not in [0, " +
                            std::to_string(n) + ")")
                               .c_str());
  }
  EXPECT_THROW((void)world->broadcast(&x, 1, DataType::int64, -1), RankOutOfRangeError);
  EXPECT_THROW((void)world->send(&x, 1, DataType::int64, 0, -5), InvalidValueError);
  EXPECT_THROW((void)world->allreduce(nullptr, &x, 1, DataType::int64, ReduceOp::sum), ConfigError);
  try {
    (void)world->allgather(&x, &x, 1, DataType::int64);
    FAIL() << "aliased allgather must throw";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("only allreduce allows that"), std::string::npos)
        << e.what();
  }
  if (n >= 2) {
    // Too long a message: MPI's own MPI_ERR_TRUNCATE text comes through.
    if (me == 0) {
      world->send(y, 2, DataType::int64, 1, 11)->wait();
      world->send(y, 1, DataType::int64, 1, 12)->wait();
    } else if (me == 1) {
      try {
        (void)world->recv(&x, 1, DataType::int64, 0, 11);
        ADD_FAILURE() << "receiving 2 elements into 1 must throw";
      } catch (const BackendError& e) {
        EXPECT_EQ(std::string(e.what()).rfind("mpi recv on world: ", 0), 0u) << e.what();
        EXPECT_NE(std::string(e.what()).find("TRUNCATE"), std::string::npos) << e.what();
      }
      // Too short a message.
      try {
        (void)world->recv(y, 2, DataType::int64, 0, 12);
        ADD_FAILURE() << "receiving 1 element where 2 were expected must throw";
      } catch (const BackendError& e) {
        EXPECT_NE(
            std::string(e.what()).find("received 1 elements of int64 from rank 0, expected 2"),
            std::string::npos)
            << e.what();
      }
    }
  }
  world->barrier()->wait();
}

TEST(MpiCommunicator, SplitOrdersByKeyAndGivesNullWithoutColor) {
  auto world = make_world();
  const Rank n = world->size(), me = world->rank();
  // Rank 0 takes part without a color; the others split by parity, ordered backwards.
  const std::optional<std::int64_t> color =
      me == 0 ? std::nullopt : std::optional<std::int64_t>(me % 2);
  auto sub = world->split(color, -me, "parity#" + std::to_string(me % 2));
  EXPECT_EQ(world->creation_calls(), 1);
  if (me == 0) {
    EXPECT_EQ(sub, nullptr);
  } else {
    ASSERT_NE(sub, nullptr);
    std::vector<Rank> members;
    for (Rank r = 1; r < n; ++r)
      if (r % 2 == me % 2) members.push_back(r);
    EXPECT_EQ(sub->size(), static_cast<int>(members.size()));
    // key = -rank: the highest rank comes first
    const auto pos = std::find(members.rbegin(), members.rend(), me) - members.rbegin();
    EXPECT_EQ(sub->rank(), static_cast<int>(pos));
    EXPECT_EQ(sub->name(), "parity#" + std::to_string(me % 2));
    EXPECT_EQ(sub->timeout(), world->timeout()) << "a new group starts with its parent's timeout";
    std::int64_t sum = me;
    sub->allreduce(&sum, &sum, 1, DataType::int64, ReduceOp::sum)->wait();
    EXPECT_EQ(sum, std::accumulate(members.begin(), members.end(), std::int64_t{0}));
  }
  EXPECT_THROW((void)world->split(std::int64_t{-1}, 0, "bad"), InvalidValueError);
}

TEST(MpiCommunicator, CreateGroupOnlyMembersAndCollectiveEveryone) {
  auto world = make_world();
  const Rank n = world->size(), me = world->rank();
  std::vector<Rank> evens, odds;
  for (Rank r = 0; r < n; ++r) (r % 2 == 0 ? evens : odds).push_back(r);
  const auto& mine = me % 2 == 0 ? evens : odds;
  auto g = world->create_group(mine, std::string(me % 2 == 0 ? "evens" : "odds") + "#0");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->size(), static_cast<int>(mine.size()));
  EXPECT_EQ(g->rank(), me / 2);
  EXPECT_EQ(world->creation_calls(), 1);
  std::int64_t sum = me;
  g->allreduce(&sum, &sum, 1, DataType::int64, ReduceOp::sum)->wait();
  EXPECT_EQ(sum, std::accumulate(mine.begin(), mine.end(), std::int64_t{0}));

  auto c = world->create_group_collective(evens, "evens#1");
  EXPECT_EQ(world->creation_calls(), 2);
  EXPECT_EQ(c != nullptr, me % 2 == 0);
  if (c) { EXPECT_EQ(c->size(), static_cast<int>(evens.size())); }

  // Callers' mistakes are reported before MPI sees them.
  if (n >= 2) {
    const std::vector<Rank> others = me % 2 == 0 ? odds : evens;
    EXPECT_THROW((void)world->create_group(others, "others#0"), ConfigError) << "not a member";
    const std::vector<Rank> backwards = {1, 0};
    EXPECT_THROW((void)world->create_group_collective(backwards, "backwards#0"), ConfigError);
  }
  world->barrier()->wait();
}

TEST(MpiCommunicator, CreateGroupTagsOfCommgridKindsAreDistinct) {
  // Groups of one kind share a tag (they are disjoint); different kinds must not, even
  // with the smallest tag bound MPI allows.
  for (int ub : {32767, INT_MAX}) {
    std::set<int> tags;
    std::size_t labels = 0;
    for (GroupKind k : all_kinds()) {
      std::vector<std::string> names;
      if (k == GroupKind::hcp)
        for (int l = 0; l < 8; ++l) names.push_back("hcp[" + std::to_string(l) + "]#0");
      else names.push_back(std::string(kind_name(k)) + "#0");
      for (const auto& name : names) {
        const int tag = mpi_create_group_tag(name, ub);
        EXPECT_GE(tag, 0);
        EXPECT_LE(tag, ub);
        EXPECT_EQ(tag, mpi_create_group_tag(name.substr(0, name.find('#')) + "#12345", ub));
        tags.insert(tag);
        ++labels;
      }
    }
    EXPECT_EQ(tags.size(), labels) << "tag bound " << ub;
  }
}

TEST(MpiCommunicator, RecvTimeoutIsCancelledAndLeavesTheCommunicatorUsable) {
  auto world = make_world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  auto comm = MpiCommunicator::duplicate(world->native(), "recv-timeout", 200ms);
  if (comm->rank() == 0) {
    std::int64_t x = 0;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      (void)comm->recv(&x, 1, DataType::int64, 1, 99);
      ADD_FAILURE() << "nobody sends: recv must time out";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "mpi recv on recv-timeout: no message from rank 1 with tag 99 within 200 ms"),
                std::string::npos)
          << e.what();
    }
    const auto waited = std::chrono::steady_clock::now() - t0;
    EXPECT_GE(waited, 200ms);  // the timeout guarantees it
    EXPECT_LT(waited, 30s) << "the timeout did not bound the receive";
  }
  comm->set_timeout(30s);
  comm->barrier()->wait();  // still usable
}

TEST(MpiCommunicator, CollectiveTimeoutNamesTheGroupAndBreaksTheCommunicator) {
  auto world = make_world();
  if (world->size() < 2) GTEST_SKIP() << "needs two ranks";
  auto comm = MpiCommunicator::duplicate(world->native(), "late#0", 30s);
  // MPI keeps using rank 0's buffers until the late ranks arrive: they must outlive it.
  static std::int64_t in = 1, out = 0;
  if (comm->rank() == 0) {
    comm->set_timeout(300ms);
    try {
      (void)comm->allreduce(&in, &out, 1, DataType::int64, ReduceOp::sum);
      ADD_FAILURE() << "the others are late: allreduce must time out";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("mpi allreduce on late#0: timed out after 300 ms"),
                std::string::npos)
          << e.what();
      // MPI cannot know who is missing, and the message says so instead of guessing.
      EXPECT_NE(std::string(e.what()).find("MPI cannot tell which"), std::string::npos) << e.what();
    }
    try {
      (void)comm->barrier();
      ADD_FAILURE() << "a timed-out communicator must refuse further calls";
    } catch (const BackendError& e) {
      EXPECT_NE(std::string(e.what()).find("unusable after an earlier timeout"), std::string::npos)
          << e.what();
    }
  } else {
    // Late by far more than rank 0's 300 ms, so that a loaded machine that delays rank 0
    // cannot let them arrive in time.
    std::this_thread::sleep_for(3s);
    // The late ranks complete the collective rank 0 started (it progresses while waiting
    // in the world barrier below).
    std::int64_t mine = 1, sum = 0;
    comm->allreduce(&mine, &sum, 1, DataType::int64, ReduceOp::sum)->wait();
    EXPECT_EQ(sum, comm->size());
  }
  world->barrier()->wait();
}

}  // namespace
}  // namespace commgrid::test
