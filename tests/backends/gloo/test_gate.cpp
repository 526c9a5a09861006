// The connection gate (src/backends/gloo/pair_gate.hpp): a stranger that connects to a Gloo
// pair listener before the genuine peer never has a byte parsed by Gloo, and holds up no
// pair. Without the gate, the header sent here makes Gloo's event loop throw on its own
// thread (SIGABRT).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <mutex>
#include <thread>
#include <vector>

#include "gloo_test_util.hpp"
#include "pair_gate.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;

std::mutex g_mutex;
std::vector<int> g_stranger_fds;
std::atomic<int> g_strangers{0};

// Connects to a pair listener the moment it exists (so it is first in the queue) and sends
// a Gloo message header for an unbound-buffer slot nobody posted, plus 16 payload bytes.
void stranger_sends_a_crafted_header(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return;
  }
  // Gloo's preamble: nbytes, opcode (1: to an unbound buffer), slot, offset, length, roffset.
  const std::uint64_t message[8] = {64, 1, 0x7e57ab1e, 0, 16, 0, 0xdeadbeef, 0xfeedface};
  (void)!::send(fd, message, sizeof(message), MSG_NOSIGNAL);
  std::lock_guard lock(g_mutex);
  g_stranger_fds.push_back(fd);  // kept open: the stranger stays connected
  ++g_strangers;
}

struct Outcome {
  bool ok = false;
  std::string error;
};

std::vector<Outcome> make_worlds(int n, GlooOptions o) {
  auto store = make_memory_store();
  std::vector<Outcome> out(static_cast<size_t>(n));
  std::vector<std::jthread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      try {
        auto world = make_gloo_world(placed(store, r, n, o));
        world->barrier()->wait();
        out[static_cast<size_t>(r)].ok = true;
      } catch (const AuthenticationError& e) {
        out[static_cast<size_t>(r)].error = e.what();
      } catch (const std::exception& e) {
        out[static_cast<size_t>(r)].error = std::string("not an AuthenticationError: ") + e.what();
      }
    });
  ranks.clear();
  return out;
}

TEST(GlooGate, IsOnInAProgramLinkedWithCommgrid) {
  // The gate replaces accept/connect/listen for the process; this test program links the
  // backend statically, as the CLI and users' programs do.
  EXPECT_TRUE(gloo_backend::pair_gate_available());
}

// With `stranger(port)` run on every pair listener of an n-rank world as it is made: the
// stranger reached all n(n-1) listeners, the world formed on every rank, and each
// stranger's connection was closed by the gate.
void expect_world_forms_despite(void (*stranger)(int port), int n, const GlooOptions& o) {
  ASSERT_TRUE(gloo_backend::pair_gate_available()) << "the gate is off in this program";
  g_strangers = 0;
  gloo_backend::set_pair_gate_listen_hook(stranger);
  const std::vector<Outcome> out = make_worlds(n, o);
  gloo_backend::set_pair_gate_listen_hook(nullptr);
  EXPECT_EQ(g_strangers.load(), n * (n - 1)) << "every rank's listeners were reached";
  for (const Outcome& r : out) EXPECT_TRUE(r.ok) << r.error;
  std::lock_guard lock(g_mutex);
  expect_refused_by_the_gate(g_stranger_fds);
}

TEST(GlooGate, AStrangerFirstOnEveryListenerIsRefusedAndTheWorldStillForms) {
  // A stranger connects to every pair listener before the genuine peer can and sends a
  // crafted header: the gate refuses each on its own thread, Gloo never reads a byte of
  // theirs, and every genuine peer still connects.
  GlooOptions o = test_options(20s);
  o.token = "the-job-token";
  expect_world_forms_despite(&stranger_sends_a_crafted_header, 3, o);
}

// Connects to a pair listener the moment it exists and says nothing.
void silent_stranger(int port) {
  const int fd = raw_connect(port);
  if (fd < 0) return;
  std::lock_guard lock(g_mutex);
  g_stranger_fds.push_back(fd);
  ++g_strangers;
}

