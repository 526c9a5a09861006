// A job's claim on its store (issue 24, defects 3 and 4): without a token, the first rank to
// claim a store writes a random job secret with the claim and every rank of the job reads
// the same; each rank takes its place in the store, so that a second job with the same id
// fails at once instead of merging; on the file, Redis and tcp:// stores alike. And what the
// Redis store says when its server fails or its password holds an '@'.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <thread>

#include "redis_server.hpp"
#include "store_test_util.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

StoreOptions rank_of(const std::string& id, int rank, bool serve = false) {
  StoreOptions o = job(id, "", serve);
  o.rank = rank;
  return o;
}

// One store kind as the tests below use it: where, and whether rank 0 serves it.
struct Kind {
  std::string name, uri;
  bool served = false;
};

// Two token-less jobs with one id on one store: the first job's ranks share one random
// secret; the second job's ranks fail at once, each whose place the first job holds, with
// the same-id conflict; a rank opened again by its own process is fine.
void two_jobs_with_one_id(const Kind& kind) {
  SCOPED_TRACE(kind.name);
  std::vector<std::shared_ptr<Store>> first;
  for (int r = 0; r < 3; ++r)
    first.push_back(open_store(kind.uri, rank_of("default", r, kind.served && r == 0)));
  const std::string secret = first[0]->job_secret();
  EXPECT_EQ(secret.size(), 64u);
  for (const auto& s : first) EXPECT_EQ(s->job_secret(), secret);
  EXPECT_EQ(effective_token(*first[1], ""), secret);
  EXPECT_EQ(effective_token(*first[1], "a-token"), "a-token");
  // This process opening rank 1 again is the same rank, not a second job.
  EXPECT_NO_THROW(open_store(kind.uri, rank_of("default", 1)));

  const auto t0 = std::chrono::steady_clock::now();
  for (int r = kind.served ? 1 : 0; r < 3; ++r) {
    // The second job's ranks are other processes: a child opens the store as rank r.
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::string out = "opened";
      try {
        open_store(kind.uri, rank_of("default", r));
      } catch (const JobConflictError& e) { out = e.what(); } catch (const std::exception& e) {
        out = std::string("not a JobConflictError: ") + e.what();
      }
      (void)!::write(pipe_fds[1], out.data(), out.size());
      ::_exit(0);
    }
    ::close(pipe_fds[1]);
    std::string out;
    char buf[512];
    for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;)
      out.append(buf, static_cast<size_t>(n));
    ::close(pipe_fds[0]);
    ::waitpid(pid, nullptr, 0);
    EXPECT_TRUE(has(out, "is in use by another job with the same id 'default': its rank " +
                             std::to_string(r) + " has joined the store already"))
        << "rank " << r << ": " << out;
    EXPECT_FALSE(has(out, secret)) << "secret shown";
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s) << "the second job must fail at once";
  // The first job's store is untouched.
  first[2]->set("k", std::span<const char>("v", 1));
  EXPECT_TRUE(first[1]->has("k"));
}

TEST(JobClaims, TwoTokenlessJobsWithOneIdOnAFileStore) {
  TempFolder dir;
  two_jobs_with_one_id({"file", "file://" + dir.path()});
}

TEST(JobClaims, TwoTokenlessJobsWithOneIdOnARedisStore) {
  RedisServer redis;
  if (!redis.available()) GTEST_SKIP() << "redis-server not found or did not start";
  two_jobs_with_one_id({"redis", redis.uri("shared")});
}

TEST(JobClaims, TwoTokenlessJobsWithOneIdOnATcpStore) {
  const int port = free_port();
  two_jobs_with_one_id({"tcp", tcp_uri(port), true});
  // The second job's rank 0 cannot serve on the port the first job's rank 0 holds.
  EXPECT_THROW(open_store(tcp_uri(port), rank_of("default", 0, true)), JobConflictError);
}

TEST(JobClaims, ATokenAndNoTokenDoNotMix) {
  TempFolder dir;
  auto tokenless = open_store("file://" + dir.path(), job("a", "", false));
  try {
    open_store("file://" + dir.path(), job("a", "s3cret", false));
    ADD_FAILURE() << "a job with a token joined a token-less claim";
  } catch (const JobConflictError& e) {
    EXPECT_TRUE(
        has(e.what(),
            "in use by another job with the id 'a' and a different token (that job has none)"))
        << e.what();
    EXPECT_FALSE(has(e.what(), "s3cret")) << "token shown";
  }
  TempFolder other;
  auto with_token = open_store("file://" + other.path(), job("a", "s3cret", false));
  EXPECT_EQ(with_token->job_secret(), "");  // the token is the secret
  try {
    open_store("file://" + other.path(), job("a", "", false));
    ADD_FAILURE() << "a token-less job joined a claim with a token";
  } catch (const JobConflictError& e) {
    EXPECT_TRUE(has(e.what(), "(that job has a token, this one none)")) << e.what();
  }
}

