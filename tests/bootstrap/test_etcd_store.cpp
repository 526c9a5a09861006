// The etcd:// store against real etcd servers started by the test (one member, and a cluster
// of three where members die): every Store operation, waits that are watches, fencing that
// etcd enforces, the prefix claimed by the job, authentication as the job's user, several
// members failing over, and bad input as one-line typed errors within the timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "etcd_cluster.hpp"

namespace commgrid {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string text(const std::vector<char>& v) { return {v.begin(), v.end()}; }
std::span<const char> bytes(std::string_view s) { return {s.data(), s.size()}; }

StoreOptions job(const std::string& id, const std::string& token = "",
                 std::chrono::milliseconds timeout = 10s) {
  StoreOptions o;
  o.job_id = id;
  o.token = token;
  o.timeout = timeout;
  return o;
}

// A fresh job id per test: tests share one server.
std::string fresh(const std::string& stem) {
  static std::atomic<int> n{0};
  return stem + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

class EtcdStoreOneMember : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = new test::EtcdCluster(1); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (!cluster_->available()) GTEST_SKIP() << cluster_->why_not();
  }
  static test::EtcdCluster* cluster_;
};
test::EtcdCluster* EtcdStoreOneMember::cluster_ = nullptr;

TEST_F(EtcdStoreOneMember, EveryOperation) {
  const auto store = open_store(cluster_->uri(), job(fresh("ops"), "t"));
  EXPECT_EQ(store->uri().rfind("etcd://" + cluster_->endpoint(0) + "/commgrid/ops-", 0), 0u)
      << store->uri();
  EXPECT_EQ(store->local_address(), "127.0.0.1");
  EXPECT_FALSE(store->has("a"));
  store->set("a", bytes("one"));
  EXPECT_TRUE(store->has("a"));
  EXPECT_EQ(text(store->get("a")), "one");
  // Written once: a second set fails naming the key; set_if_absent keeps the first value.
  try {
    store->set("a", bytes("two"));
    ADD_FAILURE() << "a second set of 'a' succeeded";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("'a'"), std::string::npos);
  }
  EXPECT_FALSE(store->set_if_absent("a", bytes("three")));
  EXPECT_TRUE(store->set_if_absent("b", bytes("four")));
  EXPECT_EQ(text(store->get("a")), "one");
  EXPECT_EQ(text(store->get("b")), "four");
  EXPECT_THROW((void)store->get("never"), BackendError);
  // Any bytes, empty values too.
  const std::string binary("\0\xff\n x", 5);
  store->set("bin", bytes(binary));
  store->set("empty", bytes(""));
  EXPECT_EQ(text(store->get("bin")), binary);
  EXPECT_EQ(text(store->get("empty")), "");
  // Waits: present keys at once; missing ones named after the timeout.
  const std::vector<std::string> keys{"a", "b", "missing/1", "missing/2"};
  EXPECT_EQ(store->wait_for(std::span(keys).first(2), 1s), std::vector<std::string>{});
  EXPECT_EQ(store->wait_for(std::span(keys).first(0), 1s), std::vector<std::string>{});
  EXPECT_EQ(store->wait_for(keys, 300ms), (std::vector<std::string>{"missing/1", "missing/2"}));
}

TEST_F(EtcdStoreOneMember, AWaitIsAWatchThatEndsWhenTheKeysAreSet) {
  const std::string id = fresh("watch");
  const auto waiter = open_store(cluster_->uri(), job(id, "t"));
  const auto writer = open_store(cluster_->uri(), job(id, "t"));
  std::vector<std::string> missing{"never"};
  const std::vector<std::string> keys{"rank/0", "rank/1", "rank/2"};
  const auto t0 = Clock::now();
  std::thread w([&] {
    for (const auto& k : keys) {
      std::this_thread::sleep_for(100ms);
      writer->set(k, bytes("addr " + k));
    }
  });
  missing = waiter->wait_for(keys, 60s);
  w.join();
  EXPECT_EQ(missing, std::vector<std::string>{});
  // Woken by the writes, not by the 60 s timeout (a generous bound: only a wait that missed
  // the events and ran out its time reaches it).
  EXPECT_LT(Clock::now() - t0, 50s);
  for (const auto& k : keys) EXPECT_EQ(text(waiter->get(k)), "addr " + k);
}