TEST(GlooGate, ASilentStrangerOnEveryListenerHoldsUpNoPair) {
  // A silent connection is not refused before the deadline (a genuine proof can take
  // seconds), but it must not hold up the other pairs of its rank: when the gate waited for
  // the genuine peer on Gloo's event-loop thread, one silent stranger on one listener of a
  // 4-rank world (any process on the host that reached the port) made the whole creation
  // time out naming an innocent peer.
  expect_world_forms_despite(&silent_stranger, 4, test_options(20s));
}

TEST(GlooGate, AConnectorWithAnotherTokenIsRefusedByTheListenerAndRefusesIt) {
  // Two ranks that were given different tokens: whichever side listens, both name the
  // other as an unauthenticated peer, from the gate's proofs, before Gloo sees a byte.
  auto store = make_memory_store();
  std::vector<std::string> errors(2);
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        GlooOptions o = test_options(5s);
        o.token = r == 0 ? "token-a" : "token-b";
        try {
          (void)make_gloo_world(placed(store, r, 2, o));
        } catch (const std::exception& e) { errors[static_cast<size_t>(r)] = e.what(); }
      });
  }
  // The connector checks the listener's proof first: it refuses it ("did not prove"); the
  // listener then sees its connector close without a proof.
  int wrong_proof = 0;
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("unauthenticated peer at 127.0.0.1:"), std::string::npos) << e;
    if (e.find("did not prove the job's token") != std::string::npos) ++wrong_proof;
  }
  EXPECT_EQ(wrong_proof, 1) << errors[0] << "\n" << errors[1];
}

// Rank 0 of a 2-rank world whose rank 1 the test plays: the TimeoutError's text (or what
// else was thrown) and how long creating the world took.
std::pair<std::string, std::chrono::steady_clock::duration> rank_zero_times_out(
    const std::shared_ptr<Store>& store, const GlooOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    (void)make_gloo_world(placed(store, 0, 2, o));
    error = "the world formed";
  } catch (const TimeoutError& e) { error = e.what(); } catch (const std::exception& e) {
    error = std::string("not a TimeoutError: ") + e.what();
  }
  return {error, std::chrono::steady_clock::now() - t0};
}

