// The NCCL backend's host-side parts, for real and without a GPU: unique ids and host
// information exchanged over a Gloo bootstrap of rank-threads, device choice, option checks,
// error texts and the type mapping.
#include <gtest/gtest.h>
#include <nccl.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <thread>
#include <vector>

#include "commgrid/gloo.hpp"
#include "commgrid/local_ranks.hpp"
#include "commgrid/nccl.hpp"
#include "nccl_host.hpp"
#include "nccl_memory.hpp"
#include "nccl_test_support.hpp"
#include "nccl_types.hpp"

namespace commgrid {
namespace {

using namespace std::chrono_literals;
using nccl_host::HostInfo;
using nccl_host::UniqueId;
using nccl_test::over;

GlooOptions quick() {
  GlooOptions o;
  o.timeout = 20s;
  return o;
}

UniqueId real_unique_id() {
  ncclUniqueId id;
  const ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc != ncclSuccess)
    throw BackendError(std::string("ncclGetUniqueId: ") + ncclGetErrorString(rc));
  UniqueId out{};
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

UniqueId pattern_id(int seed) {
  UniqueId id{};
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<unsigned char>(seed * 31 + i);
  return id;
}

using nccl_test::message_of;

TEST(NcclHost, RootsRealUniqueIdReachesEveryRank) {
  constexpr int kRanks = 4;
  std::mutex mu;
  std::vector<UniqueId> got(kRanks);
  std::atomic<int> made{0};
  run_local_ranks(
      kRanks,
      [&](Communicator& world) {
        const UniqueId id = nccl_host::broadcast_unique_id(
            world, 2,
            [&] {
              ++made;
              return real_unique_id();
            },
            "test");
        std::lock_guard lock(mu);
        got[static_cast<std::size_t>(world.rank())] = id;
      },
      quick());
  EXPECT_EQ(made.load(), 1);  // only the root makes one
  for (int r = 1; r < kRanks; ++r)
    EXPECT_EQ(got[static_cast<std::size_t>(r)], got[0]) << "rank " << r;
  EXPECT_NE(got[0], UniqueId{}) << "NCCL's id is not all zero";
}

TEST(NcclHost, RootFailingToMakeAnIdFailsEveryRankWithItsReason) {
  LocalRunResult run = run_local_ranks_collect(
      3,
      [&](Communicator& world) {
        nccl_host::broadcast_unique_id(
            world, 0,
            []() -> UniqueId { throw BackendError("ncclGetUniqueId: no socket interface found"); },
            "create world");
      },
      quick());
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(run.errors[static_cast<std::size_t>(r)]) << "rank " << r;
    const std::string msg =
        message_of([&] { std::rethrow_exception(run.errors[static_cast<std::size_t>(r)]); });
    EXPECT_NE(msg.find("nccl create world: rank 0 of world could not make the NCCL unique id: "
                       "ncclGetUniqueId: no socket interface found"),
              std::string::npos)
        << msg;
  }
}

TEST(NcclHost, MemberOnlyIdsGoToTheirGroupsOnly) {
  // Two rounds of disjoint groups, as two kinds of a layout: only members call, in the same
  // order on every member.
  constexpr int kRanks = 4;
  const std::vector<std::vector<Rank>> round1 = {{0, 1}, {2, 3}}, round2 = {{0, 2}, {1, 3}};
  std::mutex mu;
  std::vector<std::vector<UniqueId>> got(kRanks);
  std::atomic<int> made{0};
  run_local_ranks(
      kRanks,
      [&](Communicator& world) {
        const int me = world.rank();
        for (const auto* round : {&round1, &round2}) {
          for (std::size_t g = 0; g < round->size(); ++g) {
            const std::vector<Rank>& members = (*round)[g];
            if (std::find(members.begin(), members.end(), me) == members.end()) continue;
            const std::string name =
                std::string(round == &round1 ? "tp" : "dp") + "#" + std::to_string(g);
            const UniqueId id = nccl_host::distribute_unique_id(world, members, name, [&] {
              ++made;
              return pattern_id(static_cast<int>(round == &round1 ? 10 : 20) + me);
            });
            std::lock_guard lock(mu);
            got[static_cast<std::size_t>(me)].push_back(id);
          }
        }
      },
      quick());
  EXPECT_EQ(made.load(), 4);  // one per group: its first member
  EXPECT_EQ(got[0][0], pattern_id(10));
  EXPECT_EQ(got[1][0], pattern_id(10));
  EXPECT_EQ(got[2][0], pattern_id(12));
  EXPECT_EQ(got[3][0], pattern_id(12));
  EXPECT_EQ(got[0][1], pattern_id(20));
  EXPECT_EQ(got[2][1], pattern_id(20));
  EXPECT_EQ(got[1][1], pattern_id(21));
  EXPECT_EQ(got[3][1], pattern_id(21));
}

TEST(NcclHost, MemberWithAnotherGroupNameFailsNamingTheLeader) {
  LocalRunResult run = run_local_ranks_collect(
      2,
      [&](Communicator& world) {
        const std::vector<Rank> members = {0, 1};
        nccl_host::distribute_unique_id(world, members, world.rank() == 0 ? "tp#0" : "pp#0",
                                        [] { return pattern_id(1); });
      },
      quick());
  EXPECT_FALSE(run.errors[0]) << "the leader sent its id and returns";
  ASSERT_TRUE(run.errors[1]);
  const std::string msg = message_of([&] { std::rethrow_exception(run.errors[1]); });
  EXPECT_NE(msg.find("nccl create_group for pp#0: rank 0 of world (the first member) sent the "
                     "id of a group with another name"),
            std::string::npos)
      << msg;
}

TEST(NcclHost, HostInfoExchangeAndLocalRanksOnOneHost) {
  constexpr int kRanks = 3;
  std::mutex mu;
  std::vector<nccl_host::LocalRank> local(kRanks);
  std::vector<std::vector<HostInfo>> seen(kRanks);
  run_local_ranks(
      kRanks,
      [&](Communicator& world) {
        HostInfo mine;
        mine.host = "node-a";
        mine.device_count = 8;
        mine.device = world.rank();
        mine.bus_id = "0000:0" + std::to_string(world.rank()) + ":00.0";
        mine.problem = world.rank() == 2 ? std::string(300, 'x') : "";  // cut to fit its field
        auto all = nccl_host::exchange_host_info(world, mine);
        std::lock_guard lock(mu);
        local[static_cast<std::size_t>(world.rank())] = nccl_host::local_rank_of(all, world.rank());
        seen[static_cast<std::size_t>(world.rank())] = std::move(all);
      },
      quick());
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(local[static_cast<std::size_t>(r)].rank, r);
    EXPECT_EQ(local[static_cast<std::size_t>(r)].size, kRanks);
    const auto& all = seen[static_cast<std::size_t>(r)];
    ASSERT_EQ(all.size(), 3u);
    EXPECT_EQ(all[1].host, "node-a");
    EXPECT_EQ(all[1].device, 1);
    EXPECT_EQ(all[1].device_count, 8);
    EXPECT_EQ(all[1].bus_id, "0000:01:00.0");
    EXPECT_EQ(all[2].problem, std::string(199, 'x'));
  }
}