TEST_F(EtcdStoreOneMember, AbortEndsAWaitInProgress) {
  const auto store = open_store(cluster_->uri(), job(fresh("abort"), "t"));
  std::string caught;
  const auto t0 = Clock::now();
  std::thread w([&] {
    try {
      (void)store->wait_for(std::vector<std::string>{"never"}, 120s);
    } catch (const AbortedError& e) { caught = e.what(); }
  });
  std::this_thread::sleep_for(300ms);
  store->abort("a sibling rank failed");
  w.join();
  EXPECT_EQ(caught, "a sibling rank failed");
  EXPECT_LT(Clock::now() - t0, 100s);
}

TEST_F(EtcdStoreOneMember, OfConcurrentSetIfAbsentCallsExactlyOneWins) {
  constexpr int kRacers = 8, kRounds = 10;
  const std::string id = fresh("race");
  std::vector<std::shared_ptr<Store>> stores;
  for (int i = 0; i < kRacers; ++i) stores.push_back(open_store(cluster_->uri(), job(id, "t")));
  for (int round = 0; round < kRounds; ++round) {
    const std::string key = "decision/" + std::to_string(round);
    std::atomic<int> winners{0};
    std::vector<std::string> seen(kRacers), errors(kRacers);
    {
      std::vector<std::jthread> racers;
      for (int i = 0; i < kRacers; ++i)
        racers.emplace_back([&, i] {
          const auto k = static_cast<std::size_t>(i);
          try {
            if (stores[k]->set_if_absent(key, bytes("racer " + std::to_string(i)))) ++winners;
            seen[k] = text(stores[k]->get(key));
          } catch (const std::exception& e) { errors[k] = e.what(); }
        });
    }
    for (int i = 0; i < kRacers; ++i) ASSERT_EQ(errors[static_cast<std::size_t>(i)], "") << i;
    EXPECT_EQ(winners.load(), 1) << "round " << round;
    for (int i = 1; i < kRacers; ++i) EXPECT_EQ(seen[static_cast<std::size_t>(i)], seen[0]);
  }
}

TEST_F(EtcdStoreOneMember, AFencedProcessIsRefusedByEtcd) {
  const std::string id = fresh("fence");
  StoreOptions as1 = job(id, "t"), as2 = job(id, "t");
  as1.process = "process/1/0";
  as2.process = "process/2/0";
  const auto one = open_store(cluster_->uri(), as1);
  const auto two = open_store(cluster_->uri(), as2);
  one->set("before", bytes("x"));
  const std::string why = "process 1 was declared dead in epoch 1 and is fenced";
  EXPECT_TRUE(two->fence("process/1/0", why));
  auto expect_fenced = [&](const char* op, auto&& fn) {
    try {
      fn();
      ADD_FAILURE() << op << " of a fenced process succeeded";
    } catch (const FencedError& e) { EXPECT_EQ(std::string(e.what()), why) << op; }
  };
  expect_fenced("set", [&] { one->set("after", bytes("x")); });
  expect_fenced("set_if_absent", [&] { (void)one->set_if_absent("after", bytes("x")); });
  expect_fenced("get", [&] { (void)one->get("before"); });
  expect_fenced("has", [&] { (void)one->has("before"); });
  expect_fenced("wait", [&] { (void)one->wait_for(std::vector<std::string>{"before"}, 1s); });
  expect_fenced("open", [&] { (void)open_store(cluster_->uri(), as1); });
  // Nothing it tried reached the store; the other process goes on.
  EXPECT_FALSE(two->has("after"));
  two->set("after", bytes("y"));
  EXPECT_EQ(text(two->get("after")), "y");
  // A restart is another identity.
  StoreOptions restarted = as1;
  restarted.process = "process/1/1";
  EXPECT_TRUE(open_store(cluster_->uri(), restarted)->has("before"));
}

