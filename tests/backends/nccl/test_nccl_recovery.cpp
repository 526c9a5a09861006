// NCCL recovery (docs/nccl.md, "Recovery"): aborting an epoch's communicators, shrinking a
// world, the excluded ranks of a recovery decision, the world factory Recovery takes.
// NcclRecoveryHost runs everywhere (no device): argument checks and their typed errors, the
// excluded ranks, the compile-time choice of ncclCommShrink, the epoch's abort (idempotent,
// never waiting for a dead peer) on stand-in handles, and the factory without a device.
// NcclRecoveryDevice (any number of GPUs, 1 included) and NcclRecoveryDeviceMulti (2 or
// more) need a CUDA device and skip, saying why, without one; scripts/gpu-check runs them.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "commgrid/gloo.hpp"
#include "commgrid/local_ranks.hpp"
#include "commgrid/nccl.hpp"
#include "commgrid/process_groups.hpp"
#include "commgrid/recovery.hpp"
#include "commgrid/store.hpp"
#include "nccl_host.hpp"
#include "nccl_test_support.hpp"
#include "nccl_types.hpp"

namespace commgrid {
namespace {

using namespace std::chrono_literals;
using nccl_test::over;
using Ms = std::chrono::milliseconds;

using nccl_test::message_of;

// The parameter() of the ConfigError f throws; "(none)" when it throws none.
template <class F>
std::string parameter_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) { return e.parameter(); }
  return "(none)";
}

SparePlacement spares(std::int64_t s) {
  SparePlacement p;
  p.spares = s;
  return p;
}

// ---- what a shrink makes of a rank --------------------------------------------------------

TEST(NcclRecoveryHost, AShrinkKeepsTheSurvivorsInTheirOrder) {
  const Rank exclude[] = {3, 1};
  const nccl_host::WorldShrink p =
      nccl_host::plan_world_shrink(6, 4, exclude, "nccl shrink of world");
  EXPECT_EQ(p.exclude, (std::vector<int>{1, 3}));  // ascending, as NCCL is given it
  EXPECT_EQ(p.size, 4);
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.survivors, (std::vector<std::int64_t>{0, 2, 4, 5}));
  for (int r : {0, 2, 5})
    EXPECT_EQ(nccl_host::plan_world_shrink(6, r, exclude, "s")
                  .survivors[static_cast<std::size_t>(
                      nccl_host::plan_world_shrink(6, r, exclude, "s").rank)],
              r);
  // Excluding none: the same world (a world of 1 shrunk by nothing, the one-GPU device test).
  const nccl_host::WorldShrink none = nccl_host::plan_world_shrink(1, 0, {}, "s");
  EXPECT_TRUE(none.exclude.empty());
  EXPECT_EQ(none.size, 1);
  EXPECT_EQ(none.rank, 0);
  EXPECT_EQ(none.survivors, (std::vector<std::int64_t>{0}));
}

TEST(NcclRecoveryHost, BadShrinkArgumentsAreTypedErrorsNamingTheRank) {
  const std::string what = "nccl shrink of world";
  auto plan = [&](std::vector<Rank> exclude, int rank = 0) {
    return nccl_host::plan_world_shrink(4, rank, exclude, what);
  };
  EXPECT_THROW(plan({4}), RankOutOfRangeError);
  EXPECT_THROW(plan({-1}), RankOutOfRangeError);
  // Checked as 64-bit ranks: 2^32 + 1 does not wrap to rank 1.
  EXPECT_THROW(plan({(Rank{1} << 32) + 1}), RankOutOfRangeError);
  EXPECT_EQ(parameter_of([&] { plan({4}); }), "exclude");
  EXPECT_EQ(message_of([&] {
              plan({1, 4});
            }),
            "nccl shrink of world: excluded rank 4 is not in [0, 4)");
  EXPECT_THROW(plan({2, 2}), InvalidValueError);
  EXPECT_EQ(message_of([&] { plan({2, 3, 2}); }), "nccl shrink of world: rank 2 is excluded twice");
  EXPECT_THROW(plan({1}, 1), InvalidValueError);
  EXPECT_EQ(parameter_of([&] { plan({1}, 1); }), "exclude");
  EXPECT_EQ(message_of([&] {
              plan({0, 1}, 1);
            }),
            "nccl shrink of world: this rank (1) is excluded; an excluded rank takes no part in "
            "the shrink, only the survivors call it");
  // Every one a ConfigError, as the other backends' argument errors.
  EXPECT_THROW(plan({9}), ConfigError);
  EXPECT_THROW(plan({1}, 1), ConfigError);
}

