// Kept connections (make_gloo_connections): real Gloo pairs between rank-threads, each
// epoch's world and groups as views over them. Views prove their members on the wire; an
// epoch's end on one process ends a peer's blocked operation at once; the pairs that held
// an unfinished operation are made anew and work; a group past its deadline ends alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <functional>
#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "commgrid/process_groups.hpp"
#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;

// Runs fn(process, connections) on `n` threads over one memory store, each with the job's
// connections made (the collective start); failures inside are the test's.
void run_processes(int n, const std::function<void(int, GlooConnections&)>& fn,
                   std::chrono::milliseconds timeout = 20s,
                   std::shared_ptr<Store> store = make_memory_store()) {
  std::vector<std::thread> threads;
  for (int p = 0; p < n; ++p)
    threads.emplace_back([&, p] {
      try {
        GlooOptions o = placed(store, p, n, test_options(timeout));
        o.prefix = "kept";
        const std::shared_ptr<GlooConnections> c = make_gloo_connections(o);
        fn(p, *c);
      } catch (const std::exception& e) { ADD_FAILURE() << "process " << p << ": " << e.what(); }
    });
  for (auto& t : threads) t.join();
}

std::int64_t sum_of_ranks(Communicator& c) {
  std::int64_t mine = c.rank(), sum = 0;
  c.allreduce(&mine, &sum, 1, DataType::int64, ReduceOp::sum)->wait();
  return sum;
}

// The agreement's decision on the pairs to make anew, for `process`: the peers that either
// end listed (end_epoch) for the other.
std::vector<std::int64_t> to_renew(const std::vector<std::vector<std::int64_t>>& listed,
                                   int process) {
  std::vector<std::int64_t> renew;
  const auto& own = listed[static_cast<std::size_t>(process)];
  for (int p = 0; p < static_cast<int>(listed.size()); ++p) {
    const auto& theirs = listed[static_cast<std::size_t>(p)];
    if (p != process && (std::count(theirs.begin(), theirs.end(), process) != 0 ||
                         std::count(own.begin(), own.end(), p) != 0))
      renew.push_back(p);
  }
  return renew;
}

// tp 2 over n ranks (dp n / 2).
ParallelConfig tp2(int n) {
  ParallelConfig c;
  c.world_size = n;
  c.tp = 2;
  return c;
}

