// Faults on rank-threads: a rank that never arrives, a member missing from a group, a rank
// that throws mid-job, a collective that times out. Every case ends within seconds with an
// error naming the group and the ranks, never a hang.
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(GlooFaults, ARankThatNeverArrivesIsNamedWithinTheTimeout) {
  auto store = make_memory_store();
  const auto t0 = Clock::now();
  std::vector<std::string> errors(3);
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < 3; ++r)  // rank 3 of 4 never starts
      ranks.emplace_back([&, r] {
        try {
          (void)make_gloo_world(placed(store, r, 4, test_options(1500ms)));
        } catch (const TimeoutError& e) { errors[static_cast<size_t>(r)] = e.what(); }
      });
  }
  EXPECT_LT(seconds_since(t0), 1.5 + 30.0) << "the timeout did not bound world creation";
  for (const auto& e : errors) {
    EXPECT_NE(e.find("on world"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 3 (global 3) of 4"), std::string::npos) << e;
    EXPECT_NE(e.find("timed out after 1.5 s"), std::string::npos) << e;
  }
}

TEST(GlooFaults, AMemberMissingFromAGroupIsNamedWithItsGlobalRank) {
  const auto t0 = Clock::now();
  auto r = run_local_ranks_collect(
      6,
      [](Communicator& w) {
        const std::vector<Rank> members{1, 3, 5};
        if (w.rank() == 5) return;  // a member that never calls create_group
        if (w.rank() % 2 == 0) return;
        try {
          (void)w.create_group(members, "odd");
          ADD_FAILURE() << "no error on rank " << w.rank();
        } catch (const TimeoutError& e) {
          const std::string m = e.what();
          EXPECT_NE(m.find("gloo create_group on odd"), std::string::npos) << m;
          EXPECT_NE(m.find("rank 2 (global 5) of 3"), std::string::npos) << m;
        }
      },
      test_options(1500ms));
  EXPECT_EQ(r.first_failed_rank, -1) << r.first_failure;
  EXPECT_LT(seconds_since(t0), 1.5 + 30.0) << "the timeout did not bound create_group";
}

TEST(GlooFaults, AMemberMissingFromABatchOfGroupsIsNamedWithinTheTimeout) {
  const auto t0 = Clock::now();
  auto r = run_local_ranks_collect(
      4,
      [](Communicator& w) {
        if (w.rank() == 3) return;  // a member of "all" that never makes its groups
        const Rank me = w.rank();
        const std::vector<GroupSpec> specs{
            {{me - me % 2, me - me % 2 + 1}, "pair#" + std::to_string(me / 2)},
            {{0, 1, 2, 3}, "all"}};
        try {
          (void)w.create_groups(specs);
          ADD_FAILURE() << "no error on rank " << w.rank();
        } catch (const TimeoutError& e) {
          const std::string m = e.what();
          EXPECT_NE(m.find("gloo create_groups on"), std::string::npos) << m;
          EXPECT_NE(m.find("(global 3)"), std::string::npos) << m;  // rank 3 of all, 1 of a pair
        }
      },
      test_options(1500ms));
  EXPECT_EQ(r.first_failed_rank, -1) << r.first_failure;
  EXPECT_LT(seconds_since(t0), 1.5 + 30.0) << "the timeout did not bound create_groups";
}

TEST(GlooFaults, ARankThatThrowsUnblocksTheOthersAndIsReportedFirst) {
  const auto t0 = Clock::now();
  // A long timeout: the others must be released by the failure, not by waiting it out.
  auto r = run_local_ranks_collect(
      4,
      [](Communicator& w) {
        std::int64_t v = 1, out = 0;
        w.allreduce(&v, &out, 1, DataType::int64, ReduceOp::sum)->wait();
        if (w.rank() == 2) throw std::runtime_error("model diverged");
        for (int k = 0; k < 100; ++k)
          w.allreduce(&v, &out, 1, DataType::int64, ReduceOp::sum)->wait();
      },
      test_options(100s));
  EXPECT_LT(seconds_since(t0), 60.0) << "the others waited out their 100 s timeout";
  EXPECT_EQ(r.first_failed_rank, 2);
  EXPECT_EQ(r.first_failure, "rank 2: model diverged");
  for (int k : {0, 1, 3}) {
    ASSERT_TRUE(r.errors[static_cast<size_t>(k)]) << "rank " << k << " did not fail";
    try {
      std::rethrow_exception(r.errors[static_cast<size_t>(k)]);
    } catch (const BackendError& e) {
      EXPECT_NE(std::string(e.what()).find("on world"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << k << ": not a BackendError: " << e.what();
    }
  }
  EXPECT_THROW(run_local_ranks(
                   2,
                   [](Communicator& w) {
                     if (w.rank() == 1) throw std::runtime_error("x");
                   },
                   test_options()),
               RankFailedError);
}

TEST(GlooFaults, ACollectiveThatTimesOutIsATimeoutErrorNamingOpAndGroup) {
  const auto t0 = Clock::now();
  auto r = run_local_ranks_collect(
      2,
      [](Communicator& w) {
        auto g = w.split(0, w.rank(), "tp#0");
        if (w.rank() == 1) {
          std::this_thread::sleep_for(6s);  // late far beyond the 1 s timeout, even when loaded
          return;
        }
        std::int32_t v = 1, out = 0;
        try {
          g->allreduce(&v, &out, 1, DataType::int32, ReduceOp::sum)->wait();
          ADD_FAILURE() << "no timeout";
        } catch (const TimeoutError& e) {
          EXPECT_NE(std::string(e.what()).find("gloo allreduce on tp#0"), std::string::npos)
              << e.what();
        }
      },
      test_options(1s));
  EXPECT_EQ(r.first_failed_rank, -1) << r.first_failure;
  EXPECT_LT(seconds_since(t0), 6.0 + 30.0) << "the timeout did not end the allreduce";
}

TEST(GlooFaults, ACollectiveThatTimesOutNamesTheRanksThatDidNotArrive) {
  // Rank 2 of 3 never enters the barrier: the ranks that did time out (or see the first
  // one's connections close), and a timed-out rank names rank 2 and only rank 2.
  std::mutex mutex;
  std::vector<std::string> timeouts;
  auto r = run_local_ranks_collect(
      3,
      [&](Communicator& w) {
        auto g = w.split(0, w.rank(), "tp#0");
        if (w.rank() == 2) {
          std::this_thread::sleep_for(2500ms);  // past the timeout and the census's grace
          return;
        }
        g->set_timeout(800ms);
        try {
          g->barrier()->wait();
          ADD_FAILURE() << "rank " << w.rank() << ": the barrier completed without rank 2";
        } catch (const TimeoutError& e) {
          std::lock_guard lock(mutex);
          timeouts.push_back(e.what());
        } catch (const AbortedError&) {
          // The other rank timed out first and closed its connections: its message says it.
        }
      },
      test_options(30s));
  EXPECT_EQ(r.first_failed_rank, -1) << r.first_failure;
  ASSERT_FALSE(timeouts.empty()) << "no rank timed out";
  for (const std::string& t : timeouts) {
    EXPECT_NE(t.find("gloo barrier on tp#0: timed out"), std::string::npos) << t;
    EXPECT_NE(t.find("; rank 2 (global 2) of 3 did not reach this barrier (collective "),
              std::string::npos)
        << t;
  }
}

TEST(GlooFaults, BadArgumentsToTheWorldAreConfigErrors) {
  auto store = make_memory_store();
  EXPECT_THROW((void)make_gloo_world(placed(store, 2, 2)), RankOutOfRangeError);
  EXPECT_THROW((void)make_gloo_world(placed(store, 0, 0)), InvalidValueError);
  EXPECT_THROW((void)make_gloo_world(placed(nullptr, 0, 1)), ConfigError);
  EXPECT_THROW((void)make_gloo_world(placed(store, 0, 1, test_options(0ms))), InvalidValueError);
  EXPECT_THROW(run_local_ranks(0, [](Communicator&) {}), ConfigError);
  // Sizes are Ranks: one beyond Gloo's int is refused, not wrapped.
  EXPECT_THROW((void)make_gloo_world(placed(store, 0, Rank{1} << 32)), InvalidValueError);
  EXPECT_THROW(run_local_ranks(Rank{1} << 32, [](Communicator&) {}), InvalidValueError);
  // The runner places every rank itself: options that place one are a mistake, named.
  for (const auto& [options, field] :
       std::vector<std::pair<GlooOptions, std::string>>{{placed(store, 0, 1), "store"},
                                                        {placed(nullptr, 1, 1), "rank"},
                                                        {placed(nullptr, 0, 2), "size"}}) {
    try {
      run_local_ranks(
          2, [](Communicator&) {}, options);
      ADD_FAILURE() << field << ": no error";
    } catch (const InvalidValueError& e) { EXPECT_EQ(e.parameter(), field) << e.what(); }
  }
}

// ---- the environment -------------------------------------------------------------

class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* n :
         {"COMMGRID_RANK", "COMMGRID_WORLD_SIZE", "COMMGRID_STORE", "COMMGRID_TIMEOUT"})
      ::unsetenv(n);
    for (auto [n, v] : vars) ::setenv(n, v, 1);
  }
  ~ScopedEnv() {
    for (const char* n :
         {"COMMGRID_RANK", "COMMGRID_WORLD_SIZE", "COMMGRID_STORE", "COMMGRID_TIMEOUT"})
      ::unsetenv(n);
  }
};