TEST(NcclHost, LocalRankCountsOnlyTheSameHost) {
  std::vector<HostInfo> all(5);
  const char* hosts[] = {"a", "b", "a", "b", "a"};
  for (std::size_t i = 0; i < all.size(); ++i) all[i].host = hosts[i];
  EXPECT_EQ(nccl_host::local_rank_of(all, 0).rank, 0);
  EXPECT_EQ(nccl_host::local_rank_of(all, 2).rank, 1);
  EXPECT_EQ(nccl_host::local_rank_of(all, 4).rank, 2);
  EXPECT_EQ(nccl_host::local_rank_of(all, 4).size, 3);
  EXPECT_EQ(nccl_host::local_rank_of(all, 3).rank, 1);
  EXPECT_EQ(nccl_host::local_rank_of(all, 3).size, 2);
}

TEST(NcclHost, DeviceChoice) {
  using nccl_host::choose_device;
  EXPECT_EQ(choose_device(std::nullopt, {3, 8}, 8, "h", ""), 3);
  EXPECT_EQ(choose_device(std::nullopt, {3, 8}, 1, "h", ""), 0);  // one visible device each
  EXPECT_EQ(choose_device(5, {0, 1}, 8, "h", ""), 5);
  EXPECT_EQ(message_of([] {
              choose_device(std::nullopt, {2, 3}, 2, "gpu7", "");
            }),
            "local rank 2 of 3 on host gpu7 has no CUDA device of its own (this process sees "
            "2); start at most 2 ranks per host, or give each process one device with "
            "CUDA_VISIBLE_DEVICES");
  EXPECT_THROW(choose_device(std::nullopt, {2, 3}, 2, "gpu7", ""), InvalidValueError);
  EXPECT_EQ(message_of([] {
              choose_device(4, {0, 1}, 2, "gpu7", "");
            }),
            "device 4 is not in [0, 2): the CUDA devices this process sees on host gpu7");
  EXPECT_THROW(choose_device(0, {0, 1}, 0, "h", "no CUDA device (test)"), BackendError);
  EXPECT_EQ(message_of([] {
              choose_device(0, {0, 1}, 0, "h", "no CUDA device (test)");
            }),
            "no CUDA device (test)");
}