std::vector<std::int64_t> iota_processes(int n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Two epochs over the same pairs: every kind of tp 2 x dp 4 proves its members (an
// allgather of world ranks), and epoch 1 gives the logical ranks to the processes in
// reverse: the views follow, nothing is connected again.
TEST(GlooKeptConnections, EpochsAreViewsOverTheSamePairsAndEveryGroupProvesItsMembers) {
  constexpr int n = 8;
  const ParallelConfig cfg = tp2(n);
  std::barrier all_done(n);
  run_processes(n, [&](int process, GlooConnections& kept) {
    for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
      std::vector<std::int64_t> process_of = iota_processes(n);
      if (epoch == 1) std::reverse(process_of.begin(), process_of.end());
      const std::int64_t rank = epoch == 0 ? process : n - 1 - process;
      std::unique_ptr<Communicator> world =
          kept.world("kept/e" + std::to_string(epoch), epoch, process_of, {});
      ASSERT_EQ(world->rank(), rank);
      ASSERT_EQ(world->size(), n);
      EXPECT_EQ(sum_of_ranks(*world), n * (n - 1) / 2);
      ProcessGroups pg;
      InitOptions o;
      o.share_identical_groups = true;
      pg.initialize(*world, cfg, o);
      for (GroupKind k : pg.kinds()) {
        if (!pg.has_group(k)) continue;
        Communicator& c = pg.group(k);
        const auto& members = pg.global_ranks(k);
        std::vector<std::int64_t> got(members.size());
        c.allgather(&rank, got.data(), 1, DataType::int64)->wait();
        EXPECT_EQ(got, std::vector<std::int64_t>(members.begin(), members.end()))
            << kind_name(k) << " in epoch " << epoch;
      }
      pg.destroy();
      world.reset();
      // An epoch's end is a failure: every process ends it once all are done with it.
      all_done.arrive_and_wait();
      // Nothing was left unfinished: no pair needs making again.
      EXPECT_EQ(kept.end_epoch(), std::vector<std::int64_t>{}) << "epoch " << epoch;
      all_done.arrive_and_wait();  // no process closes its pairs while another ends
    }
  });
}

// An epoch's world and the layout's groups made from it (the first batch) are named by
// namespaces every member derives from the epoch and the group's number: no namespace key
// in the store. A later batch on the same world (the same names again) is named through the
// store, and every group of both proves its members.
TEST(GlooKeptConnections, AnEpochsLayoutGroupsAreNamedWithoutTheStoreALaterBatchThroughIt) {
  constexpr int n = 4;
  const ParallelConfig cfg = tp2(n);
  auto store = make_memory_store();
  std::barrier both(n);
  run_processes(
      n,
      [&](int process, GlooConnections& kept) {
        const std::string prefix = "kept/e3";
        std::unique_ptr<Communicator> world = kept.world(prefix, 3, iota_processes(n), {});
        EXPECT_FALSE(store->has(prefix + "/namespace"));
        for (int batch = 0; batch < 2; ++batch) {
          ProcessGroups pg;
          pg.initialize(*world, cfg);
          for (GroupKind k : {GroupKind::tp, GroupKind::dp, GroupKind::pp}) {
            Communicator& c = pg.group(k);
            const auto& members = pg.global_ranks(k);
            std::vector<std::int64_t> got(members.size());
            const std::int64_t me = process;
            c.allgather(&me, got.data(), 1, DataType::int64)->wait();
            EXPECT_EQ(got, std::vector<std::int64_t>(members.begin(), members.end()))
                << kind_name(k) << ", batch " << batch;
            if (members.size() < 2) continue;  // (a group of one is never named)
            const std::string key =
                prefix + "/group/" + c.name() + "/" + std::to_string(batch) + "/namespace";
            both.arrive_and_wait();  // every member has named the group
            EXPECT_EQ(store->has(key), batch == 1) << key;
          }
          pg.destroy();
        }
        world.reset();
        both.arrive_and_wait();
        EXPECT_EQ(kept.end_epoch(), std::vector<std::int64_t>{});
        both.arrive_and_wait();
      },
      20s, store);
}

// InitOptions::proven_fingerprint: over kept connections (views: making a group needs no
// barrier) process 0 initializes dp 2 alone, process 1 never calling initialize, which
// works only when nothing is exchanged over the world: with its own fingerprint proven it
// does; without, the exchange waits for process 1 until the timeout. A proven value that is
// not the rank's own is a ConfigMismatchError at once, naming the option.
TEST(GlooKeptConnections, AProvenFingerprintSkipsTheExchangeAndAnotherOneIsAMismatch) {
  ParallelConfig cfg;
  cfg.world_size = 2;
  std::atomic<bool> done{false};
  run_processes(2, [&](int process, GlooConnections& kept) {
    std::shared_ptr<Communicator> world = kept.world("kept/e0", 0, iota_processes(2), {});
    if (process == 1) {  // never initializes; stays until process 0 is done
      while (!done.load()) std::this_thread::sleep_for(5ms);
      return;
    }
    InitOptions o;
    o.share_identical_groups = true;
    o.proven_fingerprint = ProcessGroups::fingerprint(cfg, o);
    ProcessGroups pg;
    pg.initialize(world, cfg, o);
    EXPECT_EQ(&pg.group(GroupKind::dp), world.get());
    pg.destroy();
    o.proven_fingerprint = *o.proven_fingerprint + 1;
    try {
      pg.initialize(world, cfg, o);
      ADD_FAILURE() << "a proven fingerprint that is not this rank's was accepted";
    } catch (const ConfigMismatchError& e) { EXPECT_EQ(e.parameter(), "proven_fingerprint"); }
    o.proven_fingerprint.reset();
    world->set_timeout(1s);
    EXPECT_THROW(pg.initialize(world, cfg, o), TimeoutError);  // the exchange waits
    done = true;
  });
}

// Hundreds of operations on one view: Gloo's collectives carry their tag in the slot (tag <<
// 24), commgrid's point-to-point a user's tag of up to 31 bits; neither may reach the bits
// that hold the view's namespace. 700 allreduces (ring for one element, bcube for more),
// 300 allgathers and barriers, and sends with tags at the edges of each byte, on the world
// and on a tp group: every result right, nothing left unfinished.
TEST(GlooKeptConnections, HundredsOfOperationsOnOneViewKeepTheirNamespace) {
  constexpr int n = 4;
  const ParallelConfig cfg = tp2(n);
  std::barrier both(n);
  run_processes(n, [&](int process, GlooConnections& kept) {
    std::shared_ptr<Communicator> world = kept.world("kept/e0", 0, iota_processes(n), {});
    ProcessGroups pg;
    pg.initialize(*world, cfg);
    for (Communicator* c : {world.get(), &pg.group(GroupKind::tp)}) {
      const auto size = static_cast<std::int64_t>(c->size());
      for (int i = 0; i < 700; ++i) {
        std::vector<std::int64_t> v(i % 2 == 0 ? 1 : 8, c->rank() + i);
        c->allreduce(std::span<std::int64_t>(v), ReduceOp::sum)->wait();
        ASSERT_EQ(v[0], size * (size - 1) / 2 + size * i) << c->name() << ", allreduce " << i;
      }
      for (int i = 0; i < 300; ++i) {
        const std::int64_t mine = c->rank() * 1000 + i;
        std::vector<std::int64_t> all(static_cast<std::size_t>(size));
        c->allgather(&mine, all.data(), 1, DataType::int64)->wait();
        for (std::int64_t r = 0; r < size; ++r)
          ASSERT_EQ(all[static_cast<std::size_t>(r)], r * 1000 + i) << c->name();
        c->barrier()->wait();
      }
      const int peer = static_cast<int>((c->rank() + 1) % size);
      const int from = static_cast<int>((c->rank() + size - 1) % size);
      for (const int tag : {0, 255, 256, 65535, 65536, 0x7fffff, 0x7fffffff}) {
        std::int64_t out = std::int64_t{tag} + c->rank(), in = -1;
        const P2POp ops[] = {P2POp::send(std::span<const std::int64_t>(&out, 1), peer, tag),
                             P2POp::recv(std::span<std::int64_t>(&in, 1), from, tag)};
        c->batch_isend_irecv(ops)->wait();
        ASSERT_EQ(in, std::int64_t{tag} + from) << c->name() << ", tag " << tag;
      }
    }
    pg.destroy();
    world.reset();
    both.arrive_and_wait();
    EXPECT_EQ(kept.end_epoch(), std::vector<std::int64_t>{}) << "process " << process;
    both.arrive_and_wait();
  });
}

// Process 2 never joins the allreduce of processes 0 and 1 and ends its epoch instead: its
// notice ends their blocked wait at once (the timeout is 20 s). The pairs that held the
// unfinished allreduce are listed by their ends, made anew in epoch 1, and carry it.
TEST(GlooKeptConnections, AnEpochsEndReachesABlockedPeerAtOnceAndItsUnfinishedPairsAreMadeAnew) {
  constexpr int n = 3;
  std::mutex m;
  std::vector<std::vector<std::int64_t>> listed(n);
  std::atomic<int> ended{0};
  std::atomic<double> blocked_for{0};
  std::atomic<int> entering{0};
  run_processes(n, [&](int process, GlooConnections& kept) {
    std::unique_ptr<Communicator> world = kept.world("kept/e0", 0, iota_processes(n), {});
    EXPECT_EQ(sum_of_ranks(*world), 3);
    if (process == 2) {
      // Both others are at their allreduce (each posts its first step on entering it);
      // a moment more, and they are blocked in it.
      while (entering.load() < 2) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(500ms);
    } else {
      ++entering;
      const auto t0 = std::chrono::steady_clock::now();
      std::int64_t one = 1, out = 0;
      EXPECT_THROW(world->allreduce(&one, &out, 1, DataType::int64, ReduceOp::sum)->wait(),
                   AbortedError);
      blocked_for = std::max(blocked_for.load(), seconds_since(t0));
    }
    world.reset();
    const std::vector<std::int64_t> mine = kept.end_epoch();
    {
      const std::lock_guard lock(m);
      listed[static_cast<std::size_t>(process)] = mine;
    }
    ++ended;
    while (ended.load() < n) std::this_thread::sleep_for(1ms);  // the "agreement"
    world = kept.world("kept/e1", 1, iota_processes(n), to_renew(listed, process));
    for (int i = 0; i < 3; ++i) EXPECT_EQ(sum_of_ranks(*world), 3);
  });
  // Ended by the notice, long before the 20 s timeout (a loaded machine may take a while).
  EXPECT_LT(blocked_for.load(), 10.0);
  // Processes 0 and 1 left an allreduce unfinished with each other, at least.
  std::set<std::int64_t> zero(listed[0].begin(), listed[0].end());
  EXPECT_EQ(zero.count(1), 1U);
  EXPECT_EQ(listed[2], std::vector<std::int64_t>{});  // it posted nothing
}

// Process 3 ends its epoch while the other three are blocked in an allreduce it never
// joins: its notice ends their waits, and they, having learned of the end by it, send no
// notices of their own (process 3 sent one to every peer): an epoch's end costs the job a
// notice per peer of each process that found the failure itself, not one per pair. The
// next epoch's world carries allreduces.
TEST(GlooKeptConnections, AProcessThatLearnedOfTheEndByANoticeSendsNone) {
  constexpr int n = 4;
  std::atomic<int> entering{0}, ended{0};
  std::mutex m;
  std::vector<std::vector<std::int64_t>> listed(n);
  std::vector<std::int64_t> sent(n, -1);
  run_processes(n, [&](int process, GlooConnections& kept) {
    std::unique_ptr<Communicator> world = kept.world("kept/e0", 0, iota_processes(n), {});
    EXPECT_EQ(sum_of_ranks(*world), 6);
    EXPECT_EQ(kept.notices_sent(), 0);
    if (process == 3) {
      while (entering.load() < 3) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(300ms);
    } else {
      ++entering;
      std::int64_t one = 1, out = 0;
      EXPECT_THROW(world->allreduce(&one, &out, 1, DataType::int64, ReduceOp::sum)->wait(),
                   AbortedError);
    }
    world.reset();
    const std::vector<std::int64_t> mine = kept.end_epoch();
    {
      const std::lock_guard lock(m);
      listed[static_cast<std::size_t>(process)] = mine;
      sent[static_cast<std::size_t>(process)] = kept.notices_sent();
    }
    ++ended;
    while (ended.load() < n) std::this_thread::sleep_for(1ms);  // the "agreement"
    world = kept.world("kept/e1", 1, iota_processes(n), to_renew(listed, process));
    for (int i = 0; i < 3; ++i) EXPECT_EQ(sum_of_ranks(*world), 6);
  });
  EXPECT_EQ(sent, (std::vector<std::int64_t>{0, 0, 0, 3}));
}

// A group whose operation passes its deadline ends alone: its pairs stay open, and the
// world over the same pairs goes on. (Timeout 6 s, process 1 comes at 8 s: each world
// allreduce has seconds to spare on a loaded machine.)
TEST(GlooKeptConnections, AGroupPastItsDeadlineEndsAloneAndTheWorldGoesOn) {
  constexpr int n = 2;
  run_processes(
      n,
      [&](int process, GlooConnections& kept) {
        std::unique_ptr<Communicator> world = kept.world("kept/e0", 0, iota_processes(n), {});
        const std::vector<Rank> both{0, 1};
        std::unique_ptr<Communicator> pair = world->create_group(both, "pair");
        ASSERT_NE(pair, nullptr);
        if (process == 0) {
          std::int64_t one = 1, out = 0;
          EXPECT_THROW(pair->allreduce(&one, &out, 1, DataType::int64, ReduceOp::sum)->wait(),
                       TimeoutError);
        } else {
          // Never joins that allreduce; comes to the world's once process 0 is there.
          std::this_thread::sleep_for(8s);
        }
        for (int i = 0; i < 3; ++i) EXPECT_EQ(sum_of_ranks(*world), 1);
      },
      6s);
}

}  // namespace
}  // namespace commgrid::test
