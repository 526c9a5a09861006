// The NCCL backend on GPUs: every collective on device buffers against a host reference for
// every type, creation with each strategy, staging of host buffers, timeouts and aborts.
// Ranks are threads of this process with a Gloo bootstrap, one GPU each: COMMGRID_NCCL_RANKS
// of them (default: the devices this process sees, at most 8). Without a CUDA device every
// test skips, saying so. NcclDevice runs on any number of ranks (1 included);
// NcclDeviceMulti needs 2 or more and skips, saying so, on fewer: scripts/gpu-check runs
// each suite only where it applies and counts every skip as a failure.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "../comm_suite.hpp"
#include "commgrid/gloo.hpp"
#include "commgrid/layout.hpp"
#include "commgrid/local_ranks.hpp"
#include "commgrid/nccl.hpp"
#include "commgrid/process_groups.hpp"
#include "nccl_host.hpp"
#include "nccl_memory.hpp"
#include "nccl_test_support.hpp"

namespace commgrid {
namespace {

using namespace std::chrono_literals;
using nccl_test::over;
using Ms = std::chrono::milliseconds;

constexpr DataType kTypes[] = {DataType::float32, DataType::float64, DataType::bfloat16,
                               DataType::float16, DataType::int32,   DataType::int64,
                               DataType::int8,    DataType::uint8};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::prod,
                             ReduceOp::avg};

// Every test here needs a CUDA device per rank-thread (nccl_test::DeviceRanks skips without).
class NcclDevice : public nccl_test::DeviceRanks {
 protected:
  /// Runs fn on n_ rank-threads, each with an NCCL world on its own device. The world's
  /// creation gets `timeout` (a first NCCL init loads its kernels: give it seconds); tests
  /// of timeouts shorten it afterwards with set_timeout.
  void run(const std::function<void(Communicator& boot, NcclCommunicator& world)>& fn,
           Ms timeout = 60s) {
    GlooOptions gloo;
    gloo.timeout = 60s;
    run_local_ranks(
        n_,
        [&](Communicator& boot) {
          NcclOptions o;
          o.timeout = timeout;
          auto world = make_nccl_world(over(boot, o));
          fn(boot, *world);
        },
        gloo);
  }
};

// The tests that need 2 ranks on 2 GPUs (NCCL refuses two ranks on one GPU).
class NcclDeviceMulti : public NcclDevice {
 protected:
  NcclDeviceMulti() { min_ranks_ = 2; }
};

// Holds a communicator's stream until release(): a host function on a side stream waits,
// and the stream waits for it, so that nothing queued on the stream can start (with one GPU,
// the only way to keep an operation pending). If nobody releases it within 60 s, a fallback
// thread does and says so (released_by_fallback()), so that a broken test fails instead of
// hanging.
class Held {
 public:
  explicit Held(NcclCommunicator& w) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaEventCreateWithFlags(&held_, cudaEventDisableTiming), cudaSuccess);
    EXPECT_EQ(cudaLaunchHostFunc(side_, &Held::hold, this), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(held_, side_), cudaSuccess);
    EXPECT_EQ(cudaStreamWaitEvent(w.stream(), held_, 0), cudaSuccess);
    fallback_ = std::thread([this] {
      const auto until = std::chrono::steady_clock::now() + 60s;
      while (!release_.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(1ms);
      if (!release_.exchange(true)) by_fallback_ = true;
    });
  }
  ~Held() {
    release();
    fallback_.join();
    cudaStreamSynchronize(side_);
    cudaEventDestroy(held_);
    cudaStreamDestroy(side_);
  }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  void release() { release_ = true; }
  [[nodiscard]] bool released_by_fallback() const { return by_fallback_.load(); }

 private:
  static void CUDART_CB hold(void* self) {
    auto* h = static_cast<Held*>(self);
    while (!h->release_.load()) std::this_thread::sleep_for(1ms);
  }
  cudaStream_t side_ = nullptr;
  cudaEvent_t held_ = nullptr;
  std::atomic<bool> release_{false};
  std::atomic<bool> by_fallback_{false};
  std::thread fallback_;
};