// ---- the excluded ranks of a recovery decision ---------------------------------------------

TEST(NcclRecoveryHost, ExcludedRanksAreTheLogicalRanksTheDeadHeld) {
  const RankMap m0(4, spares(2));  // ranks 0-3 on processes 0-3, spares 4 and 5
  const std::int64_t two[] = {2};
  EXPECT_EQ(nccl_excluded_ranks(m0, two), (std::vector<Rank>{2}));
  const std::int64_t several[] = {3, 0, 3};  // any order, duplicates ignored
  EXPECT_EQ(nccl_excluded_ranks(m0, several), (std::vector<Rank>{0, 3}));
  const std::int64_t spare[] = {5};  // a dead spare held no rank
  EXPECT_TRUE(nccl_excluded_ranks(m0, spare).empty());
  // Epoch 1: process 4 holds rank 2; its death excludes rank 2 again, process 2 (dead in
  // epoch 1 already) adds nothing.
  const RankMap m1 = m0.replace(two);
  const std::int64_t later[] = {4, 2};
  EXPECT_EQ(nccl_excluded_ranks(m1, later), (std::vector<Rank>{2}));
  const std::int64_t stranger[] = {6};
  EXPECT_THROW((void)nccl_excluded_ranks(m0, stranger), RankOutOfRangeError);
  EXPECT_EQ(parameter_of([&] { (void)nccl_excluded_ranks(m0, stranger); }), "process");
}

// Shrink or afresh: a world whose every rank is a survivor in its old order is a shrink of
// the old one (the excluded: the dead and the dropped replicas' survivors); a spare that
// joins, or a change of order, needs a fresh world.
TEST(NcclRecoveryHost, AShrinkWithoutSparesIsAnNcclShrinkAndASpareMeansAFreshWorld) {
  const RankMap m0(8);  // tp 2 x dp 4, no spare
  EXPECT_EQ(nccl_shrink_exclusion(m0, m0), std::optional<std::vector<Rank>>(std::vector<Rank>{}));
  ParallelConfig config;
  config.world_size = 8;
  config.tp = 2;
  const std::int64_t three[] = {3};  // rank 3 (dp 1) dies: replica {2, 3} is dropped
  const EpochChange shrunk = replace_or_shrink(m0, three, config);
  ASSERT_TRUE(shrunk.shrink.has_value());
  const std::optional<std::vector<Rank>> exclude = nccl_shrink_exclusion(m0, shrunk.map);
  ASSERT_TRUE(exclude.has_value());
  // Every old rank not excluded holds a new rank, in order: what ncclCommShrink makes.
  std::vector<std::int64_t> kept;
  for (int r = 0; r < 8; ++r)
    if (!std::binary_search(exclude->begin(), exclude->end(), r)) kept.push_back(r);
  ASSERT_EQ(static_cast<std::int64_t>(kept.size()), shrunk.map.world_size());
  for (std::size_t i = 0; i < kept.size(); ++i)
    EXPECT_EQ(shrunk.map.logical_rank(m0.process_of(kept[i])), static_cast<Rank>(i));
  EXPECT_TRUE(std::binary_search(exclude->begin(), exclude->end(), 2));  // a survivor, now a spare
  EXPECT_TRUE(std::binary_search(exclude->begin(), exclude->end(), 3));  // the dead
  const int me = 4;  // a survivor's own plan agrees with the map
  const nccl_host::WorldShrink plan = nccl_host::plan_world_shrink(8, me, *exclude, "s");
  EXPECT_EQ(plan.size, shrunk.map.world_size());
  EXPECT_EQ(Rank{plan.rank}, shrunk.map.logical_rank(m0.process_of(me)));

  const RankMap s0(4, spares(1));
  const std::int64_t two[] = {2};
  EXPECT_EQ(nccl_shrink_exclusion(s0, s0.replace(two)), std::nullopt);  // process 4 joins
  const RankMap other(3);
  EXPECT_THROW((void)nccl_shrink_exclusion(other, s0), RankOutOfRangeError);
}