TEST(JobClaims, EveryStoreHasASecretWithoutAToken) {
  auto memory = make_memory_store();
  EXPECT_EQ(memory->job_secret().size(), 64u);
  EXPECT_NE(make_memory_store()->job_secret(), memory->job_secret());  // random
  const int port = free_port();
  auto server = open_store(tcp_uri(port), job("s", "", true));
  auto client = open_store(tcp_uri(port), job("s", "", false));
  EXPECT_EQ(server->job_secret().size(), 64u);
  EXPECT_EQ(client->job_secret(), server->job_secret());
  // With a token, the token is what is proven and the store carries no secret.
  const int port2 = free_port();
  auto s2 = open_store(tcp_uri(port2), job("s", "tok", true));
  EXPECT_EQ(open_store(tcp_uri(port2), job("s", "tok", false))->job_secret(), "");
  EXPECT_EQ(effective_token(*s2, "tok"), "tok");
}

// ---- Redis: what a failure says ------------------------------------------------------------

TEST(RedisStoreErrors, APasswordWithAnAtSignWorksAndIsNeverShown) {
  const std::string password = "S3cr3t@PW/" + std::to_string(::getpid());
  RedisServer redis(password);
  if (!redis.available()) GTEST_SKIP() << "redis-server not found or did not start";
  const std::string at = "127.0.0.1:" + std::to_string(redis.port());
  auto store = open_store("redis://:" + password + "@" + at + "/p");
  store->set("k", std::span<const char>("v", 1));
  EXPECT_TRUE(store->has("k"));
  EXPECT_EQ(store->uri(), "redis://" + at + "/p");
  for (const std::string& uri : {"redis://:" + password + "@" + at + ":x/p",  // bad port
                                 "redis://:" + password + "@h:0/p"}) {
    try {
      open_store(uri);
      ADD_FAILURE() << "accepted a bad port";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_FALSE(has(what, "PW")) << what;
      EXPECT_FALSE(has(what, "S3cr3t")) << what;
      EXPECT_TRUE(has(what, "redis://***@")) << what;
    }
  }
  try {
    open_store("redis://:wrong@" + password + "@" + at + "/p");  // a wrong password, with '@'
    ADD_FAILURE() << "a wrong password was accepted";
  } catch (const BackendError& e) { EXPECT_FALSE(has(e.what(), "PW")) << e.what(); }
}

TEST(RedisStoreErrors, AFrozenServerIsATimeoutSayingItDidNotAnswer) {
  RedisServer redis;
  if (!redis.available()) GTEST_SKIP() << "redis-server not found or did not start";
  StoreOptions o = job("f", "", false, 1s);
  auto store = open_store(redis.uri("frozen"), o);
  redis.signal(SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    store->wait_for(std::vector<std::string>{"never"}, 1s);
    ADD_FAILURE() << "a frozen server answered";
  } catch (const TimeoutError& e) {
    EXPECT_TRUE(has(e.what(), "redis EXISTS on redis://127.0.0.1:" + std::to_string(redis.port()) +
                                  "/frozen: the server did not answer within 1.0 s"))
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s + 30s) << "the frozen server held the wait";
  // Opening a store on it fails within the timeout too.
  try {
    open_store(redis.uri("frozen2"), o);
    ADD_FAILURE() << "opened a store on a frozen server";
  } catch (const TimeoutError& e) { EXPECT_TRUE(has(e.what(), "did not answer")) << e.what(); }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s + 30s) << "the frozen server held the open";
  redis.signal(SIGCONT);
}

TEST(RedisStoreErrors, AKilledServerIsNamedAsGone) {
  RedisServer redis;
  if (!redis.available()) GTEST_SKIP() << "redis-server not found or did not start";
  auto store = open_store(redis.uri("killed"), job("k", "", false, 2s));
  redis.signal(SIGKILL);
  std::this_thread::sleep_for(200ms);
  try {
    (void)store->has("k");
    ADD_FAILURE() << "a killed server answered";
  } catch (const BackendError& e) {
    EXPECT_TRUE(has(e.what(), "the server closed the connection")) << e.what();
  }
  try {
    open_store(redis.uri("killed"), job("k", "", false, 2s));
    ADD_FAILURE() << "opened a store on a killed server";
  } catch (const BackendError& e) {
    EXPECT_TRUE(has(e.what(), "nothing listens there")) << e.what();
  }
}

}  // namespace
}  // namespace commgrid::test
