// The file and Redis stores: each rank opens its own store object (as separate processes or
// machines would) and the ranks still meet; a missing rank is named through either store.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "free_port.hpp"
#include "gloo_test_util.hpp"
#include "redis_server.hpp"
#include "store_test_util.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;

// Ranks as threads, but each with its own store object opened from the URI.
void run_with_own_stores(int n, const std::string& uri, std::chrono::milliseconds timeout,
                         const std::function<void(Communicator&)>& fn, int skip_rank = -1,
                         std::vector<std::string>* errors = nullptr) {
  std::vector<std::string> errs(static_cast<size_t>(n));
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < n; ++r) {
      if (r == skip_rank) continue;
      ranks.emplace_back([&, r] {
        try {
          auto w = make_gloo_world(placed(open_store(uri), r, n, test_options(timeout)));
          fn(*w);
        } catch (const std::exception& e) { errs[static_cast<size_t>(r)] = e.what(); }
      });
    }
  }
  if (errors) *errors = errs;
  else
    for (int r = 0; r < n; ++r) EXPECT_EQ(errs[static_cast<size_t>(r)], "") << "rank " << r;
}

void allreduce_and_split(Communicator& w) {
  std::int64_t v = w.rank(), out = 0;
  w.allreduce(&v, &out, 1, DataType::int64, ReduceOp::sum)->wait();
  EXPECT_EQ(out, w.size() * (w.size() - 1) / 2);
  auto g = w.split(w.rank() % 2, w.rank(), "parity");
  ASSERT_NE(g, nullptr);
  g->barrier()->wait();
}

TEST(GlooFileStore, RanksWithTheirOwnFileStoreMeet) {
  TempFolder dir;
  run_with_own_stores(4, "file://" + dir.path(), 20s, allreduce_and_split);
}

TEST(GlooFileStore, AMissingRankIsNamed) {
  TempFolder dir;
  std::vector<std::string> errors;
  run_with_own_stores(3, "file://" + dir.path(), 1500ms, allreduce_and_split, 1, &errors);
  for (int r : {0, 2}) {
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank 1 (global 1) of 3"), std::string::npos)
        << errors[static_cast<size_t>(r)];
    EXPECT_NE(errors[static_cast<size_t>(r)].find("file://" + dir.path()), std::string::npos);
  }
}

TEST(GlooRedisStore, RanksMeetThroughARealRedisServer) {
  RedisServer redis;
  if (!redis.available()) GTEST_SKIP() << "redis-server not found or did not start";
  run_with_own_stores(4, redis.uri("job1"), 20s, allreduce_and_split);
  // A second job on the same server with its own prefix does not collide with the first.
  run_with_own_stores(2, redis.uri("job2"), 20s, allreduce_and_split);
  std::vector<std::string> errors;
  run_with_own_stores(3, redis.uri("job3"), 1500ms, allreduce_and_split, 2, &errors);
  for (int r : {0, 1})
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank 2 (global 2) of 3"), std::string::npos)
        << errors[static_cast<size_t>(r)];
}

TEST(GlooRedisStore, APasswordFromTheUrlOrTheEnvironmentWorksAndIsNeverShown) {
  const std::string password = "pw-" + std::to_string(::getpid()) + "-secret";
  RedisServer redis(password);
  if (!redis.available()) GTEST_SKIP() << "redis-server not found or did not start";
  const std::string at = "127.0.0.1:" + std::to_string(redis.port());
  run_with_own_stores(3, "redis://:" + password + "@" + at + "/pw1", 20s, allreduce_and_split);
  run_with_own_stores(2, "redis://default:" + password + "@" + at + "/pw2", 20s,
                      allreduce_and_split);
  ::setenv("COMMGRID_REDIS_PASSWORD", password.c_str(), 1);
  run_with_own_stores(2, "redis://" + at + "/pw3", 20s, allreduce_and_split);
  ::unsetenv("COMMGRID_REDIS_PASSWORD");
  for (const std::string& uri :
       {"redis://:wrong-" + password + "@" + at + "/x", "redis://" + at + "/x"}) {
    try {
      open_store(uri);
      ADD_FAILURE() << "accepted without the password";
    } catch (const BackendError& e) {
      EXPECT_EQ(std::string(e.what()).find(password), std::string::npos) << "password shown";
    }
  }
  try {
    open_store("redis://:" + password + "@" + at);  // no prefix, but otherwise fine...
    open_store("redis://:" + password + "@h:0/x");  // ...a bad port is a ConfigError
    ADD_FAILURE() << "accepted port 0";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find(password), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("redis://***@h:0/x"), std::string::npos) << e.what();
  }
}