// The whole way: processes 0 and 2 of a 2 + 1 job agree on process 1's death (posted as
// commgrid launch posts it, so the agreement does not wait out its window), and the
// decision's dead give the ranks to exclude from epoch 0's world.
TEST(NcclRecoveryHost, ExcludedRanksFromARealDecision) {
  auto store = make_memory_store();
  const std::string sigkill = "SIGKILL";
  store->set(dead_process_key("resilience", 1, 0),
             std::span<const char>(sigkill.data(), sigkill.size()));
  const RankMap m0(2, spares(1));
  RecoveryOptions o;
  o.timeout = 30s;
  std::vector<std::vector<Rank>> excluded(3);
  std::vector<std::optional<Rank>> rank_after(3);
  std::vector<std::string> errors(3);
  {
    std::vector<std::jthread> threads;
    for (std::int64_t p : {0, 2})
      threads.emplace_back([&, p] {
        try {
          Recovery r(store, m0, p, o);
          r.mark_failed("rank 1 died");
          const EpochDecision& d = r.agree();
          excluded[static_cast<std::size_t>(p)] = nccl_excluded_ranks(m0, d.dead);
          rank_after[static_cast<std::size_t>(p)] = r.logical_rank();
        } catch (const std::exception& e) { errors[static_cast<std::size_t>(p)] = e.what(); }
      });
  }
  for (std::int64_t p : {0, 2}) {
    EXPECT_EQ(errors[static_cast<std::size_t>(p)], "") << "process " << p;
    EXPECT_EQ(excluded[static_cast<std::size_t>(p)], (std::vector<Rank>{1})) << "process " << p;
  }
  EXPECT_EQ(rank_after[0], Rank{0});
  EXPECT_EQ(rank_after[2], Rank{1});  // the spare takes the dead rank: a fresh world, no shrink
}

// ---- the compile-time choice ---------------------------------------------------------------

TEST(NcclRecoveryHost, ShrinkMethodIsChosenFromTheNcclHeaders) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0) && !defined(COMMGRID_NCCL_NO_SHRINK)
  EXPECT_EQ(COMMGRID_NCCL_HAS_SHRINK, 1);
  EXPECT_EQ(nccl_shrink_method(), NcclShrinkMethod::comm_shrink);
  // The library linked at run time must have it too (the headers and library of one NCCL).
  int v = 0;
  ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_GE(v, NCCL_VERSION(2, 27, 0)) << nccl_version();
  // NCCL_SHRINK_ABORT is the flag a recovery passes (the parent's operations end first).
  EXPECT_EQ(NCCL_SHRINK_ABORT, 1);
  EXPECT_EQ(NCCL_SHRINK_DEFAULT, 0);
#else
  EXPECT_EQ(COMMGRID_NCCL_HAS_SHRINK, 0);
  EXPECT_EQ(nccl_shrink_method(), NcclShrinkMethod::new_world);
#endif
  EXPECT_STREQ(nccl_shrink_method_name(NcclShrinkMethod::comm_shrink), "ncclCommShrink");
  EXPECT_STREQ(nccl_shrink_method_name(NcclShrinkMethod::new_world), "new world");
}

TEST(NcclRecoveryHost, TheShrinkRefusesSharingTheOldWorldsResources) {
  const char* was = std::getenv("NCCL_COMM_SHRINK_SHARE_RESOURCES");
  const std::optional<std::string> saved = was ? std::optional<std::string>(was) : std::nullopt;
  ::setenv("NCCL_COMM_SHRINK_SHARE_RESOURCES", "1", 1);
  EXPECT_NO_THROW(nccl_host::check_nccl_environment("nccl world"));  // only a shrink cares
  EXPECT_EQ(parameter_of([] { nccl_host::check_nccl_environment("nccl shrink of world", true); }),
            "NCCL_COMM_SHRINK_SHARE_RESOURCES");
  EXPECT_EQ(
      message_of([] { nccl_host::check_nccl_environment("nccl shrink of world", true); })
          .rfind("nccl shrink of world: NCCL_COMM_SHRINK_SHARE_RESOURCES=1 makes a shrunk world "
                 "share the old world's resources",
                 0),
      0u);
  ::setenv("NCCL_COMM_SHRINK_SHARE_RESOURCES", "0", 1);
  EXPECT_NO_THROW(nccl_host::check_nccl_environment("nccl shrink of world", true));
  if (saved) ::setenv("NCCL_COMM_SHRINK_SHARE_RESOURCES", saved->c_str(), 1);
  else ::unsetenv("NCCL_COMM_SHRINK_SHARE_RESOURCES");
}

// ---- the epoch's abort, on stand-ins -------------------------------------------------------

