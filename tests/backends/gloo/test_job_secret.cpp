// Without a token, the Gloo gate and pair proofs use the store's job secret (issue 24,
// defect 3): the proof a job without a token used to send was 64 '0' characters, which a
// stranger sent too, followed by a crafted Gloo header that aborted every rank.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gloo_test_util.hpp"
#include "pair_gate.hpp"
#include "store_test_util.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;

std::mutex g_mutex;
std::vector<int> g_fds;
std::atomic<int> g_attacks{0};

// Connects to a pair listener the moment it exists and sends what passed the gate of a job
// without a token: the no-token proof, then a Gloo header for a slot nobody posted.
void stranger_with_the_no_token_proof(int port) {
  const int fd = raw_connect(port);
  if (fd < 0) return;
  std::string bytes(64, '0');
  // Gloo's preamble: nbytes, opcode (1: to an unbound buffer), slot, offset, length, roffset.
  const std::uint64_t header[8] = {64, 1, 0x7e57ab1e, 0, 16, 0, 0xdeadbeef, 0xfeedface};
  bytes.append(reinterpret_cast<const char*>(header), sizeof(header));
  (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  std::lock_guard lock(g_mutex);
  g_fds.push_back(fd);  // stays connected
  ++g_attacks;
}

struct Outcome {
  bool ok = false;
  std::string error;
};

std::vector<Outcome> tokenless_worlds(int n, const std::shared_ptr<Store>& store) {
  std::vector<Outcome> out(static_cast<size_t>(n));
  std::vector<std::jthread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      try {
        GlooOptions o = test_options(5s);
        o.token = "";  // no COMMGRID_TOKEN
        auto world = make_gloo_world(placed(store, r, n, o));
        world->barrier()->wait();
        out[static_cast<size_t>(r)].ok = true;
      } catch (const std::exception& e) { out[static_cast<size_t>(r)].error = e.what(); }
    });
  ranks.clear();
  return out;
}

TEST(GlooJobSecret, AStrangerSendingTheNoTokenProofIsRefusedAndTheWorldForms) {
  ASSERT_TRUE(gloo_backend::pair_gate_available()) << "the gate is off in this program";
  auto store = make_memory_store();
  ASSERT_EQ(store->job_secret().size(), 64u);
  gloo_backend::set_pair_gate_listen_hook(&stranger_with_the_no_token_proof);
  const std::vector<Outcome> out = tokenless_worlds(3, store);
  gloo_backend::set_pair_gate_listen_hook(nullptr);
  // This process is alive (Gloo never parsed the header), every stranger was refused (its
  // connection closed after the listener's proof alone), and the genuine peers still
  // connected: the world formed on every rank.
  EXPECT_EQ(g_attacks.load(), 6);
  for (const Outcome& r : out) {
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.error.find(store->job_secret()), std::string::npos) << "secret shown";
  }
  std::lock_guard lock(g_mutex);
  expect_refused_by_the_gate(g_fds);
}

TEST(GlooJobSecret, RanksOfAnotherStoreCannotProveThisJobsSecret) {
  // Two token-less rank groups that share the pairs' addresses but not the store's secret
  // (as a stranger who forged the store's keys would): each refuses the other.
  auto a = make_memory_store();
  std::vector<std::string> errors(2);
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        GlooOptions o = test_options(5s);
        // Rank 1 has the addresses (the same store) but proves another secret.
        o.token = r == 0 ? "" : std::string(64, 'f');
        try {
          (void)make_gloo_world(placed(a, r, 2, o));  // expected to throw
        } catch (const std::exception& e) { errors[static_cast<size_t>(r)] = e.what(); }
      });
  }
  for (const std::string& e : errors)
    EXPECT_NE(e.find("unauthenticated peer at 127.0.0.1:"), std::string::npos) << e;
}

}  // namespace
}  // namespace commgrid::test