TEST(NcclHost, WorldProblemIsTheSameTextForEveryRank) {
  std::vector<HostInfo> all(3);
  for (std::size_t i = 0; i < all.size(); ++i) {
    all[i].host = "gpu7";
    all[i].device = static_cast<int>(i);
    all[i].bus_id = "0000:0" + std::to_string(i) + ":00.0";
  }
  EXPECT_EQ(nccl_host::world_problem(all), "");
  all[2].device = 1;
  all[2].bus_id = all[1].bus_id;
  EXPECT_EQ(nccl_host::world_problem(all),
            "ranks 1 and 2 on host gpu7 both chose CUDA device 1 (bus 0000:01:00.0); NCCL "
            "needs one GPU per rank");
  all[2].host = "gpu8";  // same bus id on another host is another device
  EXPECT_EQ(nccl_host::world_problem(all), "");
  all[1].problem = "no CUDA device (test)";
  EXPECT_EQ(nccl_host::world_problem(all), "rank 1 (host gpu7): no CUDA device (test)");
}

TEST(NcclHost, WorldProblemReportsTheLowestPairAsThePairwiseScanDid) {
  // Ranks 1 and 2 share a device, and so do ranks 0 and 3: the pair with the lowest first
  // rank is (0, 3), not the first duplicate met (2).
  std::vector<HostInfo> all(4);
  const char* bus[] = {"A", "B", "B", "A"};
  for (std::size_t i = 0; i < all.size(); ++i) {
    all[i].host = "gpu7";
    all[i].device = static_cast<int>(i);
    all[i].bus_id = bus[i];
  }
  const std::string want =
      "ranks 0 and 3 on host gpu7 both chose CUDA device 0 (bus A); NCCL needs one GPU per rank";
  EXPECT_EQ(nccl_host::world_problem(all), want);
  EXPECT_EQ(nccl_host::world_problem_pairwise(all), want);
  // Ranks without a bus id (no device) never pair; the same bus id on two hosts neither.
  all[0].bus_id = all[3].bus_id = "";
  EXPECT_EQ(nccl_host::world_problem(all).rfind("ranks 1 and 2 ", 0), 0u);
  all[2].host = "gpu8";
  EXPECT_EQ(nccl_host::world_problem(all), "");
  // A world whose every rank names one host and one device: the first two ranks.
  std::vector<HostInfo> same(5000);
  for (HostInfo& h : same) {
    h.host = "localhost";
    h.bus_id = "0000:3b:00.0";
  }
  EXPECT_EQ(nccl_host::world_problem(same).rfind("ranks 0 and 1 on host localhost ", 0), 0u);
}

TEST(NcclHost, WorldProblemFindsEveryProblemThePairwiseScanFound) {
  // Random worlds dense in collisions: few hosts, few bus ids, some ranks without a device
  // or with a problem of their own. The one-pass check must give the same text every time.
  std::mt19937 rng(20240522);
  int problems = 0, shared = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const auto n = static_cast<std::size_t>(1 + rng() % 40);
    const unsigned hosts = 1 + rng() % 4, buses = 1 + rng() % 48;
    std::vector<HostInfo> all(n);
    for (std::size_t r = 0; r < n; ++r) {
      all[r].host = "h" + std::to_string(rng() % hosts);
      const unsigned b = rng() % (buses + 2);
      all[r].bus_id = b >= buses ? "" : "0000:" + std::to_string(b) + ":00.0";
      all[r].device = static_cast<int>(b);
      if (rng() % 200 == 0) all[r].problem = "no CUDA device (trial " + std::to_string(trial) + ")";
    }
    const std::string want = nccl_host::world_problem_pairwise(all);
    ASSERT_EQ(nccl_host::world_problem(all), want) << "trial " << trial;
    problems += want.empty() ? 0 : 1;
    shared += want.rfind("ranks ", 0) == 0 ? 1 : 0;
  }
  // The trials covered clean worlds, ranks' own problems and shared devices alike.
  EXPECT_GT(shared, 300);
  EXPECT_GT(problems - shared, 30);
  EXPECT_LT(problems, 3000);
}

TEST(NcclHost, BuffersInPlaceStagedOrRefused) {
  using nccl_host::MemoryKind;
  using nccl_host::use_in_place;
  EXPECT_TRUE(use_in_place(MemoryKind::device, 2, 2, "allreduce", "world", "send"));
  EXPECT_TRUE(use_in_place(MemoryKind::managed, 0, 2, "allreduce", "world", "send"));
  EXPECT_FALSE(use_in_place(MemoryKind::host, -1, 2, "allreduce", "world", "send"));
  EXPECT_FALSE(use_in_place(MemoryKind::pinned_host, 0, 2, "allreduce", "world", "send"));
  // Another device's memory: refused before NCCL sees it, naming the buffer and both devices.
  EXPECT_EQ(message_of([] { use_in_place(MemoryKind::device, 1, 0, "allreduce", "tp#3", "recv"); }),
            "nccl allreduce on tp#3: recv buffer is memory of CUDA device 1, and this "
            "communicator's device is 0");
  try {
    use_in_place(MemoryKind::device, 1, 0, "send", "pp#0", "buf");
    ADD_FAILURE() << "no exception";
  } catch (const ConfigError& e) { EXPECT_EQ(e.parameter(), "buf"); }
}