// A host buffer of any DataType, read and written as doubles.
class Host {
 public:
  Host(DataType t, std::size_t count) : type_(t), bytes_(count * element_size(t)) {}
  void* data() { return bytes_.data(); }
  [[nodiscard]] std::size_t bytes() const { return bytes_.size(); }
  [[nodiscard]] std::size_t count() const { return bytes_.size() / element_size(type_); }
  void set(std::size_t i, double v) {
    unsigned char* p = bytes_.data() + i * element_size(type_);
    switch (type_) {
      case DataType::float32: {
        const auto x = static_cast<float>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::float64: std::memcpy(p, &v, 8); break;
      case DataType::bfloat16: {
        const auto x = float_to_bf16(static_cast<float>(v));
        std::memcpy(p, &x, 2);
        break;
      }
      case DataType::float16: {
        const auto x = float_to_fp16(static_cast<float>(v));
        std::memcpy(p, &x, 2);
        break;
      }
      case DataType::int32: {
        const auto x = static_cast<std::int32_t>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::int64: {
        const auto x = static_cast<std::int64_t>(v);
        std::memcpy(p, &x, 8);
        break;
      }
      case DataType::int8: {
        const auto x = static_cast<std::int8_t>(v);
        std::memcpy(p, &x, 1);
        break;
      }
      case DataType::uint8: {
        const auto x = static_cast<std::uint8_t>(v);
        std::memcpy(p, &x, 1);
        break;
      }
    }
  }
  [[nodiscard]] double get(std::size_t i) const {
    const unsigned char* p = bytes_.data() + i * element_size(type_);
    switch (type_) {
      case DataType::float32: {
        float x;
        std::memcpy(&x, p, 4);
        return x;
      }
      case DataType::float64: {
        double x;
        std::memcpy(&x, p, 8);
        return x;
      }
      case DataType::bfloat16: {
        std::uint16_t x;
        std::memcpy(&x, p, 2);
        return bf16_to_float(x);
      }
      case DataType::float16: {
        std::uint16_t x;
        std::memcpy(&x, p, 2);
        return fp16_to_float(x);
      }
      case DataType::int32: {
        std::int32_t x;
        std::memcpy(&x, p, 4);
        return x;
      }
      case DataType::int64: {
        std::int64_t x;
        std::memcpy(&x, p, 8);
        return static_cast<double>(x);
      }
      case DataType::int8: {
        std::int8_t x;
        std::memcpy(&x, p, 1);
        return x;
      }
      case DataType::uint8: {
        std::uint8_t x;
        std::memcpy(&x, p, 1);
        return x;
      }
    }
    return 0;
  }

 private:
  DataType type_;
  std::vector<unsigned char> bytes_;
};

// Device memory of the calling thread's current device.
class Device {
 public:
  explicit Device(std::size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0 && cudaMalloc(&p_, bytes_) != cudaSuccess)
      throw std::runtime_error("cudaMalloc failed");
  }
  ~Device() {
    if (p_) cudaFree(p_);
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  void* get() const { return p_; }
  void upload(const Host& h) {
    ASSERT_EQ(cudaMemcpy(p_, const_cast<Host&>(h).data(), h.bytes(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  void download(Host& h) const {
    ASSERT_EQ(cudaMemcpy(h.data(), p_, h.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  }

 private:
  void* p_ = nullptr;
  std::size_t bytes_;
};

bool is_float(DataType t) {
  return t == DataType::float32 || t == DataType::float64 || t == DataType::bfloat16 ||
         t == DataType::float16;
}

// Integers exactly; floats within their precision (avg multiplies by 1/n before summing).
void expect_near(DataType t, double got, double want, const std::string& where) {
  if (!is_float(t)) {
    EXPECT_EQ(got, want) << where;
    return;
  }
  const double tol = t == DataType::bfloat16 ? 0.05 : t == DataType::float16 ? 0.01 : 1e-5;
  EXPECT_NEAR(got, want, tol * std::max(1.0, std::abs(want))) << where;
}

double input(ReduceOp op, int r, int n, std::size_t i) {
  switch (op) {
    case ReduceOp::prod: return (static_cast<int>(i % 2) == r % 2) ? 2 : 1;
    case ReduceOp::avg: return static_cast<double>(i % 5) + 1 + (r == 0 ? n - 1 : -1);
    default: return (r + 1) + static_cast<double>(i % 3);
  }
}

double reference(ReduceOp op, int n, std::size_t i) {
  double acc = input(op, 0, n, i);
  for (int r = 1; r < n; ++r) {
    const double v = input(op, r, n, i);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc += v; break;
      case ReduceOp::prod: acc *= v; break;
      case ReduceOp::max: acc = std::max(acc, v); break;
      case ReduceOp::min: acc = std::min(acc, v); break;
    }
  }
  return op == ReduceOp::avg ? acc / n : acc;
}

std::string where(DataType t, const char* what, std::size_t i) {
  return std::string(datatype_name(t)) + " " + what + " [" + std::to_string(i) + "]";
}

TEST_F(NcclDevice, AllreduceAndReduceEveryTypeAndOpMatchTheHostReference) {
  run([&](Communicator&, NcclCommunicator& w) {
    const int n = w.size(), r = w.rank();
    constexpr std::size_t kCount = 37;
    for (DataType t : kTypes) {
      for (ReduceOp op : kOps) {
        Host in(t, kCount), out(t, kCount);
        for (std::size_t i = 0; i < kCount; ++i) in.set(i, input(op, r, n, i));
        Device din(in.bytes()), dout(out.bytes());
        din.upload(in);
        w.allreduce(din.get(), dout.get(), kCount, t, op)->wait();
        dout.download(out);
        const std::string label = std::string("allreduce ") + std::string(reduce_op_name(op));
        for (std::size_t i = 0; i < kCount; ++i)
          expect_near(t, out.get(i), reference(op, n, i), where(t, label.c_str(), i));
        // reduce to the last rank, in place there
        const int root = n - 1;
        w.reduce(din.get(), r == root ? din.get() : nullptr, kCount, t, op, root)->wait();
        if (r == root) {
          din.download(out);
          for (std::size_t i = 0; i < kCount; ++i)
            expect_near(t, out.get(i), reference(op, n, i), where(t, "reduce", i));
        }
      }
    }
  });
}

TEST_F(NcclDevice, DataMovementEveryType) {
  run([&](Communicator&, NcclCommunicator& w) {
    const int n = w.size(), r = w.rank();
    const auto un = static_cast<std::size_t>(n);
    constexpr std::size_t kCount = 5;
    auto value = [](int rank, std::size_t i) {
      return static_cast<double>(rank * 10 + static_cast<int>(i % 10));
    };
    for (DataType t : kTypes) {
      Host mine(t, kCount), all(t, kCount * un), back(t, kCount * un);
      for (std::size_t i = 0; i < kCount; ++i) mine.set(i, value(r, i));
      Device dmine(mine.bytes()), dall(all.bytes()), dback(back.bytes());
      dmine.upload(mine);
      // broadcast from the last rank
      Device dbc(mine.bytes());
      dbc.upload(mine);
      w.broadcast(dbc.get(), kCount, t, n - 1)->wait();
      Host bc(t, kCount);
      dbc.download(bc);
      for (std::size_t i = 0; i < kCount; ++i)
        expect_near(t, bc.get(i), value(n - 1, i), where(t, "broadcast", i));
      // allgather and gather
      w.allgather(dmine.get(), dall.get(), kCount, t)->wait();
      dall.download(all);
      for (std::size_t k = 0; k < kCount * un; ++k)
        expect_near(t, all.get(k), value(static_cast<int>(k / kCount), k % kCount),
                    where(t, "allgather", k));
      w.gather(dmine.get(), r == 0 ? dback.get() : nullptr, kCount, t, 0)->wait();
      if (r == 0) {
        dback.download(back);
        for (std::size_t k = 0; k < kCount * un; ++k)
          expect_near(t, back.get(k), value(static_cast<int>(k / kCount), k % kCount),
                      where(t, "gather", k));
      }
      // alltoall: block j of rank r holds r*10 + j; rank r receives block r of every rank i
      Host blocks(t, kCount * un);
      for (std::size_t k = 0; k < kCount * un; ++k)
        blocks.set(k, r * 10 + static_cast<double>(k / kCount));
      dall.upload(blocks);
      w.alltoall(dall.get(), dback.get(), kCount, t)->wait();
      dback.download(back);
      for (std::size_t k = 0; k < kCount * un; ++k)
        expect_near(t, back.get(k), static_cast<double>(k / kCount) * 10 + r,
                    where(t, "alltoall", k));
      // scatter from rank 0: block i goes to rank i
      w.scatter(r == 0 ? dall.get() : nullptr, dmine.get(), kCount, t, 0)->wait();
      dmine.download(mine);
      for (std::size_t i = 0; i < kCount; ++i)
        expect_near(t, mine.get(i), r, where(t, "scatter", i));
      // reduce_scatter (sum): block r of every rank
      for (std::size_t k = 0; k < kCount * un; ++k)
        blocks.set(k, static_cast<double>(k / kCount + 1));
      dall.upload(blocks);
      w.reduce_scatter(dall.get(), dmine.get(), kCount, t, ReduceOp::sum)->wait();
      dmine.download(mine);
      for (std::size_t i = 0; i < kCount; ++i)
        expect_near(t, mine.get(i), (r + 1) * n, where(t, "reduce_scatter", i));
    }
  });
}

TEST_F(NcclDevice, VariableCountsAlltoallvAndAllgatherv) {
  run([&](Communicator&, NcclCommunicator& w) {
    const int n = w.size(), r = w.rank();
    for (DataType t : {DataType::float32, DataType::bfloat16, DataType::int8}) {
      std::vector<std::size_t> sc(static_cast<std::size_t>(n)), rc(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) {
        sc[static_cast<std::size_t>(j)] = static_cast<std::size_t>((r + 2 * j) % 3);  // r -> j
        rc[static_cast<std::size_t>(j)] = static_cast<std::size_t>((j + 2 * r) % 3);  // j -> r
      }
      const std::size_t st = std::accumulate(sc.begin(), sc.end(), std::size_t{0});
      const std::size_t rt = std::accumulate(rc.begin(), rc.end(), std::size_t{0});
      Host s(t, st), got(t, rt);
      for (std::size_t k = 0, j = 0; j < sc.size(); ++j)
        for (std::size_t e = 0; e < sc[j]; ++e) s.set(k++, r * 10 + static_cast<double>(e));
      Device ds(s.bytes()), dr(got.bytes());
      ds.upload(s);
      w.alltoallv(ds.get(), sc, dr.get(), rc, t)->wait();
      dr.download(got);
      for (std::size_t k = 0, j = 0; j < rc.size(); ++j)
        for (std::size_t e = 0; e < rc[j]; ++e, ++k)
          expect_near(t, got.get(k), static_cast<double>(j) * 10 + static_cast<double>(e),
                      where(t, "alltoallv", k));
      // allgatherv: rank j contributes j % 3 + 1 elements of value j
      std::vector<std::size_t> counts(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j)
        counts[static_cast<std::size_t>(j)] = static_cast<std::size_t>(j % 3 + 1);
      const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
      Host mine(t, counts[static_cast<std::size_t>(r)]), all(t, total);
      for (std::size_t e = 0; e < mine.count(); ++e) mine.set(e, r);
      Device dm(mine.bytes()), da(all.bytes());
      dm.upload(mine);
      w.allgatherv(dm.get(), mine.count(), da.get(), counts, t)->wait();
      da.download(all);
      for (std::size_t k = 0, j = 0; j < counts.size(); ++j)
        for (std::size_t e = 0; e < counts[j]; ++e, ++k)
          expect_near(t, all.get(k), static_cast<double>(j), where(t, "allgatherv", k));
    }
  });
}

TEST_F(NcclDevice, PointToPointRingBatchesAndSelf) {
  run([&](Communicator&, NcclCommunicator& w) {
    const int n = w.size(), r = w.rank();
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    Host out(DataType::int64, 4), in(DataType::int64, 4), self_in(DataType::int64, 4);
    for (std::size_t i = 0; i < 4; ++i) out.set(i, r * 100 + static_cast<double>(i));
    Device dout(out.bytes()), din(in.bytes()), dself(in.bytes());
    dout.upload(out);
    // both ways round the ring and to itself, in one batch
    const std::vector<P2POp> ops = {P2POp::send(dout.get(), 4, DataType::int64, next),
                                    P2POp::recv(din.get(), 4, DataType::int64, prev),
                                    P2POp::send(dout.get(), 4, DataType::int64, r),
                                    P2POp::recv(dself.get(), 4, DataType::int64, r)};
    w.batch_isend_irecv(ops)->wait();
    din.download(in);
    dself.download(self_in);
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(in.get(i), prev * 100 + static_cast<double>(i));
      EXPECT_EQ(self_in.get(i), r * 100 + static_cast<double>(i));
    }
    if (n > 1) {  // blocking send and recv, as verify's pipeline ring does
      std::int64_t token = r == 0 ? 1 : 0;
      if (r == 0) {
        w.send(&token, 1, DataType::int64, next, 0)->wait();
        w.recv(&token, 1, DataType::int64, prev, 0)->wait();
        EXPECT_EQ(token, std::int64_t{1} << (n - 1)) << "each other stage doubled it";
      } else {
        w.recv(&token, 1, DataType::int64, prev, 0)->wait();
        token *= 2;
        w.send(&token, 1, DataType::int64, next, 0)->wait();
      }
    }
    w.barrier()->wait();
  });
}

TEST_F(NcclDevice, HostBuffersAreStagedInPlaceToo) {
  run([&](Communicator&, NcclCommunicator& w) {
    std::vector<std::int64_t> v = {w.rank() + 1, 7};
    w.allreduce(v.data(), v.data(), v.size(), DataType::int64, ReduceOp::sum)->wait();
    const std::int64_t n = w.size();
    EXPECT_EQ(v[0], n * (n + 1) / 2);
    EXPECT_EQ(v[1], 7 * n);
    w.allreduce(std::span<std::int64_t>(v), ReduceOp::max)->wait();  // the typed overload
    EXPECT_EQ(v[0], n * (n + 1) / 2);
  });
}

TEST_F(NcclDevice, SplitGivesMembersAndNoColorGivesNothing) {
  run([&](Communicator&, NcclCommunicator& w) {
    const int n = w.size(), r = w.rank();
    auto none = w.split(std::nullopt, r, "none#0");
    EXPECT_EQ(none, nullptr);
    auto half = w.split(r % 2, r, "half#" + std::to_string(r % 2));
    ASSERT_NE(half, nullptr);
    std::vector<std::int64_t> want;
    for (int i = r % 2; i < n; i += 2) want.push_back(i);
    EXPECT_EQ(half->members(), want);
    EXPECT_EQ(half->rank(), r / 2);
    std::int64_t x = r;
    half->allreduce(&x, &x, 1, DataType::int64, ReduceOp::sum)->wait();
    EXPECT_EQ(x, std::accumulate(want.begin(), want.end(), std::int64_t{0}));
    EXPECT_EQ(w.creation_calls(), 2);
  });
}

TEST_F(NcclDevice, EveryKindCreatedWithEachStrategy) {
  for (CreationStrategy s :
       {CreationStrategy::split, CreationStrategy::member, CreationStrategy::per_group}) {
    SCOPED_TRACE(std::string(strategy_name(s)));
    run([&](Communicator&, NcclCommunicator& w) {
      ParallelConfig c;
      c.world_size = w.size();
      c.tp = w.size() >= 2 ? 2 : 1;
      c.pp = w.size() >= 4 ? 2 : 1;
      InitOptions o;
      o.strategy = s;
      ProcessGroups pg;
      pg.initialize(w, c, o);
      for (GroupKind k : pg.kinds()) {
        for (int level = 0; level < pg.layout().levels(k); ++level) {
          if (!pg.has_group(k, level)) continue;
          Communicator& g = pg.group(k, level);
          EXPECT_EQ(g.backend(), "nccl");
          const auto& members = pg.global_ranks(k, level);
          std::vector<std::int64_t> sorted(members.begin(), members.end());
          std::sort(sorted.begin(), sorted.end());
          EXPECT_EQ(g.members(), sorted) << kind_name(k);
          Device d(8);
          const std::int64_t me = w.rank() + 1;
          ASSERT_EQ(cudaMemcpy(d.get(), &me, 8, cudaMemcpyHostToDevice), cudaSuccess);
          g.allreduce(d.get(), d.get(), 1, DataType::int64, ReduceOp::sum)->wait();
          std::int64_t sum = 0;
          ASSERT_EQ(cudaMemcpy(&sum, d.get(), 8, cudaMemcpyDeviceToHost), cudaSuccess);
          EXPECT_EQ(sum, std::accumulate(sorted.begin(), sorted.end(), std::int64_t{0}) +
                             static_cast<std::int64_t>(sorted.size()))
              << kind_name(k);
        }
      }
      pg.destroy();
    });
  }
}

TEST_F(NcclDevice, ACollectiveThatNeverCompletesTimesOutAbortsAndLaterCallsSayWhy) {
  run([&](Communicator&, NcclCommunicator& w) {
    Held held(w);
    // ncclCommAbort may wait for the stream to drain, so the stream is released as soon as
    // the abort has begun (aborted() turns true before ncclCommAbort is called): the timeout
    // and the abort are what end the wait, not the stream.
    std::thread releaser([&] {
      while (!w.aborted() && !held.released_by_fallback()) std::this_thread::sleep_for(1ms);
      held.release();
    });
    w.set_timeout(1s);
    Device d(4);
    const auto t0 = std::chrono::steady_clock::now();
    std::string msg;
    try {
      w.allreduce(d.get(), d.get(), 1, DataType::float32, ReduceOp::sum)->wait();
    } catch (const TimeoutError& e) { msg = e.what(); }
    const auto took = std::chrono::steady_clock::now() - t0;
    releaser.join();
    EXPECT_FALSE(held.released_by_fallback()) << "the wait ended only when the stream was released";
    EXPECT_GE(took, 1s);
    EXPECT_LT(took, 30s) << "timeout 1 s, then the abort";
    EXPECT_EQ(
        msg.rfind("nccl allreduce on world: did not complete within 1 s; world aborted (members [",
                  0),
        0u)
        << msg;
    EXPECT_TRUE(w.aborted());
    EXPECT_EQ(w.native(), nullptr);
    std::string later;
    try {
      w.barrier()->wait();
    } catch (const BackendError& e) { later = e.what(); }
    EXPECT_EQ(later, "nccl barrier on world: the communicator was aborted: " + msg);
  });
}

TEST_F(NcclDevice, AnOperationAbortedByAnotherThreadFailsInsteadOfReportingSuccess) {
  run([&](Communicator&, NcclCommunicator& w) {
    Held held(w);
    std::int64_t in = 5, out = -1;  // host buffers: staged, written only on success
    auto work = w.allreduce(&in, &out, 1, DataType::int64, ReduceOp::sum);
    std::string waited;
    // The waiter polls the communicator while a watchdog thread aborts it.
    std::thread waiter([&] {
      try {
        work->wait();
        waited = "(returned normally)";
      } catch (const BackendError& e) { waited = e.what(); }
    });
    std::thread watchdog([&] { w.abort("watchdog: test"); });
    std::thread releaser([&] {
      while (!w.aborted() && !held.released_by_fallback()) std::this_thread::sleep_for(1ms);
      held.release();  // the aborted operation's event completes now
    });
    watchdog.join();
    releaser.join();
    waiter.join();
    EXPECT_EQ(waited, "nccl allreduce on world: the communicator was aborted: watchdog: test");
    EXPECT_EQ(out, -1) << "an aborted operation's output is not written";
    EXPECT_TRUE(work->done());
    EXPECT_THROW(work->wait(), BackendError);
    EXPECT_FALSE(held.released_by_fallback());
  });
}

TEST_F(NcclDevice, HostInputsMayBeReusedOnceTheCallReturnsPageableOrPinned) {
  run([&](Communicator&, NcclCommunicator& w) {
    const std::int64_t n = w.size();
    void* pinned_block = nullptr;
    ASSERT_EQ(cudaMallocHost(&pinned_block, 2 * sizeof(std::int64_t)), cudaSuccess);
    auto* pinned = static_cast<std::int64_t*>(pinned_block);
    std::vector<std::int64_t> pageable = {w.rank() + 1, 5}, out_pageable(2), out_pinned(2);
    pinned[0] = w.rank() + 1;
    pinned[1] = 5;
    {
      Held held(w);  // nothing posted below can run before the inputs are overwritten
      auto a = w.allreduce(pageable.data(), out_pageable.data(), 2, DataType::int64, ReduceOp::sum);
      auto b = w.allreduce(pinned, out_pinned.data(), 2, DataType::int64, ReduceOp::sum);
      pageable = {-100, -100};
      pinned[0] = pinned[1] = -100;
      EXPECT_FALSE(a->done());
      EXPECT_FALSE(b->done());
      held.release();
      a->wait();
      b->wait();
      EXPECT_FALSE(held.released_by_fallback());
    }
    const std::vector<std::int64_t> want = {n * (n + 1) / 2, 5 * n};
    EXPECT_EQ(out_pageable, want);
    EXPECT_EQ(out_pinned, want);
    cudaFreeHost(pinned);
  });
}

TEST_F(NcclDevice, APendingOperationOfOneGroupNeverHoldsAnotherGroupsWaitOrDone) {
  run([&](Communicator&, NcclCommunicator& w) {
    auto solo_comm = w.split(w.rank(), 0, "solo#" + std::to_string(w.rank()));
    ASSERT_NE(solo_comm, nullptr);
    Communicator& solo = *solo_comm;
    Held held(w);
    std::int64_t pending_in = 1, pending_out = 0;
    auto pending = w.allreduce(&pending_in, &pending_out, 1, DataType::int64, ReduceOp::sum);
    // Host buffers on the other group: staged in and out while the world's stream is held.
    // With a synchronous copy back (or a blocking stream) these waited for the held
    // operation, and only the fallback release (60 s) would have ended them. The world's
    // device block (the same size as solo's) is freed behind the held operation: from one
    // pool shared by both (the device's default), solo's allocation could reuse it with a
    // dependency on the world's stream added by CUDA; each communicator's own pool, without
    // internal dependencies, never does.
    std::int64_t x = 7, y = 0;
    solo.allreduce(&x, &y, 1, DataType::int64, ReduceOp::sum)->wait();
    EXPECT_EQ(y, 7);
    std::int64_t x2 = 11, y2 = 0;
    auto polled = solo.allreduce(&x2, &y2, 1, DataType::int64, ReduceOp::sum);
    while (!polled->done() && !held.released_by_fallback()) std::this_thread::sleep_for(1ms);
    EXPECT_EQ(y2, 11) << "done() returned true, so the output is written";
    const std::vector<P2POp> self = {P2POp::send(&x, 1, DataType::int64, 0),
                                     P2POp::recv(&y2, 1, DataType::int64, 0)};
    solo.batch_isend_irecv(self)->wait();  // host-staged self send/recv through NCCL's p2p path
    EXPECT_EQ(y2, 7);
    EXPECT_FALSE(held.released_by_fallback()) << "another group's pending operation held these";
    EXPECT_FALSE(pending->done());
    held.release();
    pending->wait();
    EXPECT_EQ(pending_out, w.size());
  });
}

TEST_F(NcclDevice, StagingWhileOperationsArePendingTakesTheSeededBlocks) {
  run([&](Communicator& boot, NcclCommunicator& w) {
    // Every communicator seeds the pinned cache (4 blocks of 4 KiB, 1 of 64 KiB) when it is
    // made, so that these, staged while the world's stream is held, allocate no pinned memory
    // (cudaHostAlloc may synchronize the device, which would wait for the held operations).
    // The cache is the process's: every rank-thread's world is made (and has seeded it)
    // before any rank counts.
    boot.barrier()->wait();
    const auto& cache = nccl_backend::staging_pinned_cache();
    if (w.rank() == 0) {
      EXPECT_GE(cache.free_blocks(4096), 4u);
      EXPECT_GE(cache.free_blocks(65536), 1u);
    }
    std::vector<std::unique_ptr<Work>> pending;
    std::vector<std::vector<std::int64_t>> small(4, std::vector<std::int64_t>(2));
    std::vector<std::int64_t> large(5000, 1);  // 40 KB in and out: the 64 KiB block
    {
      Held held(w);
      const std::size_t made = cache.made();
      for (auto& v : small) {
        v = {w.rank() + 1, 3};
        pending.push_back(
            w.allreduce(v.data(), v.data(), v.size(), DataType::int64, ReduceOp::sum));
      }
      pending.push_back(
          w.allreduce(large.data(), large.data(), large.size(), DataType::int64, ReduceOp::sum));
      EXPECT_EQ(cache.made(), made)
          << "staging allocated pinned memory while operations were pending";
      for (const auto& p : pending) EXPECT_FALSE(p->done());
      held.release();
      for (const auto& p : pending) p->wait();
      EXPECT_FALSE(held.released_by_fallback());
    }
    const std::int64_t n = w.size();
    for (const auto& v : small) EXPECT_EQ(v, (std::vector<std::int64_t>{n * (n + 1) / 2, 3 * n}));
    EXPECT_EQ(large.front(), n);
    EXPECT_EQ(large.back(), n);
  });
}

TEST_F(NcclDevice, SplitsAreRefusedWhileNcclWouldShareResourcesOrBlock) {
  // Set between the world's creation and the split, on one thread while the others wait at
  // a bootstrap barrier (setenv is not safe against threads reading the environment).
  for (const char* var : {"NCCL_COMM_SPLIT_SHARE_RESOURCES", "NCCL_COMM_BLOCKING"}) {
    SCOPED_TRACE(var);
    run([&](Communicator& boot, NcclCommunicator& w) {
      boot.barrier()->wait();
      if (w.rank() == 0) ::setenv(var, "1", 1);
      boot.barrier()->wait();
      std::string msg, parameter;
      try {
        (void)w.split(0, w.rank(), "tp#0");
        msg = "(split)";
      } catch (const ConfigError& e) {
        msg = e.what();
        parameter = e.parameter();
      }
      boot.barrier()->wait();
      if (w.rank() == 0) ::unsetenv(var);
      boot.barrier()->wait();
      EXPECT_EQ(parameter, var);
      EXPECT_EQ(msg.rfind("nccl split on world for tp#0: " + std::string(var) + "=1 ", 0), 0u)
          << msg;
      EXPECT_FALSE(w.aborted()) << "refused before NCCL was called";
      auto g = w.split(0, w.rank(), "tp#0");  // unset again: the split goes ahead
      ASSERT_NE(g, nullptr);
      EXPECT_EQ(g->size(), w.size());
    });
  }
}

TEST_F(NcclDevice, ASplitThatTimesOutAbortsTheParentAndSaysWhich) {
  run([&](Communicator&, NcclCommunicator& w) {
    // No NCCL communicator initializes within 1 ms; the split's job is still running when
    // the deadline passes, and its child is aborted with the parent.
    w.set_timeout(1ms);
    std::string msg;
    try {
      (void)w.split(0, w.rank(), "tp#0");
      msg = "(completed)";
    } catch (const TimeoutError& e) { msg = e.what(); }
    EXPECT_EQ(msg.rfind("nccl split on world for tp#0 (color 0): did not complete within ", 0), 0u)
        << msg;
    EXPECT_TRUE(w.aborted());
    EXPECT_THROW((void)w.barrier(), BackendError);
  });
}

TEST_F(NcclDeviceMulti, APeerThatNeverJoinsEndsInTimeoutNamingTheGroup) {
  run([&](Communicator& boot, NcclCommunicator& w) {
    w.set_timeout(1s);
    if (w.rank() == 1) {  // never joins; waits until rank 0 has given up
      boot.barrier()->wait();
      return;
    }
    Device d(4);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_THROW(w.allreduce(d.get(), d.get(), 1, DataType::float32, ReduceOp::sum)->wait(),
                 TimeoutError);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << "timeout 1 s, then the abort";
    EXPECT_TRUE(w.aborted());
    boot.barrier()->wait();
  });
}

TEST_F(NcclDeviceMulti, MemberCreationWithAMissingMemberTimesOutNamingTheMembers) {
  run([&](Communicator& boot, NcclCommunicator& w) {
    w.set_timeout(1s);
    const std::vector<Rank> members = {0, 1};
    if (w.rank() == 0) {
      // Rank 1 takes part in the id exchange (so rank 0 reaches NCCL's init) but not in it.
      std::string msg;
      try {
        (void)w.create_group(members, "tp#0");
      } catch (const TimeoutError& e) { msg = e.what(); }
      EXPECT_EQ(
          msg,
          "nccl create_group on world for tp#0: did not complete within 1 s; tp#0 aborted (members [0,1])");
    } else if (w.rank() == 1) {
      std::array<std::int64_t, nccl_host::kIdMessageWords> id{};
      boot.recv(id.data(), id.size(), DataType::int64, 0, nccl_host::kUniqueIdTag)->wait();
    }
    boot.barrier()->wait();
  });
}

TEST_F(NcclDeviceMulti, AnotherDevicesBufferIsRefusedAndTheCommunicatorLives) {
  run([&](Communicator&, NcclCommunicator& w) {
    // Rank-threads share one address space: the next rank's device memory is a valid pointer
    // here, on the wrong device.
    const int other = (w.device() + 1) % cuda_device_count();
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(other), cudaSuccess);
    void* foreign = nullptr;
    ASSERT_EQ(cudaMalloc(&foreign, 8), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(current), cudaSuccess);
    Device mine(8);
    std::string msg;
    try {
      w.allreduce(foreign, mine.get(), 1, DataType::int64, ReduceOp::sum)->wait();
    } catch (const ConfigError& e) {
      msg = e.what();
      EXPECT_EQ(e.parameter(), "send");
    }
    EXPECT_EQ(msg, "nccl allreduce on world: send buffer is memory of CUDA device " +
                       std::to_string(other) + ", and this communicator's device is " +
                       std::to_string(w.device()));
    EXPECT_FALSE(w.aborted());
    std::int64_t v = 1;
    w.allreduce(&v, &v, 1, DataType::int64, ReduceOp::sum)->wait();  // still usable
    EXPECT_EQ(v, w.size());
    cudaFree(foreign);
  });
}

// The backend-neutral suite (tests/backends/comm_suite.hpp) on the NCCL world, host buffers
// staged as always: the same argument errors as on MPI and Gloo (typed, named, before any
// communication), then point to point, the variable collectives and the rank mapping.
// (Every type and op against a host reference is AllreduceAndReduceEveryTypeAndOp... above.)
TEST_F(NcclDevice, TheBackendNeutralSuiteOnHostBuffers) {
  run([&](Communicator&, NcclCommunicator& w) {
    EXPECT_NO_THROW({
      suite::argument_errors(w);
      suite::typed_size_errors(w);
      suite::world_members(w);
      suite::symmetric_and_ring(w);
      suite::alltoallv_random(w, 11);
      suite::allgatherv_random(w, 12);
    });
    EXPECT_FALSE(w.aborted()) << w.abort_reason();
  });
}

}  // namespace
}  // namespace commgrid