// A stand-in for a communicator's state: an abortable handle whose destruction is counted.
struct FakeComm {
  explicit FakeComm(std::atomic<int>* destroyed)
      : handle(&token, [destroyed](int*) { destroyed->fetch_add(1); }) {}
  int token = 0;
  nccl_host::AbortableHandle<int*> handle;
};
using FakeEpoch = nccl_host::EpochMembers<FakeComm>;
FakeEpoch::Abort fake_abort() {
  return [](FakeComm& c, const std::string& why) { return c.handle.abort(why); };
}
// n members of `epoch`, each counting its destruction in `destroyed`.
std::vector<std::shared_ptr<FakeComm>> add_members(FakeEpoch& epoch, int n,
                                                   std::atomic<int>* destroyed) {
  std::vector<std::shared_ptr<FakeComm>> comms;
  for (int i = 0; i < n; ++i) {
    comms.push_back(std::make_shared<FakeComm>(destroyed));
    epoch.add(comms.back());
  }
  return comms;
}

TEST(NcclRecoveryHost, AnEpochAbortAbortsEveryLiveMemberOnceAndIsIdempotent) {
  std::atomic<int> destroyed{0};
  FakeEpoch epoch(fake_abort());
  auto world = std::make_shared<FakeComm>(&destroyed);
  auto tp = std::make_shared<FakeComm>(&destroyed);
  auto gone = std::make_shared<FakeComm>(&destroyed);
  epoch.add(world);
  epoch.add(tp);
  epoch.add(gone);
  gone.reset();  // a group released before the failure is skipped
  EXPECT_EQ(epoch.alive(), 2u);
  tp->handle.abort("tp#0 timed out");  // one aborted on its own before (a Work's timeout)
  EXPECT_EQ(epoch.abort_all("rank 3 died"), 1u);
  EXPECT_TRUE(epoch.aborted());
  EXPECT_EQ(destroyed.load(), 2);
  EXPECT_TRUE(world->handle.aborted());
  EXPECT_EQ(world->handle.reason(), "rank 3 died");
  EXPECT_EQ(tp->handle.reason(), "tp#0 timed out");  // the first reason stays
  EXPECT_EQ(epoch.abort_all("again"), 0u);           // idempotent
  EXPECT_EQ(destroyed.load(), 2);
}

TEST(NcclRecoveryHost, AGroupMadeAfterTheEpochsAbortIsAbortedAsItIsAdded) {
  std::atomic<int> destroyed{0};
  FakeEpoch epoch(fake_abort());
  auto world = std::make_shared<FakeComm>(&destroyed);
  epoch.add(world);
  EXPECT_EQ(epoch.abort_all("rank 1 died"), 1u);
  auto late = std::make_shared<FakeComm>(&destroyed);  // its creation was under way
  epoch.add(late);
  EXPECT_TRUE(late->handle.aborted());
  EXPECT_EQ(late->handle.reason(), "rank 1 died");
  EXPECT_EQ(destroyed.load(), 2);
}

TEST(NcclRecoveryHost, AShrinkAbortsTheGroupsButNotTheWorld) {
  std::atomic<int> destroyed{0};
  FakeEpoch epoch(fake_abort());
  auto world = std::make_shared<FakeComm>(&destroyed);
  auto dp = std::make_shared<FakeComm>(&destroyed);
  epoch.add(world);
  epoch.add(dp);
  EXPECT_EQ(epoch.abort_all("shrinking", world.get()), 1u);
  EXPECT_TRUE(dp->handle.aborted());
  EXPECT_FALSE(world->handle.aborted());  // ncclCommShrink needs it alive
  EXPECT_FALSE(epoch.aborted());          // so groups made now are not aborted
  auto later = std::make_shared<FakeComm>(&destroyed);
  epoch.add(later);
  EXPECT_FALSE(later->handle.aborted());
  EXPECT_EQ(epoch.abort_all("done"), 2u);  // then the world (and the later group) go too
}

// A shrink stops the old world first: every other thread's call and look then finds it
// aborted (its pending operations, which NCCL_SHRINK_ABORT ends early, must not read as
// complete), while the shrink itself still uses it; the abort afterwards destroys it once.
TEST(NcclRecoveryHost, AStoppedHandleServesOnlyItsLastUseThenTheAbort) {
  std::atomic<int> destroyed{0};
  FakeComm c(&destroyed);
  c.handle.stop("nccl shrink of world: the world is replaced by its shrink");
  EXPECT_TRUE(c.handle.aborted());
  EXPECT_EQ(c.handle.reason(), "nccl shrink of world: the world is replaced by its shrink");
  EXPECT_FALSE(c.handle.use([](int*) { return 1; }).has_value());
  EXPECT_EQ(c.handle.try_use([](int*) { return 1; }).first, nccl_host::TryUse::stopped);
  EXPECT_EQ(c.handle.use_stopping([](int* h) { return h != nullptr; }), std::optional<bool>(true));
  EXPECT_EQ(destroyed.load(), 0);
  EXPECT_TRUE(c.handle.abort("later reason"));
  EXPECT_EQ(c.handle.reason(), "nccl shrink of world: the world is replaced by its shrink");
  EXPECT_EQ(destroyed.load(), 1);
  EXPECT_FALSE(c.handle.use_stopping([](int*) { return true; }).has_value());
  EXPECT_FALSE(c.handle.abort("again"));
  EXPECT_EQ(destroyed.load(), 1);
}