TEST(NcclHost, AnAbortedOperationIsNeverReportedComplete) {
  using nccl_host::judge;
  using nccl_host::WorkLook;
  using nccl_host::WorkVerdict;
  auto look = [](bool done, bool cuda, bool aborted, bool nccl, bool late) {
    WorkLook l;
    l.event_done = done;
    l.event_error = cuda;
    l.aborted = aborted;
    l.nccl_error = nccl;
    l.past_deadline = late;
    return judge(l);
  };
  EXPECT_EQ(look(false, false, false, false, false), WorkVerdict::pending);
  EXPECT_EQ(look(true, false, false, false, false), WorkVerdict::complete);
  EXPECT_EQ(look(true, false, false, false, true), WorkVerdict::complete) << "done in time to see";
  EXPECT_EQ(look(false, false, false, false, true), WorkVerdict::timed_out);
  // The defect: an abort ends the kernels, so the event completes with garbage behind it.
  EXPECT_EQ(look(true, false, true, false, false), WorkVerdict::aborted);
  EXPECT_EQ(look(false, false, true, false, true), WorkVerdict::aborted);
  // NCCL stops the kernels of a failed communicator as well.
  EXPECT_EQ(look(true, false, false, true, false), WorkVerdict::nccl_error);
  EXPECT_EQ(look(false, false, false, true, true), WorkVerdict::nccl_error);
  EXPECT_EQ(look(false, true, true, true, true), WorkVerdict::cuda_error);
}

TEST(NcclHost, AnUnreadNcclStateNeverMakesAnOperationComplete) {
  // done() does not wait for another thread's call on the communicator: it may not read
  // NCCL's state, and then a completed event is not enough (an NCCL error may be unseen).
  nccl_host::WorkLook l;
  l.event_done = true;
  l.nccl_unknown = true;
  EXPECT_EQ(nccl_host::judge(l), nccl_host::WorkVerdict::pending);
  l.aborted = true;  // what is known still counts
  EXPECT_EQ(nccl_host::judge(l), nccl_host::WorkVerdict::aborted);
  l.aborted = false;
  l.nccl_unknown = false;
  EXPECT_EQ(nccl_host::judge(l), nccl_host::WorkVerdict::complete);
}

// A fake communicator: alive until destroyed, counting the calls running on it.
struct FakeComm {
  std::atomic<bool> alive{true};
  std::atomic<int> in_calls{0};
  std::atomic<int> calls_after_death{0};
};