// A store in which rank 1 of a 2-rank world under `o` arrived and published an address
// (the highest port, so rank 0 is the listening side of their pair) but never connects.
std::shared_ptr<Store> rank_one_never_connects(const GlooOptions& o) {
  auto store = make_memory_store();
  auto put = [&](const std::string& key, const std::vector<char>& value) {
    store->set(o.prefix + "/" + key, std::span<const char>(value.data(), value.size()));
  };
  put("size/1", {'2'});
  put("arrived/1", {'1'});
  std::vector<char> address(sizeof(sockaddr_storage) + sizeof(std::int64_t), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(65535);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::memcpy(address.data(), &a, sizeof(a));
  address.push_back('g');  // it gates its connections, like rank 0
  put("pair/1/0", address);
  return store;
}

// The process takes every descriptor left (under a limit of 4096), then a stranger, whose
// socket was made before, connects to the listener: the gate's accept4 fails with EMFILE
// while the connection waits in the backlog.
void no_descriptors_left_then_a_stranger(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = std::min<rlim_t>(r.rlim_cur, 4096);
  ::setrlimit(RLIMIT_NOFILE, &r);
  while (::open("/dev/null", O_RDONLY | O_CLOEXEC) >= 0) {}
  const bool exhausted = errno == EMFILE;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  g_strangers =
      exhausted && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 ? 1 : -1;
}

// The child of the test below: rank 0 of a world whose rank 1 never connects (a 3 s
// deadline), out of descriptors with a connection waiting on its listener. Exits 0 when the
// descriptors ran out, the world did not form, and its CPU time over the wait stayed under
// 1 s; its line on stderr says what it measured.
[[noreturn]] void wait_out_of_descriptors() {
  const GlooOptions o = test_options(3s);
  const std::shared_ptr<Store> store = rank_one_never_connects(o);
  gloo_backend::set_pair_gate_listen_hook(no_descriptors_left_then_a_stranger);
  timespec c0{}, c1{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
  const auto [error, took] = rank_zero_times_out(store, o);
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
  const double cpu = static_cast<double>(c1.tv_sec - c0.tv_sec) +
                     static_cast<double>(c1.tv_nsec - c0.tv_nsec) * 1e-9;
  std::cerr << "out of descriptors: " << g_strangers.load() << ", cpu " << cpu << " s over "
            << std::chrono::duration<double>(took).count() << " s: " << error << "\n";
  const bool ok =
      g_strangers.load() == 1 && error.find("the world formed") == std::string::npos && cpu < 1.0;
  std::_Exit(ok ? 0 : 1);
}

// A process out of descriptors cannot accept the connection waiting on a listener, and the
// listening socket stays readable: the gate rests that listener and tries again every few
// milliseconds, rather than spinning on it until the creation's deadline. In a child
// process (the descriptors are the whole process's), whose CPU time over the 3 s wait must
// stay well under it (a spinning gate thread takes all of it on an idle core).
TEST(GlooGate, AProcessOutOfDescriptorsDoesNotSpinOnAWaitingConnection) {
#ifdef COMMGRID_TEST_UNDER_ASAN
  GTEST_SKIP() << "under the sanitizers: their runtime needs descriptors of its own (it "
                  "checks memory through a pipe), and this test takes every one";
#endif
  ASSERT_TRUE(gloo_backend::pair_gate_available()) << "the gate is off in this program";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(wait_out_of_descriptors(), ::testing::ExitedWithCode(0),
              "out of descriptors: 1, cpu");
}

std::atomic<bool> g_listening{false};
void note_listening(int /*port*/) { g_listening = true; }

// A program that forks (a data loader's workers) while another thread holds the gate's lock
// (the gate's thread, a creation): the child starts with the lock free and none of the
// parent's listeners, so its own getsockname() and accept() return at once. Without that,
// the child's first such call waits forever for a lock no thread of the child will release.
TEST(GlooGate, AChildForkedWhileTheGateIsLockedIsNotHeldByIt) {
  ASSERT_TRUE(gloo_backend::pair_gate_available()) << "the gate is off in this program";
  // A listener recorded and waiting (rank 1 never connects): the interposed calls consult
  // the records while it is there.
  const GlooOptions o = test_options(3s);
  const std::shared_ptr<Store> store = rank_one_never_connects(o);
  g_listening = false;
  gloo_backend::set_pair_gate_listen_hook(note_listening);
  std::string error;
  std::jthread creation([&] { error = rank_zero_times_out(store, o).first; });
  for (int i = 0; i < 1000 && !g_listening; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(g_listening) << "no listener was recorded within 5 s";

  std::atomic<bool> held{false};
  std::jthread holder([&] {
    const std::unique_lock lock = gloo_backend::lock_pair_gate_for_testing();
    held = true;
    std::this_thread::sleep_for(200ms);
  });
  while (!held) std::this_thread::sleep_for(1ms);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    const bool named = ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    ::_exit(named ? 0 : 3);
  }
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 2000 && done == 0; ++i) {  // 10 s
    done = ::waitpid(child, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(5ms);
  }
  if (done == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  EXPECT_NE(done, 0) << "the child's getsockname() still waited after 10 s";
  EXPECT_TRUE(done == 0 || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) << status;
  creation.join();
  gloo_backend::set_pair_gate_listen_hook(nullptr);
  EXPECT_EQ(error.find("the world formed"), std::string::npos) << error;
}

TEST(GlooGate, AGenuinePeerWhoseProofTakesSecondsIsAcceptedWithinTheDeadline) {
  // A slow, lossy link (200 ms each way, a retransmission or two) can hold a connector's
  // proof for seconds after the listener accepted it: every connector here waits 2.5 s
  // before sending it, and the world still forms (silence is not a refusal).
  ASSERT_TRUE(gloo_backend::pair_gate_available()) << "the gate is off in this program";
  GlooOptions o = test_options(30s);
  o.token = "the-job-token";
  gloo_backend::set_pair_gate_connect_delay_for_testing(2500ms);
  const std::vector<Outcome> out = make_worlds(3, o);
  gloo_backend::set_pair_gate_connect_delay_for_testing(0ms);
  for (const Outcome& r : out) EXPECT_TRUE(r.ok) << r.error;
}

TEST(GlooGate, AListenerStillWaitingAtTheDeadlineEndsThenNamingTheLatePeer) {
  // Gloo bounds each pair's wait for its connector on its own, one pair after another; the
  // gate ends every wait still open at the creation's deadline. Rank 1 here is played by
  // the test: it arrives and publishes an address (the highest port, so rank 0 is the
  // listening side of their pair) but never connects.
  ASSERT_TRUE(gloo_backend::pair_gate_available()) << "the gate is off in this program";
  const GlooOptions o = test_options(2s);
  const auto [error, took] = rank_zero_times_out(rank_one_never_connects(o), o);
  EXPECT_NE(error.find("timed out after 2 s waiting for rank 1 (global 1) of 2 to connect"),
            std::string::npos)
      << error;
  EXPECT_LT(took, 2s + 30s) << "the deadline did not end the wait";
}

TEST(GlooCreationDeadline, TheWorldsSizeCheckAndConnectionsShareOneDeadline) {
  // Rank 1 (played by the test) says its world size late, at 7 s of an 8 s timeout, and
  // then never connects. Rank 0 must end at the 8 s deadline, not 8 s after the size check
  // (at 15 s): the 7 s between them leave room for a loaded machine.
  auto store = make_memory_store();
  GlooOptions o = test_options(8s);
  std::jthread late([&] {
    std::this_thread::sleep_for(7s);
    store->set(o.prefix + "/size/1", std::span<const char>("2", 1));
  });
  const auto [error, took] = rank_zero_times_out(store, o);
  EXPECT_NE(error.find("timed out after 8 s"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
  EXPECT_LT(took, 14s) << "the deadline was counted from the size check";
  EXPECT_GE(took, 7900ms);  // the timeout guarantees it
}

TEST(GlooCreationDeadline, ASplitsExchangeAndCreationShareOneDeadline) {
  // Rank 1 calls split 7 s late (of an 8 s timeout) and its rendezvous keys for the new
  // group never arrive: rank 0 must end 8 s after it called split, not 8 s after the
  // exchange (at 15 s): the 7 s between them leave room for a loaded machine.
  const GlooOptions o = test_options(8s);
  auto store = std::make_shared<HookedMemoryStore>(
      StoreHooks{.on_set = [](const std::string& key, const std::vector<char>&) {
        for (const char* dropped : {"/split0/c0/arrived/1", "/split0/c0/pair/1/0"})
          if (key.ends_with(dropped)) return false;
        return true;
      }});
  std::string error;
  std::chrono::steady_clock::duration took{};
  auto rank = [&](Communicator& world) {
    if (world.rank() == 1) {
      std::this_thread::sleep_for(7s);
      try {
        (void)world.split(0, 1, "late");
      } catch (const std::exception&) {  // its peer gave up: expected
      }
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      (void)world.split(0, 0, "late");
      error = "the group formed";
    } catch (const TimeoutError& e) { error = e.what(); } catch (const std::exception& e) {
      error = std::string("not a TimeoutError: ") + e.what();
    }
    took = std::chrono::steady_clock::now() - t0;
  };
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        auto world = make_gloo_world(placed(store, r, 2, o));
        rank(*world);
      });
  }
  EXPECT_NE(error.find("timed out after 8 s waiting for rank 1"), std::string::npos) << error;
  EXPECT_LT(took, 14s) << "the deadline was counted from the exchange";
}

}  // namespace
}  // namespace commgrid::test
