// set_if_absent on every store: of many processes' (here: many connections') concurrent
// calls on one key exactly one wins, and every caller then reads the winner's value; and
// fencing on the tcp:// store. These are the store's half of the resilience runtime's
// agreement (docs/resilience.md).
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "redis_server.hpp"
#include "store_test_util.hpp"

namespace commgrid {
namespace {

using namespace std::chrono_literals;
using test::job;
using test::tcp_uri;

using test::free_port;

std::string text(const std::vector<char>& v) { return {v.begin(), v.end()}; }
std::span<const char> bytes(std::string_view s) { return {s.data(), s.size()}; }

// kRacers threads, each with its own store object (its own connection or file handles, as
// separate processes would have), race for one key per round.
void race(const std::function<std::shared_ptr<Store>()>& open) {
  constexpr int kRacers = 8, kRounds = 20;
  std::vector<std::shared_ptr<Store>> stores;
  for (int i = 0; i < kRacers; ++i) stores.push_back(open());
  for (int round = 0; round < kRounds; ++round) {
    const std::string key = "decision/" + std::to_string(round);
    std::atomic<int> winners{0};
    std::vector<std::string> seen(kRacers), errors(kRacers), mine(kRacers);
    for (int i = 0; i < kRacers; ++i) mine[static_cast<size_t>(i)] = "racer " + std::to_string(i);
    {
      std::vector<std::jthread> racers;
      for (int i = 0; i < kRacers; ++i)
        racers.emplace_back([&, i] {
          try {
            if (stores[static_cast<size_t>(i)]->set_if_absent(key,
                                                              bytes(mine[static_cast<size_t>(i)])))
              ++winners;
            seen[static_cast<size_t>(i)] = text(stores[static_cast<size_t>(i)]->get(key));
          } catch (const std::exception& e) { errors[static_cast<size_t>(i)] = e.what(); }
        });
    }
    for (int i = 0; i < kRacers; ++i)
      ASSERT_EQ(errors[static_cast<size_t>(i)], "") << "racer " << i;
    EXPECT_EQ(winners.load(), 1) << "round " << round;
    for (int i = 1; i < kRacers; ++i)
      EXPECT_EQ(seen[static_cast<size_t>(i)], seen[0]) << "round " << round;
    EXPECT_EQ(seen[0].rfind("racer ", 0), 0u);
  }
  // A key set by set() is present for set_if_absent too, and the reverse.
  stores[0]->set("plain", bytes("a"));
  EXPECT_FALSE(stores[1]->set_if_absent("plain", bytes("b")));
  EXPECT_EQ(text(stores[1]->get("plain")), "a");
  ASSERT_TRUE(stores[1]->set_if_absent("fresh", bytes("c")));
  EXPECT_THROW(stores[0]->set("fresh", bytes("d")), BackendError);
  EXPECT_EQ(text(stores[0]->get("fresh")), "c");
}

TEST(SetIfAbsent, MemoryStoreHasExactlyOneWinner) {
  auto store = make_memory_store();
  race([&] { return store; });  // threads of one process share one memory store
}

TEST(SetIfAbsent, FileStoreHasExactlyOneWinnerAcrossStoreObjects) {
  test::TempFolder folder;
  race([&] { return open_store("file://" + folder.path(), job("race", "tok", false)); });
}

TEST(SetIfAbsent, TcpStoreHasExactlyOneWinnerDecidedByTheServer) {
  const int port = free_port();
  auto server = open_store(tcp_uri(port), job("race", "tok", true));
  race([&] { return open_store(tcp_uri(port), job("race", "tok", false, 20s)); });
  // The serving process takes part in the same decision.
  EXPECT_FALSE(server->set_if_absent("decision/0", bytes("server")));
  EXPECT_TRUE(server->set_if_absent("server-key", bytes("s")));
  auto client = open_store(tcp_uri(port), job("race", "tok", false));
  EXPECT_FALSE(client->set_if_absent("server-key", bytes("c")));
  EXPECT_EQ(text(client->get("server-key")), "s");
}

TEST(SetIfAbsent, RedisStoreHasExactlyOneWinner) {
  test::RedisServer redis;
  if (!redis.available())
    GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server)";
  race([&] { return open_store(redis.uri("race"), job("race", "", false)); });
}

TEST(Fence, TcpStoreRefusesAFencedProcessAndItsReconnection) {
  const int port = free_port();
  auto server = open_store(tcp_uri(port), job("fence", "tok", true));
  StoreOptions as3 = job("fence", "tok", false);
  as3.process = "process/3/0";
  StoreOptions as4 = as3;
  as4.process = "process/4/0";
  auto p3 = open_store(tcp_uri(port), as3);
  auto p4 = open_store(tcp_uri(port), as4);
  p3->set("before", bytes("ok"));
  // Fenced by another process (the decider), through the server.
  EXPECT_TRUE(p4->fence("process/3/0", "process 3 was declared dead in epoch 1 and is fenced"));
  try {
    (void)p3->has("before");
    ADD_FAILURE() << "a fenced process's request was served";
  } catch (const FencedError& e) {
    EXPECT_NE(std::string(e.what()).find("process 3 was declared dead in epoch 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(open_store(tcp_uri(port), as3), FencedError);
  // Everyone else goes on; a restarted incarnation of the same process is not fenced.
  EXPECT_TRUE(p4->has("before"));
  StoreOptions again = as3;
  again.process = "process/3/1";
  EXPECT_TRUE(open_store(tcp_uri(port), again)->has("before"));
  // The serving process fences too; memory and file stores cannot enforce it.
  EXPECT_TRUE(server->fence("process/4/0", "fenced"));
  EXPECT_THROW((void)p4->has("before"), FencedError);
  EXPECT_FALSE(make_memory_store()->fence("process/1/0", "fenced"));
}

}  // namespace
}  // namespace commgrid