// A call polling a peer that never answers (a dead one) holds the handle only for each look;
// the epoch's abort waits for one look, never for the peer, and the poller ends at its next
// look. Fails (by the time bound) if the abort waited for the peer, and (by the count) if
// anything was destroyed twice or under a look.
TEST(NcclRecoveryHost, AnEpochAbortNeverWaitsForADeadPeer) {
  std::atomic<int> destroyed{0};
  FakeEpoch epoch(fake_abort());
  const std::vector<std::shared_ptr<FakeComm>> comms = add_members(epoch, 4, &destroyed);
  std::atomic<int> looks_seeing_abort{0};
  std::vector<std::jthread> pollers;
  for (const auto& c : comms)
    pollers.emplace_back([&, c] {
      // Polls for the peer (which never answers) until the handle is aborted.
      while (c->handle.use([&](int* h) {
        EXPECT_NE(h, nullptr);
        if (c->handle.aborted()) looks_seeing_abort.fetch_add(1);
        std::this_thread::sleep_for(1ms);
        return true;
      })) {}
    });
  std::this_thread::sleep_for(20ms);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(epoch.abort_all("peer 2 died"), 4u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  pollers.clear();  // every poller ends: its next look finds the handle aborted
  EXPECT_EQ(destroyed.load(), 4);
  // A look that begins once its handle is stopping is refused; only the look in progress
  // when the abort began may see it: at most one per poller.
  EXPECT_LE(looks_seeing_abort.load(), 4);
}

TEST(NcclRecoveryHost, ConcurrentEpochAbortsDestroyEachMemberOnce) {
  for (int round = 0; round < 50; ++round) {
    std::atomic<int> destroyed{0};
    FakeEpoch epoch(fake_abort());
    const std::vector<std::shared_ptr<FakeComm>> comms = add_members(epoch, 8, &destroyed);
    std::atomic<std::size_t> total{0};
    {
      std::vector<std::jthread> aborters;
      for (int t = 0; t < 4; ++t)
        aborters.emplace_back([&] { total += epoch.abort_all("watchdog"); });
    }
    EXPECT_EQ(total.load(), 8u);
    EXPECT_EQ(destroyed.load(), 8);
  }
}

// ---- the world factory, without a device -----------------------------------------------------

TEST(NcclRecoveryHost, TheFactoryIsTheWorldFactoryRecoveryTakes) {
  static_assert(std::is_same_v<NcclWorldFactory, WorldFactory>);
  EXPECT_THROW((void)make_nccl_world_factory(nullptr), InvalidValueError);
  EXPECT_EQ(parameter_of([] { (void)make_nccl_world_factory(nullptr); }), "bootstrap");
  EXPECT_EQ(parameter_of([] { (void)make_nccl_world(NcclOptions{}); }), "bootstrap");
  // A factory's worlds take their bootstrap from the factory, never from the options.
  NcclOptions lent;
  GlooOptions one;
  one.store = make_memory_store();
  one.timeout = 20s;
  lent.bootstrap = make_gloo_world(one);
  EXPECT_EQ(parameter_of([&] {
              (void)make_nccl_world_factory([](const std::string&, Rank, Rank) { return nullptr; },
                                            lent);
            }),
            "bootstrap");
  // A bootstrap factory that makes nothing, or a world of another size: refused before NCCL.
  auto nothing = make_nccl_world_factory([](const std::string&, Rank, Rank) { return nullptr; });
  EXPECT_EQ(message_of([&] { (void)nothing("epoch/0/world", 0, 1); }),
            "nccl world factory for epoch/0/world: the bootstrap factory returned no communicator");
  auto store = make_memory_store();
  auto wrong = make_nccl_world_factory([&](const std::string& prefix, Rank, Rank) {
    GlooOptions o;
    o.store = store;
    o.prefix = prefix;
    o.timeout = 20s;
    return make_gloo_world(o);
  });
  EXPECT_EQ(
      message_of([&] { (void)wrong("epoch/0/world", 0, 2); }),
      "nccl world factory for epoch/0/world: the bootstrap factory made rank 0 of 1 for rank 0 of 2");
  EXPECT_EQ(parameter_of([&] { (void)wrong("epoch/1/world", 0, 2); }), "bootstrap");
}

TEST(NcclRecoveryHost, AbortingTheEpochOfAnotherBackendIsAConfigError) {
  run_local_ranks(1, [](Communicator& gloo) {
    EXPECT_THROW((void)abort_nccl_epoch(gloo, "test"), ConfigError);
    EXPECT_EQ(parameter_of([&] { (void)abort_nccl_epoch(gloo, "test"); }), "backend");
    EXPECT_EQ(message_of([&] { (void)abort_nccl_epoch(gloo, "test"); }),
              "abort_nccl_epoch: world is a gloo communicator; only NCCL communicators have an "
              "epoch to abort");
  });
}

// Without a device, Recovery building an epoch through the NCCL factory fails on every rank
// with the same BackendError (no CUDA device), promptly, and marks the epoch failed; nothing
// crashes or hangs.
TEST(NcclRecoveryHost, WithoutADeviceRecoveryBuildFailsAlikeOnEveryRank) {
  if (cuda_device_count() > 0)
    GTEST_SKIP() << "this machine has a CUDA device; see NcclRecoveryDevice";
  auto store = make_memory_store();
  const RankMap m0(3);
  RecoveryOptions ro;
  ro.timeout = 60s;
  ParallelConfig config;
  config.world_size = 3;
  std::vector<std::string> errors(3);
  std::vector<bool> failed(3, false);
  std::vector<int> boots(3, 0);
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::vector<std::jthread> threads;
    for (std::int64_t p = 0; p < 3; ++p)
      threads.emplace_back([&, p] {
        const auto i = static_cast<std::size_t>(p);
        Recovery rec(store, m0, p, ro);
        auto factory =
            make_nccl_world_factory([&](const std::string& prefix, Rank rank, Rank size) {
              ++boots[i];
              GlooOptions o;
              o.store = store;
              o.rank = rank;
              o.size = size;
              o.prefix = prefix;
              o.timeout = 60s;
              return make_gloo_world(o);
            });
        try {
          (void)rec.build(factory, config);
        } catch (const BackendError& e) { errors[i] = e.what(); }
        failed[i] = rec.failed();
      });
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << "a rank waited for its timeout";
  const std::string why = cuda_unavailable_reason();
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(boots[i], 1) << "process " << i;
    EXPECT_EQ(errors[i].rfind("nccl world: rank 0 (host ", 0), 0u) << errors[i];
    EXPECT_NE(errors[i].find("): " + why), std::string::npos) << errors[i];
    EXPECT_TRUE(failed[i]) << "process " << i << ": the epoch is not marked failed";
  }
}