TEST(NcclHost, AbortFromAnotherThreadNeverDestroysUnderARunningCall) {
  FakeComm fake;
  std::atomic<int> calls_during_destroy{-1};
  std::atomic<bool> stopping_seen_by_destroy{false};
  nccl_host::AbortableHandle<FakeComm*> handle(&fake, [&](FakeComm* c) {
    calls_during_destroy = c->in_calls.load();
    c->alive = false;
  });
  std::atomic<bool> in_first_call{false};
  std::atomic<int> done_calls{0};
  std::thread user([&] {
    // Calls as a polling loop makes them, until the handle refuses; the first one is long, so
    // that the abort below comes while it runs.
    for (int i = 0;; ++i) {
      const auto r = handle.use([&](FakeComm* c) {
        ++c->in_calls;
        if (!c->alive) ++c->calls_after_death;
        if (i == 0) {
          in_first_call = true;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        --c->in_calls;
        return i;
      });
      if (!r) break;
      ++done_calls;
    }
  });
  while (!in_first_call) std::this_thread::yield();
  std::thread watchdog([&] {
    EXPECT_TRUE(handle.abort("watchdog: allreduce on tp#0 timed out"));
    stopping_seen_by_destroy = handle.aborted();
  });
  watchdog.join();
  user.join();
  EXPECT_EQ(calls_during_destroy.load(), 0) << "destroyed while a call ran on the handle";
  EXPECT_FALSE(fake.alive);
  EXPECT_EQ(fake.calls_after_death.load(), 0);
  EXPECT_GE(done_calls.load(), 1);
  EXPECT_TRUE(stopping_seen_by_destroy);
  EXPECT_EQ(handle.reason(), "watchdog: allreduce on tp#0 timed out");
  EXPECT_EQ(handle.peek(), nullptr);
  EXPECT_FALSE(handle.use([](FakeComm*) { return 1; }).has_value());
  // A second abort neither destroys again nor replaces the reason, and returns at once.
  EXPECT_FALSE(handle.abort("later"));
  EXPECT_EQ(handle.reason(), "watchdog: allreduce on tp#0 timed out");
}

TEST(NcclHost, EveryAbortReturnsOnlyOnceTheHandleIsDestroyed) {
  // Two threads abort at once: the one that loses must not return before the winner's
  // destruction ended (a split relies on it: NCCL writes the child while the parent's abort
  // runs).
  for (int round = 0; round < 50; ++round) {
    FakeComm fake;
    std::atomic<bool> destroyed{false};
    nccl_host::AbortableHandle<FakeComm*> handle(&fake, [&](FakeComm* c) {
      std::this_thread::sleep_for(std::chrono::milliseconds(round % 3));
      c->alive = false;
      destroyed = true;
    });
    std::atomic<int> destroyed_seen_after_return{0}, winners{0};
    auto aborter = [&] {
      winners += handle.abort("r") ? 1 : 0;
      destroyed_seen_after_return += destroyed ? 1 : 0;
    };
    std::thread a(aborter), b(aborter);
    a.join();
    b.join();
    ASSERT_EQ(winners.load(), 1) << "round " << round;
    ASSERT_EQ(destroyed_seen_after_return.load(), 2) << "round " << round;
  }
}

TEST(NcclHost, ReleasedHandlesAreNotDestroyed) {
  FakeComm fake;
  int destroyed = 0;
  nccl_host::AbortableHandle<FakeComm*> handle(&fake, [&](FakeComm*) { ++destroyed; });
  EXPECT_EQ(handle.use([](FakeComm* c) { return c->alive.load(); }), std::optional<bool>(true));
  EXPECT_EQ(handle.release(), &fake);
  EXPECT_FALSE(handle.abort("after release"));
  EXPECT_EQ(destroyed, 0);
}

TEST(NcclHost, TryUseNeverWaitsForACallOrAnAbortInProgress) {
  using nccl_host::TryUse;
  FakeComm fake;
  std::atomic<bool> in_destroy{false}, let_destroy_end{false};
  nccl_host::AbortableHandle<FakeComm*> handle(&fake, [&](FakeComm* c) {
    in_destroy = true;
    const auto until =
        std::chrono::steady_clock::now() + 30s;  // a broken try_use fails, never hangs
    while (!let_destroy_end && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(1ms);
    c->alive = false;
  });
  EXPECT_EQ(handle.try_use([](FakeComm* c) { return c->alive.load(); }),
            std::make_pair(TryUse::ran, std::optional<bool>(true)));
  // Another thread is inside use(): try_use answers busy at once. The call ends only after
  // try_use has returned, so a try_use that waited for the lock would see it ended (ran).
  std::atomic<bool> in_call{false}, let_call_end{false}, call_ended{false};
  std::thread user([&] {
    (void)handle.use([&](FakeComm*) {
      in_call = true;
      const auto until = std::chrono::steady_clock::now() + 30s;
      while (!let_call_end && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(1ms);
      return 0;
    });
    call_ended = true;
  });
  while (!in_call) std::this_thread::yield();
  int calls = 0;
  const auto busy = handle.try_use([&](FakeComm*) { return ++calls; });
  const bool ended_first = call_ended.load();
  let_call_end = true;
  user.join();
  EXPECT_EQ(busy.first, TryUse::busy);
  EXPECT_FALSE(busy.second.has_value());
  EXPECT_EQ(calls, 0);
  EXPECT_FALSE(ended_first) << "try_use waited for the call in progress";
  // An abort is destroying the handle (and holds the lock): try_use says stopped at once.
  std::thread watchdog([&] { handle.abort("watchdog"); });
  while (!in_destroy) std::this_thread::yield();
  const auto during = handle.try_use([&](FakeComm*) { return ++calls; });
  const bool destroyed_first = !fake.alive.load();
  let_destroy_end = true;
  watchdog.join();
  EXPECT_EQ(during.first, TryUse::stopped);
  EXPECT_FALSE(destroyed_first) << "try_use waited for the destruction";
  EXPECT_EQ(handle.try_use([&](FakeComm*) { return ++calls; }).first, TryUse::stopped);
  EXPECT_EQ(calls, 0);
}

TEST(NcclHost, AnOwnedHandleIsDestroyedOnceByWhoeverHoldsItLast) {
  // init_comm hands its communicator on as an owner (aborting unless released); the State
  // takes it over, after which only its abort destroys it.
  struct Counting {
    int* destroyed;
    void operator()(FakeComm* c) const noexcept {
      ++*destroyed;
      c->alive = false;
    }
  };
  using Owned = std::unique_ptr<FakeComm, Counting>;
  int destroyed = 0;
  {
    FakeComm lost;
    Owned never_handed_on(&lost, Counting{&destroyed});
    // a failure between creation and the State: the owner destroys it
  }
  EXPECT_EQ(destroyed, 1);
  FakeComm fake;
  Owned owned(&fake, Counting{&destroyed});
  {
    nccl_host::AbortableHandle<FakeComm*> handle(std::move(owned));
    EXPECT_EQ(owned.get(), nullptr) << "the owner gave it up";
    EXPECT_EQ(handle.peek(), &fake);
    EXPECT_EQ(destroyed, 1);
    EXPECT_TRUE(handle.abort("creation failed"));
    EXPECT_EQ(destroyed, 2);
    EXPECT_FALSE(fake.alive);
    EXPECT_FALSE(handle.abort("again"));
  }
  EXPECT_EQ(destroyed, 2) << "destroyed once, by the abort";
  // Released (the State's orderly finalization): the handle never destroys it.
  FakeComm kept;
  {
    nccl_host::AbortableHandle<FakeComm*> handle(Owned(&kept, Counting{&destroyed}));
    EXPECT_EQ(handle.release(), &kept);
  }
  EXPECT_EQ(destroyed, 2);
  EXPECT_TRUE(kept.alive);
}

TEST(NcclHost, StagingCachesGrowWithTheCommunicatorsAliveNotWithThoseEverMade) {
  nccl_host::BlockCache cache;
  std::vector<std::unique_ptr<char[]>> blocks;
  int makes = 0;
  const nccl_host::BlockCache::Make make = [&](std::size_t bytes) -> void* {
    ++makes;
    blocks.push_back(std::make_unique<char[]>(bytes));
    return blocks.back().get();
  };
  const nccl_host::Seed seed[] = {{4096, 4}, {65536, 1}};
  EXPECT_EQ(nccl_host::size_class(1), 4096u);
  EXPECT_EQ(nccl_host::size_class(4097), 8192u);
  EXPECT_EQ(nccl_host::size_class(65536), 65536u);
  // 100 communicators made and destroyed one after another: the first one's blocks serve all.
  for (int i = 0; i < 100; ++i) {
    cache.attach(seed, make);
    cache.detach();
  }
  EXPECT_EQ(makes, 5);
  EXPECT_EQ(cache.free_blocks(4096), 4u);
  EXPECT_EQ(cache.free_blocks(65536), 1u);
  // Three alive at once: three seeds.
  for (int i = 0; i < 3; ++i) cache.attach(seed, make);
  EXPECT_EQ(cache.users(), 3);
  EXPECT_EQ(cache.owned_blocks(4096), 12u);
  EXPECT_EQ(cache.owned_blocks(65536), 3u);
  EXPECT_EQ(makes, 15);
  // Seeded blocks are taken without making any; when a class has none free, a larger one
  // serves (an 8 KiB request takes a 64 KiB block); only then does a miss make one.
  std::vector<nccl_host::BlockCache::Block> taken;
  for (int i = 0; i < 12; ++i) taken.push_back(cache.take_or_make(4096, make));
  EXPECT_EQ(makes, 15);
  const nccl_host::BlockCache::Block bigger = cache.take_or_make(8192, make);
  EXPECT_EQ(bigger.cls, 65536u);
  EXPECT_EQ(makes, 15);
  cache.give(bigger.ptr, bigger.cls);
  taken.push_back(cache.take_or_make(4096, make));  // 4 KiB all taken: a 64 KiB one
  EXPECT_EQ(taken.back().cls, 65536u);
  taken.push_back(cache.take_or_make(4096, make));
  taken.push_back(cache.take_or_make(4096, make));
  EXPECT_EQ(makes, 15);
  taken.push_back(cache.take_or_make(4096, make));  // nothing of 4 KiB or more is free
  EXPECT_EQ(makes, 16);
  EXPECT_EQ(taken.back().cls, 4096u);
  EXPECT_EQ(cache.owned_blocks(4096), 13u);
  std::set<void*> distinct;
  for (const auto& b : taken) distinct.insert(b.ptr);
  EXPECT_EQ(distinct.size(), taken.size()) << "a block handed out twice";
  for (const auto& b : taken) cache.give(b.ptr, b.cls);
  EXPECT_EQ(cache.free_blocks(4096), 13u);
  EXPECT_EQ(cache.free_blocks(65536), 3u);
  // A block lost to a failed operation (copies still queued may use it) is made again by the
  // next communicator that attaches.
  (void)cache.take_or_make(65536, make);
  cache.lose(65536);
  EXPECT_EQ(cache.owned_blocks(65536), 2u);
  const int before = makes;
  cache.attach(seed, make);  // 4 alive: 16 of 4 KiB (13 owned), 4 of 64 KiB (2 owned)
  EXPECT_EQ(makes, before + 3 + 2);
  // A make that fails: not attached, what was made kept, the error passed on.
  int succeed = 1;
  const nccl_host::BlockCache::Make flaky = [&](std::size_t bytes) -> void* {
    if (succeed-- == 0) throw BackendError("cudaHostAlloc: out of memory");
    return make(bytes);
  };
  EXPECT_THROW(cache.attach(seed, flaky), BackendError);
  EXPECT_EQ(cache.users(), 4);
  EXPECT_EQ(cache.owned_blocks(4096), 17u);
  EXPECT_EQ(cache.owned_blocks(65536), 4u);
}

TEST(NcclHost, TheCommunicatorNameOutlivesItsSource) {
  // NCCL keeps config.commName's pointer for the communicator's life: the name must not be a
  // temporary of the creating call.
  nccl_backend::CommConfig cfg;
  {
    std::string temporary = "tp_dp_cp#12 (a name too long for any small-string buffer)";
    cfg = nccl_backend::nonblocking_config(temporary);
    temporary.assign(temporary.size(), 'x');
  }
  EXPECT_EQ(cfg.config.blocking, 0);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  ASSERT_NE(cfg.config.commName, nullptr);
  EXPECT_EQ(cfg.config.commName, cfg.name->c_str());
  // What a communicator's state keeps (the shared name) keeps NCCL's pointer valid after the
  // configuration itself is gone, moved or copied.
  const std::shared_ptr<const std::string> kept = cfg.name;
  const char* ptr = cfg.config.commName;
  nccl_backend::CommConfig moved = std::move(cfg);
  cfg = nccl_backend::nonblocking_config("other");
  EXPECT_EQ(moved.config.commName, ptr);
  moved = nccl_backend::CommConfig{};
  EXPECT_STREQ(ptr, "tp_dp_cp#12 (a name too long for any small-string buffer)");
  EXPECT_EQ(kept->c_str(), ptr);
#endif
}

TEST(NcclHost, ErrorTexts) {
  const std::vector<std::int64_t> members = {4, 5, 12, 13};
  EXPECT_EQ(
      nccl_host::timeout_message("split", "world", "tp#2 (color 2)", 2500ms, "world", members),
      "nccl split on world for tp#2 (color 2): did not complete within 2.5 s; world "
      "aborted (members [4,5,12,13])");
  EXPECT_EQ(nccl_host::timeout_message("allreduce", "dp#0", "", 1000ms, "dp#0", members),
            "nccl allreduce on dp#0: did not complete within 1 s; dp#0 aborted (members "
            "[4,5,12,13])");
  std::vector<std::int64_t> many(40);
  std::iota(many.begin(), many.end(), 0);
  EXPECT_EQ(nccl_host::members_text(many),
            "[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,... (40 ranks)]");
}

TEST(NcclHost, TypesAndReductionsMapToNcclsOwn) {
  using nccl_backend::nccl_op;
  using nccl_backend::nccl_type;
  EXPECT_EQ(nccl_type(DataType::float32), ncclFloat32);
  EXPECT_EQ(nccl_type(DataType::float64), ncclFloat64);
  EXPECT_EQ(nccl_type(DataType::bfloat16), ncclBfloat16);
  EXPECT_EQ(nccl_type(DataType::float16), ncclFloat16);
  EXPECT_EQ(nccl_type(DataType::int32), ncclInt32);
  EXPECT_EQ(nccl_type(DataType::int64), ncclInt64);
  EXPECT_EQ(nccl_type(DataType::int8), ncclInt8);
  EXPECT_EQ(nccl_type(DataType::uint8), ncclUint8);
  EXPECT_EQ(nccl_op(ReduceOp::sum), ncclSum);
  EXPECT_EQ(nccl_op(ReduceOp::prod), ncclProd);
  EXPECT_EQ(nccl_op(ReduceOp::max), ncclMax);
  EXPECT_EQ(nccl_op(ReduceOp::min), ncclMin);
  EXPECT_EQ(nccl_op(ReduceOp::avg), ncclAvg);
}

TEST(NcclHost, VersionOfTheLinkedLibrary) {
  const std::string v = nccl_version();
  std::smatch m;
  ASSERT_TRUE(std::regex_match(v, m, std::regex(R"((\d+)\.(\d+)\.(\d+))"))) << v;
  EXPECT_GE(std::stoi(m[1]) * 100 + std::stoi(m[2]), 218) << v;
}

TEST(NcclHost, BadOptionsAreRejectedBeforeAnyCommunication) {
  run_local_ranks(
      1,
      [&](Communicator& world) {
        NcclOptions bad_device;
        bad_device.device = -1;
        EXPECT_EQ(message_of([&] { (void)make_nccl_world(over(world, bad_device)); }),
                  "nccl world: device must be >= 0, got -1");
        EXPECT_THROW((void)make_nccl_world(over(world, bad_device)), InvalidValueError);
        NcclOptions bad_timeout;
        bad_timeout.timeout = 0ms;
        EXPECT_EQ(message_of([&] { (void)make_nccl_world(over(world, bad_timeout)); }),
                  "nccl world: timeout must be > 0 ms, got 0");
      },
      quick());
}

// Sets an environment variable for one scope and puts the old value back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(NcclHost, NcclVariablesThatWouldUndoTheTimeoutsAreRefusedOnEveryRank) {
  // NCCL reads these over the configuration commgrid gives it. Set before the rank-threads
  // start (setenv is not safe against threads reading the environment).
  using nccl_host::nccl_flag_on;
  EXPECT_FALSE(nccl_flag_on(nullptr));
  EXPECT_FALSE(nccl_flag_on(""));
  EXPECT_FALSE(nccl_flag_on("0"));
  EXPECT_FALSE(nccl_flag_on("00"));
  EXPECT_TRUE(nccl_flag_on("1"));
  EXPECT_TRUE(nccl_flag_on("-1"));
  EXPECT_TRUE(nccl_flag_on("yes"));
  EXPECT_TRUE(nccl_flag_on("0x"));
  struct Case {
    const char* name;
    const char* value;
    const char* says;
  };
  const Case cases[] = {
      {"NCCL_COMM_BLOCKING", "1",
       "nccl world: NCCL_COMM_BLOCKING=1 makes NCCL's creation and calls blocking, and commgrid "
       "bounds each of them by its timeout only on nonblocking communicators; unset it or set it "
       "to 0"},
      {"NCCL_COMM_SPLIT_SHARE_RESOURCES", "1",
       "nccl world: NCCL_COMM_SPLIT_SHARE_RESOURCES=1 makes a split's child share its parent's "
       "resources and abort flag, so that one group's abort (on a timeout) would abort the "
       "other; unset it or set it to 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const ScopedEnv env(c.name, c.value);
    LocalRunResult run = run_local_ranks_collect(
        2, [&](Communicator& world) { (void)make_nccl_world(over(world)); }, quick());
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(run.errors[static_cast<std::size_t>(r)]) << "rank " << r;
      try {
        std::rethrow_exception(run.errors[static_cast<std::size_t>(r)]);
      } catch (const ConfigError& e) {
        EXPECT_EQ(e.parameter(), c.name);
        EXPECT_EQ(std::string(e.what()), c.says);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": not a ConfigError: " << e.what();
      }
    }
  }
  // Off (0) is NCCL's own default for both: accepted.
  const ScopedEnv blocking("NCCL_COMM_BLOCKING", "0");
  const ScopedEnv share("NCCL_COMM_SPLIT_SHARE_RESOURCES", "0");
  EXPECT_NO_THROW(nccl_host::check_nccl_environment("nccl split on world for tp#0"));
}

TEST(NcclHost, ABufferCudaCannotPlaceIsAnErrorNeverHostMemory) {
  // Without a usable driver cudaPointerGetAttributes fails: the buffer is not staged as if it
  // were host memory (which would memcpy from what may be a device pointer). With a device,
  // CUDA's answers for each kind of memory.
  std::vector<std::int64_t> pageable(4);
  int dev = -1;
  if (cuda_device_count() == 0) {
    std::string msg;
    try {
      (void)nccl_backend::memory_kind(pageable.data(), &dev, "allreduce", "tp#1");
    } catch (const BackendError& e) { msg = e.what(); }
    EXPECT_EQ(msg.rfind("nccl allreduce on tp#1: cudaPointerGetAttributes: ", 0), 0u) << msg;
    return;
  }
  using nccl_host::MemoryKind;
  EXPECT_EQ(nccl_backend::memory_kind(pageable.data(), &dev, "allreduce", "world"),
            MemoryKind::host);
  void* pinned = nullptr;
  void* device = nullptr;
  void* managed = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 64), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&device, 64), cudaSuccess);
  ASSERT_EQ(cudaMallocManaged(&managed, 64), cudaSuccess);
  EXPECT_EQ(nccl_backend::memory_kind(pinned, &dev, "allreduce", "world"), MemoryKind::pinned_host);
  EXPECT_EQ(nccl_backend::memory_kind(device, &dev, "allreduce", "world"), MemoryKind::device);
  EXPECT_EQ(dev, 0);
  EXPECT_EQ(nccl_backend::memory_kind(managed, &dev, "allreduce", "world"), MemoryKind::managed);
  cudaFree(managed);
  cudaFree(device);
  cudaFreeHost(pinned);
}

TEST(NcclHost, WithoutADeviceEveryRankFailsAlikeAndNoneHangs) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a CUDA device; see NcclDevice";
  const std::string why = cuda_unavailable_reason();
  EXPECT_EQ(why.rfind("no CUDA device", 0), 0u) << why;
  const auto t0 = std::chrono::steady_clock::now();
  // A 100 s timeout: a rank left waiting for the others would show; a loaded machine not.
  GlooOptions slow = quick();
  slow.timeout = 100s;
  LocalRunResult run = run_local_ranks_collect(
      3, [&](Communicator& world) { (void)make_nccl_world(over(world)); }, slow);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 50s) << "a rank waited for its timeout";
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(run.errors[static_cast<std::size_t>(r)]) << "rank " << r;
    const std::string msg =
        message_of([&] { std::rethrow_exception(run.errors[static_cast<std::size_t>(r)]); });
    EXPECT_EQ(msg.rfind("nccl world: rank 0 (host ", 0), 0u) << msg;
    EXPECT_NE(msg.find("): " + why), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace commgrid
