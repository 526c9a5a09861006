// The tcp:// store on its own: many clients meet through the server rank 0 runs, waits are
// answered at the server the moment a key is set, abort() ends a wait in progress, and
// `has` answers without copying the value.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "store_test_util.hpp"
#include "tcp_store.hpp"

namespace commgrid::test {
extern std::atomic<std::size_t> g_allocated;  // count_allocations.cpp
}

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;

std::span<const char> bytes(const std::string& s) { return {s.data(), s.size()}; }
std::string text(const std::vector<char>& v) { return {v.begin(), v.end()}; }

TEST(TcpStore, SixtyFourClientsSetWaitForAndReadEachOther) {
  const int port = free_port();
  auto server = open_store(tcp_uri(port), job("meet", "tok", true));
  constexpr int kClients = 64;
  std::vector<std::string> errors(kClients);
  {
    std::vector<std::jthread> clients;
    for (int r = 0; r < kClients; ++r)
      clients.emplace_back([&, r] {
        try {
          auto s = open_store(tcp_uri(port), job("meet", "tok", false, 20s));
          s->set("addr/" + std::to_string(r), bytes("host-" + std::to_string(r)));
          // Like a rank of a world: wait for its neighbours' addresses, then read them.
          std::vector<std::string> want;
          for (int d : {1, 2, 5, 17}) want.push_back("addr/" + std::to_string((r + d) % kClients));
          const auto missing = s->wait_for(want, 20s);
          if (!missing.empty()) throw std::runtime_error("missing " + missing.front());
          for (const auto& k : want)
            if (text(s->get(k)) != "host-" + k.substr(5)) throw std::runtime_error("wrong " + k);
          if (s->has("addr/none")) throw std::runtime_error("has an unset key");
        } catch (const std::exception& e) { errors[static_cast<size_t>(r)] = e.what(); }
      });
  }
  for (int r = 0; r < kClients; ++r)
    EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "client " << r;
  // The serving process sees the clients' keys, and they see its.
  EXPECT_EQ(text(server->get("addr/63")), "host-63");
  server->set("from-rank-0", bytes("x"));
  auto late = open_store(tcp_uri(port), job("meet", "tok", false));
  EXPECT_EQ(text(late->get("from-rank-0")), "x");
  EXPECT_THROW(late->set("from-rank-0", bytes("y")), BackendError);  // written once
}