TEST(GlooRedisStore, ASecondJobOnThePrefixFailsAtOnceAndTheFirstCompletes) {
  RedisServer redis;
  if (!redis.available()) GTEST_SKIP() << "redis-server not found or did not start";
  StoreOptions first, second;
  first.job_id = "first";
  first.token = "t1";
  second.job_id = "second";
  second.token = "t2";
  auto store = open_store(redis.uri("shared"), first);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    open_store(redis.uri("shared"), second);
    ADD_FAILURE() << "two jobs merged on one prefix";
  } catch (const JobConflictError& e) {
    EXPECT_NE(std::string(e.what()).find("in use by job 'first' (this is job 'second')"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find("t1"), std::string::npos) << "token shown";
  }
  // At once: well under the store's timeout, with room for a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  // A stranger who knows the id but not the token is refused too.
  StoreOptions stranger = first;
  stranger.token = "guess";
  EXPECT_THROW(open_store(redis.uri("shared"), stranger), JobConflictError);
  // The first job completes.
  std::vector<std::string> errs(2);
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        try {
          auto w = make_gloo_world(
              placed(open_store(redis.uri("shared"), first), r, 2, test_options(20s)));
          allreduce_and_split(*w);
        } catch (const std::exception& e) { errs[static_cast<size_t>(r)] = e.what(); }
      });
  }
  EXPECT_EQ(errs, std::vector<std::string>(2));
}

// The issue's case: Redis dies (or freezes) mid-rendezvous with a rank missing; 8 ranks with
// a 3 s timeout all end within 5 s on an idle machine, whatever the number of peers (the
// bound below leaves room for a loaded one: what it catches is a rank left waiting).
void redis_fails_during_rendezvous(int signal) {
  RedisServer redis;
  if (!redis.available()) GTEST_SKIP() << "redis-server not found or did not start";
  std::jthread killer([&] {
    std::this_thread::sleep_for(500ms);
    redis.signal(signal);
  });
  std::vector<std::string> errors;
  const auto t0 = std::chrono::steady_clock::now();
  run_with_own_stores(8, redis.uri("dies"), 3s, allreduce_and_split, 7, &errors);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 3.0 + 30.0) << "a rank was left waiting after the store failed";
  for (int r = 0; r < 7; ++r) EXPECT_NE(errors[static_cast<size_t>(r)], "") << "rank " << r;
  if (signal == SIGSTOP) redis.signal(SIGCONT);
}

TEST(GlooRedisStore, KilledDuringRendezvousEveryRankEndsWithinTheTimeout) {
  redis_fails_during_rendezvous(SIGKILL);
}

TEST(GlooRedisStore, FrozenDuringRendezvousEveryRankEndsWithinTheTimeout) {
  redis_fails_during_rendezvous(SIGSTOP);
}

TEST(GlooRedisStore, AnUnreachableServerIsABackendErrorNamingIt) {
  const int port = free_port();  // nothing listens there once it is closed
  try {
    make_redis_store("127.0.0.1", port);
    ADD_FAILURE() << "connected to a closed port";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("redis://127.0.0.1:" + std::to_string(port)),
              std::string::npos)
        << e.what();
  }
}

TEST(GlooStore, WaitReturnsTheMissingKeysAndAbortReleasesWaiters) {
  auto s = make_memory_store();
  const std::string a = "a", b = "b";
  s->set(a, std::vector<char>{'1'});
  EXPECT_EQ(s->wait_for(std::vector<std::string>{a, b}, 50ms), std::vector<std::string>{b});
  EXPECT_THROW(s->set(a, std::vector<char>{'2'}), BackendError);  // keys are written once
  std::jthread aborter([&] {
    std::this_thread::sleep_for(100ms);
    s->abort("aborted: test");
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(s->wait_for(std::vector<std::string>{b}, 60s), AbortedError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << "the abort did not release the waiter";
}

}  // namespace
}  // namespace commgrid::test