std::string env_error(std::initializer_list<std::pair<const char*, const char*>> vars) {
  ScopedEnv env(vars);
  try {
    (void)read_world_env();
  } catch (const ConfigError& e) { return e.parameter() + ": " + e.what(); }
  return "no error";
}

TEST(GlooEnv, MissingOrMalformedVariablesAreNamed) {
  EXPECT_EQ(env_error({}),
            "COMMGRID_RANK: COMMGRID_RANK is not set (commgrid launch sets COMMGRID_RANK, "
            "COMMGRID_WORLD_SIZE and COMMGRID_STORE)");
  EXPECT_EQ(env_error({{"COMMGRID_RANK", "x1"}}),
            "COMMGRID_RANK: COMMGRID_RANK='x1' is not a whole decimal number");
  EXPECT_EQ(env_error({{"COMMGRID_RANK", "3"}, {"COMMGRID_WORLD_SIZE", "2"}}),
            "COMMGRID_RANK: COMMGRID_RANK=3 is not below COMMGRID_WORLD_SIZE=2");
  EXPECT_EQ(env_error({{"COMMGRID_RANK", "0"}, {"COMMGRID_WORLD_SIZE", "0"}}),
            "COMMGRID_WORLD_SIZE: COMMGRID_WORLD_SIZE=0 must be >= 1");
  EXPECT_EQ(env_error({{"COMMGRID_RANK", "0"}, {"COMMGRID_WORLD_SIZE", "2"}}).substr(0, 30),
            "COMMGRID_STORE: COMMGRID_STORE");
  EXPECT_EQ(env_error({{"COMMGRID_RANK", "0"},
                       {"COMMGRID_WORLD_SIZE", "2"},
                       {"COMMGRID_STORE", "file:///tmp"},
                       {"COMMGRID_TIMEOUT", "-1"}}),
            "COMMGRID_TIMEOUT: COMMGRID_TIMEOUT='-1' is not a positive number of seconds");
  ScopedEnv ok({{"COMMGRID_RANK", "1"},
                {"COMMGRID_WORLD_SIZE", "2"},
                {"COMMGRID_STORE", "file:///tmp"},
                {"COMMGRID_TIMEOUT", "2.5"}});
  WorldEnv e = read_world_env();
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.size, 2);
  EXPECT_EQ(e.store, "file:///tmp");
  EXPECT_EQ(e.timeout, std::chrono::milliseconds(2500));
}

TEST(GlooEnv, StoreUrisAreParsedStrictly) {
  for (const char* bad :
       {"", "tcp://x", "tcp://:5", "tcp://h:0", "redis://:@h:1", "file://relative", "redis://host",
        "redis://:1", "redis://h:0", "redis://h:99999", "redis://h:12x", "redis://h:1/"}) {
    try {
      open_store(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.parameter(), "store") << bad;
      EXPECT_NE(std::string(e.what()).find("expected file:///"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(open_store("file:///no/such/folder/anywhere"), ConfigError);
  EXPECT_EQ(open_store("memory")->uri(), "memory");
}

}  // namespace
}  // namespace commgrid::test