TEST(TcpStore, AWaitIsAnsweredWhenTheKeyIsSetAndNamesWhatIsStillMissing) {
  const int port = free_port();
  auto server = open_store(tcp_uri(port), job("w", "", true));
  auto a = open_store(tcp_uri(port), job("w", "", false));
  auto b = open_store(tcp_uri(port), job("w", "", false));
  std::jthread setter([&] {
    std::this_thread::sleep_for(300ms);
    b->set("late", bytes("1"));
    std::this_thread::sleep_for(300ms);
    server->set("later", bytes("2"));  // set by the serving process itself
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(a->wait_for(std::vector<std::string>{"late", "later"}, 30s),
            std::vector<std::string>{});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  // A key never set comes back missing at the timeout (and only it).
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(a->wait_for(std::vector<std::string>{"late", "never"}, 1s),
            std::vector<std::string>{"never"});
  const auto took = std::chrono::steady_clock::now() - t1;
  EXPECT_GE(took, 900ms);  // the timeout guarantees it
  EXPECT_LT(took, 1s + 30s) << "the timeout did not bound the wait";
  // The serving process waits the same way.
  EXPECT_EQ(server->wait_for(std::vector<std::string>{"never"}, 200ms),
            std::vector<std::string>{"never"});
}

TEST(TcpStore, AbortEndsAWaitInProgressAtTheServer) {
  const int port = free_port();
  auto server = open_store(tcp_uri(port), job("ab", "t", true));
  auto client = open_store(tcp_uri(port), job("ab", "t", false));
  std::jthread aborter([&] {
    std::this_thread::sleep_for(300ms);
    client->abort("aborted: rank 3 failed");
  });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    client->wait_for(std::vector<std::string>{"never"}, 60s);
    ADD_FAILURE() << "the wait was not aborted";
  } catch (const AbortedError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 failed"), std::string::npos) << e.what();
  }
  // Released by the abort at 300 ms, not by the 60 s timeout; room for a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  // The store object still sets and reads (its connection is made again).
  client->set("after", bytes("1"));
  EXPECT_EQ(text(server->get("after")), "1");
}

TEST(TcpStore, AWaitWatchEndsAWaitOfThisThreadWhenItsKeyIsSet) {
  const int port = free_port();
  auto server = open_store(tcp_uri(port), job("ww", "t", true));
  auto client = open_store(tcp_uri(port), job("ww", "t", false));
  std::jthread poster([&] {
    std::this_thread::sleep_for(300ms);
    server->set("epoch/0/failed", bytes("process 2 died"));
  });
  const auto t0 = std::chrono::steady_clock::now();
  {
    const WaitWatch watch("epoch/0/failed");
    try {
      client->wait_for(std::vector<std::string>{"never"}, 60s);
      ADD_FAILURE() << "the wait did not end when the watched key was set";
    } catch (const AbortedError& e) {
      EXPECT_NE(std::string(e.what()).find("epoch/0/failed is set to 'process 2 died'"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);  // not the 60 s timeout
  // Outside the watch's scope waits are as before.
  EXPECT_EQ(client->wait_for(std::vector<std::string>{"never"}, 50ms),
            std::vector<std::string>{"never"});
  client->set("now", bytes("1"));
  EXPECT_TRUE(client->wait_for(std::vector<std::string>{"now"}, 10s).empty());
}

TEST(TcpStore, HasDoesNotCopyTheValueAndLargeValuesFit) {
  const int port = free_port();
  auto server = open_store(tcp_uri(port), job("big", "t", true));
  auto client = open_store(tcp_uri(port), job("big", "t", false, 30s));
  const std::string big(size_t{16} << 20, 'v');  // a Gloo world's addresses at ~10^5 ranks
  client->set("big", bytes(big));
  const size_t before = g_allocated.load();
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(client->has("big"));
  const size_t has_bytes = g_allocated.load() - before;
  EXPECT_LT(has_bytes, size_t{1} << 20) << "10 has() calls allocated " << has_bytes << " bytes";
  // The counter does see a copy: a get copies the value (at least once).
  const size_t before_get = g_allocated.load();
  EXPECT_EQ(client->get("big").size(), big.size());
  EXPECT_GE(g_allocated.load() - before_get, big.size());
  // Over the value limit: refused by the client, naming the limits.
  const std::string too_big(bootstrap::kTcpStoreMaxValue + 1, 'x');
  try {
    client->set("too-big", bytes(too_big));
    ADD_FAILURE() << "a value over the limit was accepted";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("a value of 67108865 bytes exceeds the limit of 67108864 "
                                         "bytes per value"),
              std::string::npos)
        << e.what();
  }
}

TEST(TcpStore, AWrongTokenAnotherJobAndASecondServerFailAtOnce) {
  const int port = free_port();
  auto server = open_store(tcp_uri(port), job("j1", "right", true));
  const std::string v = "value";
  server->set("k", std::span<const char>(v.data(), v.size()));
  auto client = open_store(tcp_uri(port), job("j1", "right", false));
  EXPECT_TRUE(client->has("k"));
  EXPECT_EQ(std::string(client->get("k").data(), 5), "value");
  EXPECT_THROW(client->set("k", std::span<const char>(v.data(), v.size())), BackendError);

  const auto t0 = std::chrono::steady_clock::now();
  try {
    open_store(tcp_uri(port), job("j1", "wrong", false, 60s));
    ADD_FAILURE() << "a wrong token was accepted";
  } catch (const AuthenticationError& e) {
    EXPECT_NE(std::string(e.what()).find("another token"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("wrong"), std::string::npos) << "token shown";
  }
  EXPECT_THROW(open_store(tcp_uri(port), job("j1", "", false, 60s)), AuthenticationError);
  try {
    open_store(tcp_uri(port), job("j2", "right", false, 60s));
    ADD_FAILURE() << "another job was accepted";
  } catch (const JobConflictError& e) {
    EXPECT_NE(std::string(e.what()).find("serves job 'j1' (this is job 'j2')"), std::string::npos)
        << e.what();
  }
  try {
    open_store(tcp_uri(port), job("j2", "other", true, 60s));
    ADD_FAILURE() << "a second server on the port";
  } catch (const JobConflictError& e) {
    EXPECT_NE(std::string(e.what()).find("is in use"), std::string::npos) << e.what();
  }
  // Immediate: the four refused calls together well under one of their 60 s timeouts.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << "refusals must be immediate";
  // The first job's store still works.
  EXPECT_TRUE(client->has("k"));
}

TEST(TcpStore, StrangersAndGarbageDoNotHurtTheServer) {
  const int port = free_port();
  auto server = open_store(tcp_uri(port), job("j", "tok", true, 1s));
  // Strangers: one sends garbage, one a huge frame length, one a proof-sized frame of
  // garbage, one says nothing.
  std::vector<int> fds;
  for (const std::string& junk :
       {std::string(48, '\x7f'), std::string("\xff\xff\xff\xff", 4),
        std::string("\x00\x00\x00\x69", 4) + std::string(0x69, 'A'), std::string()}) {
    const int fd = raw_connect(port);
    ASSERT_GE(fd, 0);
    if (!junk.empty()) (void)!::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    fds.push_back(fd);
  }
  auto client = open_store(tcp_uri(port), job("j", "tok", false, 2s));
  client->set("small", bytes("0123456789"));
  EXPECT_TRUE(client->has("small"));
  for (int fd : fds) ::close(fd);
}

TEST(TcpStore, ARefusingPortIsATimeoutSayingWhatHappened) {
  const auto t0 = std::chrono::steady_clock::now();
  const int port = free_port();  // nothing listens there
  try {
    open_store(tcp_uri(port), job("j", "", false, 1s));
    ADD_FAILURE() << "connected to nothing";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no server answered within 1000 ms"), std::string::npos) << what;
    EXPECT_NE(what.find("Connection refused"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 0 serves it"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s + 30s) << "the timeout did not bound it";
}

TEST(TcpStore, TheServerEndingIsNamedByItsClients) {
  const int port = free_port();
  auto server = open_store(tcp_uri(port), job("end", "t", true));
  auto client = open_store(tcp_uri(port), job("end", "t", false, 2s));
  server.reset();
  try {
    (void)client->has("k");
    ADD_FAILURE() << "a request to a server that ended succeeded";
  } catch (const BackendError& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "the process serving it ended or failed: rank 0, or commgrid launch with --spares"),
        std::string::npos)
        << e.what();
  }
}

TEST(TcpStore, EveryRequestAfterTheServerEndedSaysWhy) {
  // The connection is not made again (the store's keys died with the server): every later
  // request fails at once, and says why, since the caller that saw the first failure may
  // have gone on without it (Gloo's error path does).
  const int port = free_port();
  auto server = open_store(tcp_uri(port), job("end", "t", true));
  auto client = open_store(tcp_uri(port), job("end", "t", false, 2s));
  server.reset();
  for (int request = 0; request < 3; ++request) {
    try {
      (void)client->has("k");
      ADD_FAILURE() << "request " << request << " to a server that ended succeeded";
    } catch (const BackendError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("tcp store " + tcp_uri(port) + ": "), std::string::npos) << what;
      EXPECT_NE(
          what.find(
              "(the process serving it ended or failed: rank 0, or commgrid launch with --spares)"),
          std::string::npos)
          << "request " << request << ": " << what;
      if (request > 0) {
        EXPECT_NE(what.find("not connected since an earlier request failed: "), std::string::npos)
            << what;
      }
    }
  }
}

}  // namespace
}  // namespace commgrid::test