// ---- on a device ---------------------------------------------------------------------------

class NcclRecoveryDevice : public nccl_test::DeviceRanks {
 protected:
  void run(const std::function<void(Communicator& boot)>& fn) {
    GlooOptions gloo;
    gloo.timeout = 60s;
    run_local_ranks(n_, fn, gloo);
  }
};

class NcclRecoveryDeviceMulti : public NcclRecoveryDevice {
 protected:
  NcclRecoveryDeviceMulti() { min_ranks_ = 2; }
};

// An allreduce of (rank + 1) over `comm` on a device buffer: the sum 1 + ... + size.
void expect_allreduce_works(Communicator& comm) {
  std::int64_t* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, sizeof(std::int64_t)), cudaSuccess);
  const std::int64_t mine = comm.rank() + 1;
  ASSERT_EQ(cudaMemcpy(d, &mine, sizeof mine, cudaMemcpyHostToDevice), cudaSuccess);
  comm.allreduce(d, d, 1, DataType::int64, ReduceOp::sum)->wait();
  std::int64_t got = 0;
  ASSERT_EQ(cudaMemcpy(&got, d, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  const std::int64_t n = comm.size();
  EXPECT_EQ(got, n * (n + 1) / 2) << "on " << comm.name();
}

NcclOptions device_options() {
  NcclOptions o;
  o.timeout = 60s;
  return o;
}

// Aborting an epoch aborts the world and every group made from it, at once, once; every call
// on them then says why; a fresh world over the same bootstrap works.
TEST_F(NcclRecoveryDevice, AnEpochAbortEndsEveryCommunicatorThenAFreshWorldWorks) {
  run([&](Communicator& boot) {
    auto world = make_nccl_world(over(boot, device_options()));
    auto split = world->split(0, world->rank(), "dp#0");
    std::vector<Rank> all(static_cast<std::size_t>(world->size()));
    std::iota(all.begin(), all.end(), 0);
    auto member = world->create_group(all, "tp#0");
    auto grand = split->split(0, split->rank(), "pp#0");  // a group of a group
    expect_allreduce_works(*member);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(abort_nccl_epoch(*split, "rank 7 died"), 4u);  // world, dp#0, tp#0, pp#0
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
    EXPECT_EQ(abort_nccl_epoch(*world, "again"), 0u);
    for (Communicator* c :
         {static_cast<Communicator*>(world.get()), split.get(), member.get(), grand.get()}) {
      auto* n = dynamic_cast<NcclCommunicator*>(c);
      ASSERT_NE(n, nullptr);
      EXPECT_TRUE(n->aborted()) << c->name();
      EXPECT_EQ(n->abort_reason(), "rank 7 died") << c->name();
      EXPECT_EQ(n->native(), nullptr) << c->name();
      EXPECT_NE(message_of([&] {
                  c->barrier()->wait();
                }).find("the communicator was aborted: rank 7 died"),
                std::string::npos);
    }
    boot.barrier()->wait();
    auto fresh = make_nccl_world(over(boot, device_options()));
    expect_allreduce_works(*fresh);
    expect_allreduce_works(*fresh->split(0, fresh->rank(), "dp#0"));
  });
}

// A shrink excluding none (the only shrink one GPU allows): a working world of the same
// ranks, an epoch of its own; the old world and its groups are aborted. Bad arguments are
// typed errors that leave the old world alive.
TEST_F(NcclRecoveryDevice, AShrinkExcludingNoneGivesAWorkingWorldAndEndsTheOld) {
  run([&](Communicator& boot) {
    auto world = make_nccl_world(over(boot, device_options()));
    auto dp = world->split(0, world->rank(), "dp#0");
    const Rank out_of_range[] = {world->size()};
    EXPECT_THROW((void)shrink_nccl_world(*world, out_of_range), RankOutOfRangeError);
    const Rank self[] = {world->rank()};
    EXPECT_THROW((void)shrink_nccl_world(*world, self), InvalidValueError);
    NcclShrinkOptions zero;
    zero.timeout = 0ms;
    EXPECT_THROW((void)shrink_nccl_world(*world, {}, zero), InvalidValueError);
    EXPECT_FALSE(world->aborted());
    EXPECT_FALSE(dynamic_cast<NcclCommunicator&>(*dp).aborted());
    expect_allreduce_works(*dp);

    std::unique_ptr<NcclCommunicator> shrunk;
    if (nccl_shrink_method() == NcclShrinkMethod::comm_shrink) {
      shrunk = shrink_nccl_world(*world, {});
    } else {
      NcclShrinkOptions o;
      o.bootstrap = std::shared_ptr<Communicator>(&boot, [](Communicator*) {});  // not owned
      shrunk = shrink_nccl_world(*world, {}, o);
    }
    ASSERT_NE(shrunk, nullptr);
    EXPECT_EQ(shrunk->size(), world->size());
    EXPECT_EQ(shrunk->rank(), world->rank());
    EXPECT_EQ(shrunk->device(), world->device());
    EXPECT_TRUE(world->aborted());
    EXPECT_TRUE(dynamic_cast<NcclCommunicator&>(*dp).aborted());
    expect_allreduce_works(*shrunk);
    auto tp = shrunk->split(0, shrunk->rank(), "tp#0");
    expect_allreduce_works(*tp);
    // The shrunk world's epoch is its own: aborting it leaves nothing of the old to abort.
    EXPECT_EQ(abort_nccl_epoch(*world, "old"), 0u);
    EXPECT_EQ(abort_nccl_epoch(*tp, "new"), 2u);
    EXPECT_TRUE(shrunk->aborted());
  });
}

// Recovery builds an epoch's world and groups on the GPU through the NCCL factory; the next
// epoch's world (a new prefix) aborts the previous one.
TEST_F(NcclRecoveryDevice, TheFactoryBuildsEpochsAndEndsThePreviousOne) {
  auto store = make_memory_store();
  const RankMap m0(n_);
  ParallelConfig config;
  config.world_size = n_;
  RecoveryOptions ro;
  ro.timeout = 60s;
  std::vector<std::string> errors(static_cast<std::size_t>(n_));
  {
    std::vector<std::jthread> threads;
    for (int p = 0; p < n_; ++p)
      threads.emplace_back([&, p] {
        try {
          Recovery rec(store, m0, p, ro);
          auto factory = make_nccl_world_factory(
              [&](const std::string& prefix, Rank rank, Rank size) {
                GlooOptions o;
                o.store = store;
                o.rank = rank;
                o.size = size;
                o.prefix = prefix + "/boot";
                o.timeout = 60s;
                return make_gloo_world(o);
              },
              device_options());
          EpochGroups g = rec.build(factory, config);
          ASSERT_TRUE(g.world);
          expect_allreduce_works(g.groups->group(GroupKind::dp));
          auto next = factory("test/epoch/1/world", rec.logical_rank().value(), n_);
          EXPECT_TRUE(dynamic_cast<NcclCommunicator&>(*g.world).aborted());
          expect_allreduce_works(*next);
        } catch (const std::exception& e) { errors[static_cast<std::size_t>(p)] = e.what(); }
      });
  }
  for (int p = 0; p < n_; ++p)
    EXPECT_EQ(errors[static_cast<std::size_t>(p)], "") << "process " << p;
}

// Two or more GPUs: the last rank leaves (its world aborted, as a dead rank's would be), the
// others shrink without it, and the smaller world reduces over the survivors only.
TEST_F(NcclRecoveryDeviceMulti, TheSurvivorsShrinkWithoutTheLastRank) {
  run([&](Communicator& boot) {
    auto world = make_nccl_world(over(boot, device_options()));
    const Rank last = world->size() - 1;
    const Rank gone[] = {last};
    if (world->rank() == last) {
      EXPECT_EQ(abort_nccl_epoch(*world, "this rank leaves"), 1u);
      return;
    }
    NcclShrinkOptions o;
    o.timeout = 60s;
    std::unique_ptr<Communicator> survivors_boot;
    if (nccl_shrink_method() == NcclShrinkMethod::new_world) {
      std::vector<Rank> rest(static_cast<std::size_t>(last));
      std::iota(rest.begin(), rest.end(), 0);
      o.bootstrap = boot.create_group(rest, "survivors");
    }
    auto shrunk = shrink_nccl_world(*world, gone, o);
    EXPECT_EQ(shrunk->size(), last);
    EXPECT_EQ(shrunk->rank(), world->rank());
    EXPECT_TRUE(world->aborted());
    expect_allreduce_works(*shrunk);
  });
}

// Two or more GPUs, the case a recovery meets: the last rank stops (alive, its world kept,
// but it never joins another collective) while the others have an allreduce in flight on
// the world. The survivors' shrink ends that operation (NCCL_SHRINK_ABORT; or the epoch's
// abort, for the new-world method): its wait() says the world was replaced instead of
// reporting success or hanging, and the smaller world reduces without the stopped rank.
TEST_F(NcclRecoveryDeviceMulti, AHungCollectiveOfTheOldWorldEndsWithTheShrink) {
  run([&](Communicator& boot) {
    auto world = make_nccl_world(over(boot, device_options()));
    expect_allreduce_works(*world);  // every connection made while every rank takes part
    const Rank last = world->size() - 1;
    std::int64_t token = 0;
    if (world->rank() == last) {
      // Stopped, not gone: it keeps its world until the survivors are done, then leaves.
      boot.recv(&token, 1, DataType::int64, 0, 7)->wait();
      EXPECT_EQ(abort_nccl_epoch(*world, "this rank leaves"), 1u);
      return;
    }
    std::int64_t* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, sizeof *d), cudaSuccess);
    ASSERT_EQ(cudaMemset(d, 0, sizeof *d), cudaSuccess);
    auto hung = world->allreduce(d, d, 1, DataType::int64, ReduceOp::sum);  // the last never joins
    std::this_thread::sleep_for(200ms);
    EXPECT_FALSE(hung->done());
    const Rank gone[] = {last};
    NcclShrinkOptions o;
    if (nccl_shrink_method() == NcclShrinkMethod::new_world) {
      std::vector<Rank> rest(static_cast<std::size_t>(last));
      std::iota(rest.begin(), rest.end(), 0);
      o.bootstrap = boot.create_group(rest, "survivors");
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto shrunk = shrink_nccl_world(*world, gone, o);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
    EXPECT_NE(message_of([&] { hung->wait(); }).find("nccl shrink of world"), std::string::npos);
    EXPECT_EQ(shrunk->size(), last);
    expect_allreduce_works(*shrunk);
    cudaFree(d);
    if (world->rank() == 0) boot.send(&token, 1, DataType::int64, last, 7)->wait();
  });
}

}  // namespace
}  // namespace commgrid