TEST_F(EtcdStoreOneMember, ThePrefixBelongsToTheJobThatClaimedItFirst) {
  const std::string prefix = fresh("shared-prefix");
  const auto first = open_store(cluster_->uri(prefix), job("job-a", "token-a"));
  first->set("k", bytes("v"));
  const auto t0 = Clock::now();
  try {
    (void)open_store(cluster_->uri(prefix), job("job-b", "token-b"));
    ADD_FAILURE() << "a second job opened the prefix";
  } catch (const JobConflictError& e) {
    EXPECT_NE(std::string(e.what()).find("is in use by job 'job-a' (this is job 'job-b')"),
              std::string::npos)
        << e.what();
  }
  try {
    (void)open_store(cluster_->uri(prefix), job("job-a", "another-token"));
    ADD_FAILURE() << "the same id with another token opened the prefix";
  } catch (const JobConflictError& e) {
    EXPECT_NE(std::string(e.what()).find("a different token"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("another-token"), std::string::npos) << "no token shown";
  }
  // At once, not at the 10 s timeout.
  EXPECT_LT(Clock::now() - t0, 9s);
  EXPECT_EQ(text(open_store(cluster_->uri(prefix), job("job-a", "token-a"))->get("k")), "v");
  // A rank's place, as on the other stores: the same id started twice fails at once.
  StoreOptions rank1 = job("job-a", "token-a");
  rank1.rank = 1;
  (void)open_store(cluster_->uri(prefix), rank1);
  // (This process again: allowed.)
  (void)open_store(cluster_->uri(prefix), rank1);
}

TEST_F(EtcdStoreOneMember, WithoutATokenTheJobSecretComesWithTheClaim) {
  const std::string id = fresh("secret");
  const auto a = open_store(cluster_->uri(), job(id));
  const auto b = open_store(cluster_->uri(), job(id));
  EXPECT_EQ(a->job_secret().size(), 64u);
  EXPECT_EQ(a->job_secret(), b->job_secret());
  EXPECT_EQ(effective_token(*b, ""), a->job_secret());
  EXPECT_THROW((void)open_store(cluster_->uri(), job(id, "now-a-token")), JobConflictError);
}

TEST(EtcdStoreInput, MalformedUrisAreConfigErrorsNamingTheStore) {
  for (const std::string uri :
       {"etcd://", "etcd://host", "etcd://host:0", "etcd://host:99999", "etcd://host:2379/",
        "etcd://a:1,,b:2", "etcd://a:1,b", "etcd://user@host:2379", "etcd://a:1/with space"}) {
    try {
      (void)open_store(uri, job("bad"));
      ADD_FAILURE() << uri << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.parameter(), "store") << uri;
      const std::string what = e.what();
      EXPECT_NE(what.find("etcd://[user:password@]host:port[,host:port...][/prefix]"),
                std::string::npos)
          << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
  // A password is never shown.
  try {
    (void)open_store("etcd://me:s3cret@host", job("bad"));
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find("s3cret"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("etcd://***@host"), std::string::npos) << e.what();
  }
}

TEST(EtcdStoreInput, AnUnreachableMemberListIsATimeoutNamingEachMember) {
  const std::string a = "127.0.0.1:" + std::to_string(test::free_port());
  const std::string b = "127.0.0.1:" + std::to_string(test::free_port());
  const auto t0 = Clock::now();
  try {
    (void)open_store("etcd://" + a + "," + b, job("nobody", "t", 1s));
    ADD_FAILURE() << "opened a store nobody serves";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no member answered within 1.0 s"), std::string::npos) << what;
    EXPECT_NE(what.find(a + ": "), std::string::npos) << what;
    EXPECT_NE(what.find(b + ": "), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  // Within the timeout (and far below a generous bound for a loaded machine).
  EXPECT_LT(Clock::now() - t0, 30s);
}

// Authentication on: the job's user, granted by root, with a password derived from the token.
TEST(EtcdStoreAuth, TheJobsUserIsTheTokensAndOnlyTheTokens) {
  test::EtcdCluster cluster(1);
  if (!cluster.available()) GTEST_SKIP() << cluster.why_not();
  if (cluster.etcdctl("user add root:rootpw") != 0 || cluster.etcdctl("auth enable") != 0)
    GTEST_SKIP() << "etcdctl (Debian's etcd-client) is needed to turn authentication on";
  const StoreOptions o = job("secure-job", "the-token", 10s);
  // Before the grant the job's user does not exist.
  try {
    (void)open_store(cluster.uri(), o);
    ADD_FAILURE() << "opened before the grant";
  } catch (const AuthenticationError& e) {
    EXPECT_NE(std::string(e.what()).find("etcd refused user 'commgrid-secure-job'"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find("the-token"), std::string::npos);
  }
  EXPECT_THROW((void)grant_etcd_job(cluster.uri(), "root", "wrong", o), AuthenticationError);
  EXPECT_TRUE(grant_etcd_job(cluster.uri(), "root", "rootpw", o));
  EXPECT_TRUE(grant_etcd_job(cluster.uri(), "root", "rootpw", o));  // again: nothing changes
  const auto store = open_store(cluster.uri(), o);
  store->set("k", bytes("v"));
  EXPECT_EQ(text(store->get("k")), "v");
  // Another token is another password: refused by etcd, as is a job without a token.
  EXPECT_THROW((void)open_store(cluster.uri(), job("secure-job", "other", 5s)),
               AuthenticationError);
  try {
    (void)open_store(cluster.uri(), job("secure-job", "", 5s));
    ADD_FAILURE() << "opened without a token";
  } catch (const AuthenticationError& e) {
    EXPECT_NE(std::string(e.what()).find("requires authentication"), std::string::npos) << e.what();
  }
  // The same id granted with another token: a conflict, said at once.
  EXPECT_THROW((void)grant_etcd_job(cluster.uri(), "root", "rootpw", job("secure-job", "other")),
               JobConflictError);
  // The job's user may use its prefix only.
  try {
    (void)open_store(cluster.uri("elsewhere"), o);
    ADD_FAILURE() << "the job's user wrote outside its prefix";
  } catch (const AuthenticationError& e) {
    EXPECT_NE(std::string(e.what()).find("permission denied"), std::string::npos) << e.what();
  }
  // Root by the URI (never shown).
  const auto as_root =
      open_store("etcd://root:rootpw@" + cluster.endpoint(0) + "/commgrid/secure-job",
                 job("secure-job", "the-token"));
  EXPECT_EQ(text(as_root->get("k")), "v");
  EXPECT_EQ(as_root->uri().find("rootpw"), std::string::npos);
}

// Three members: losing one loses nothing (requests and waits fail over); losing two loses
// the quorum, and requests end at their timeout naming each member.
TEST(EtcdStoreCluster, LosingOneMemberOfThreeLosesNothing) {
  test::EtcdCluster cluster(3);
  if (!cluster.available()) GTEST_SKIP() << cluster.why_not();
  const std::string id = fresh("three");
  StoreOptions o = job(id, "t", 8s);
  const auto a = open_store(cluster.uri(), o);
  const auto b = open_store(cluster.uri(), o);
  a->set("before", bytes("1"));
  // b waits (a watch on member 0, the first of the list) while member 0 dies; a's write
  // through another member still ends the wait.
  std::vector<std::string> missing{"never"};
  std::thread w([&] { missing = b->wait_for(std::vector<std::string>{"after"}, 60s); });
  std::this_thread::sleep_for(300ms);
  cluster.kill(0);
  a->set("after", bytes("2"));
  w.join();
  EXPECT_EQ(missing, std::vector<std::string>{});
  EXPECT_EQ(text(b->get("after")), "2");
  EXPECT_EQ(text(b->get("before")), "1");
  EXPECT_TRUE(b->set_if_absent("decision", bytes("b")));
  EXPECT_FALSE(a->set_if_absent("decision", bytes("a")));
  // A store opened now, with the dead member first in its list.
  EXPECT_EQ(text(open_store(cluster.uri(), o)->get("decision")), "b");
  // A stopped member (alive, silent) is passed over too.
  cluster.signal(1, SIGSTOP);
  try {
    StoreOptions quick = o;
    quick.timeout = 3s;
    const auto c = open_store(cluster.uri(), quick);
    ADD_FAILURE() << "two of three members lost, and a write went through";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no member answered within 3.0 s"), std::string::npos) << what;
    EXPECT_NE(what.find(cluster.endpoint(0)), std::string::npos) << what;
  }
  cluster.signal(1, SIGCONT);
  // Quorum back: the job's keys are all there.
  EXPECT_EQ(text(a->get("decision")), "b");
}

// Three members, the leader killed while a process waits and another writes: every request
// fails over to a member that answers and waits out the election ("no leader", "leader
// changed" and requests that time out meanwhile are sent again), the wait, a watch on the
// killed leader, ends when the key is set through another member, and a set_if_absent whose
// reply may have been lost with the leader still counts as this call's own.
TEST(EtcdStoreCluster, LosingTheLeaderLosesNothing) {
  test::EtcdCluster cluster(3);
  if (!cluster.available()) GTEST_SKIP() << cluster.why_not();
  int leader = -1;
  for (int i = 0; i < 100 && leader < 0; ++i) {
    leader = cluster.leader();
    if (leader < 0) std::this_thread::sleep_for(100ms);
  }
  if (leader < 0) GTEST_SKIP() << "etcdctl (Debian's etcd-client) is needed to find the leader";
  const std::string id = fresh("leader");
  // Both processes list the leader first: each loses the member it talks to.
  std::string uri = "etcd://" + cluster.endpoint(static_cast<std::size_t>(leader));
  for (std::size_t i = 0; i < cluster.size(); ++i)
    if (static_cast<int>(i) != leader) uri += "," + cluster.endpoint(i);
  // The timeout covers an election (the cluster's election timeout, 0.5 s, up to twice, and a
  // vote) with room for a loaded machine.
  StoreOptions o = job(id, "t", 20s);
  const auto a = open_store(uri, o);
  const auto b = open_store(uri, o);
  a->set("before", bytes("1"));
  std::vector<std::string> missing{"never"};
  std::thread w([&] { missing = b->wait_for(std::vector<std::string>{"after"}, 60s); });
  std::this_thread::sleep_for(300ms);
  cluster.kill(static_cast<std::size_t>(leader));
  a->set("after", bytes("2"));
  w.join();
  EXPECT_EQ(missing, std::vector<std::string>{});
  EXPECT_EQ(text(b->get("after")), "2");
  EXPECT_EQ(text(b->get("before")), "1");
  EXPECT_TRUE(a->set_if_absent("decision", bytes("a")));
  EXPECT_FALSE(b->set_if_absent("decision", bytes("b")));
  EXPECT_EQ(text(b->get("decision")), "a");
  // A new leader among the two left.
  int now = -1;
  for (int i = 0; i < 100 && now < 0; ++i) {
    now = cluster.leader();
    if (now < 0) std::this_thread::sleep_for(100ms);
  }
  EXPECT_GE(now, 0);
  EXPECT_NE(now, leader);
}

}  // namespace
}  // namespace commgrid
