// A write whose reply is lost after etcd applied it: the etcd:// store sends it again, finds
// the key set, and counts the write as its own only when the key holds exactly its value.
// Real etcd (one member started by the test) behind a TCP proxy of the test's own that, once,
// passes a request for one key to etcd and loses etcd's reply: withheld (the client's attempt
// runs out its time) or the connection reset as the reply arrives.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "etcd_cluster.hpp"

namespace commgrid {
namespace {

using namespace std::chrono_literals;

std::string text(const std::vector<char>& v) { return {v.begin(), v.end()}; }
std::span<const char> bytes(std::string_view s) { return {s.data(), s.size()}; }

// etcd's JSON gateway carries keys in base64 (RFC 4648, padded).
std::string base64(std::string_view s) {
  static constexpr char kDigits[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < s.size(); i += 3) {
    const size_t n = std::min<size_t>(3, s.size() - i);
    std::uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k)
      v = (v << 8) | (k < n ? static_cast<unsigned char>(s[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kDigits[(v >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

// How the proxy loses the reply.
enum class Loss {
  withheld,  // etcd's reply is read and thrown away; the connection stays open and silent
  reset,     // the connection to the client is reset when etcd's reply arrives
};

// A TCP proxy on a loopback port in front of one etcd member. Every connection is relayed
// both ways, except that the first connection carrying `marker` towards etcd loses what etcd
// answers from then on (`loss`). Counts the replies it lost.
class ReplyLosingProxy {
 public:
  ReplyLosingProxy(int etcd_port, std::string marker, Loss loss)
      : etcd_port_(etcd_port), marker_(std::move(marker)), loss_(loss) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;  // the kernel's choice: no race with another test for the port
    socklen_t len = sizeof(a);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(listener_, 16) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("proxy: cannot listen on loopback");
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~ReplyLosingProxy() {
    stop_ = true;
    acceptor_.join();
    std::lock_guard lock(m_);
    for (auto& t : relays_) t.join();
    ::close(listener_);
  }
  ReplyLosingProxy(const ReplyLosingProxy&) = delete;
  ReplyLosingProxy& operator=(const ReplyLosingProxy&) = delete;

  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] int lost() const { return lost_; }
  [[nodiscard]] int connections() const { return connections_; }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(etcd_port_));
      if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        ::close(server);
        ::close(client);
        continue;
      }
      ++connections_;
      std::lock_guard lock(m_);
      relays_.emplace_back([this, client, server] { relay(client, server); });
    }
  }

  // Both directions of one connection until either end closes (or the proxy stops).
  void relay(int client, int server) {
    bool losing = false;  // this connection carried the marker: etcd's answers are lost
    std::string seen;     // the request bytes' tail, where a marker may straddle two reads
    char buf[65536];
    pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    while (!stop_) {
      if (::poll(p, 2, 50) <= 0) continue;
      if (p[0].revents != 0) {
        const ssize_t n = ::recv(client, buf, sizeof buf, 0);
        if (n <= 0) break;
        seen.append(buf, static_cast<size_t>(n));
        if (!losing && seen.find(marker_) != std::string::npos && !armed_.exchange(true))
          losing = true;
        if (seen.size() > marker_.size()) seen.erase(0, seen.size() - marker_.size());
        if (::send(server, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
      }
      if (p[1].revents != 0) {
        const ssize_t n = ::recv(server, buf, sizeof buf, 0);
        if (n <= 0) break;
        if (losing) {
          ++lost_;  // etcd answered (it applied the request or refused it): lost
          if (loss_ == Loss::reset) {
            linger l{1, 0};  // close with a reset, as a member or a link that dies does
            ::setsockopt(client, SOL_SOCKET, SO_LINGER, &l, sizeof l);
            break;
          }
          losing = false;  // one reply withheld; then the client gives up on this connection
          p[1].fd = -1;    // and nothing more of etcd's reaches it
          continue;
        }
        if (::send(client, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
      }
    }
    ::close(client);
    ::close(server);
  }

  int etcd_port_;
  std::string marker_;
  Loss loss_;
  int listener_ = -1, port_ = 0;
  std::atomic<bool> stop_{false}, armed_{false};
  std::atomic<int> lost_{0}, connections_{0};
  std::mutex m_;
  std::vector<std::thread> relays_;
  std::thread acceptor_;
};

StoreOptions job(const std::string& id) {
  StoreOptions o;
  o.job_id = id;
  o.token = "t";
  o.timeout = 10s;  // an attempt is bounded by half of it: a withheld reply costs 5 s
  return o;
}

std::string fresh(const std::string& stem) {
  static std::atomic<int> n{0};
  return stem + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

class EtcdStoreLostReply : public ::testing::TestWithParam<Loss> {
 protected:
  static void SetUpTestSuite() { cluster_ = new test::EtcdCluster(1); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (!cluster_->available()) GTEST_SKIP() << cluster_->why_not();
  }
  // A proxy that loses etcd's reply to the first request naming `key` of job `id`.
  static std::unique_ptr<ReplyLosingProxy> proxy_for(const std::string& id,
                                                     const std::string& key) {
    const std::string endpoint = cluster_->endpoint(0);
    const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
    return std::make_unique<ReplyLosingProxy>(port, base64("commgrid/" + id + "/" + key),
                                              GetParam());
  }
  static std::string through(const ReplyLosingProxy& p) {
    return "etcd://127.0.0.1:" + std::to_string(p.port());
  }
  static test::EtcdCluster* cluster_;
};
test::EtcdCluster* EtcdStoreLostReply::cluster_ = nullptr;

// etcd applied the write, the reply was lost, the store sent it again and etcd refused it
// (the key exists): the key holds exactly this call's value, so the write is the call's own.
TEST_P(EtcdStoreLostReply, AWriteAppliedWhoseReplyWasLostIsTheCallsOwn) {
  const std::string id = fresh("lost");
  const auto proxy = proxy_for(id, "test/decision");
  const auto store = open_store(through(*proxy), job(id));
  EXPECT_TRUE(store->set_if_absent("test/decision", bytes("epoch 1: dead=2,3")));
  EXPECT_EQ(proxy->lost(), 1) << "the proxy lost no reply: the test tested nothing";
  // etcd holds the value, written once (read past the proxy).
  const auto direct = open_store(cluster_->uri(), job(id));
  EXPECT_EQ(text(direct->get("test/decision")), "epoch 1: dead=2,3");
  EXPECT_FALSE(direct->set_if_absent("test/decision", bytes("another")));

  // set (which fails when the key was set already) counts it its own the same way.
  const auto proxy2 = proxy_for(id, "test/world");
  const auto store2 = open_store(through(*proxy2), job(id));
  EXPECT_NO_THROW(store2->set("test/world", bytes("4 ranks")));
  EXPECT_EQ(proxy2->lost(), 1);
  EXPECT_EQ(text(direct->get("test/world")), "4 ranks");
}

// The key held another value before this call's request (another writer won): etcd refused
// the request, its reply was lost, and the retry finds the other's value: not this call's.
TEST_P(EtcdStoreLostReply, AKeyHoldingAnotherValueIsNotTheCallsOwn) {
  const std::string id = fresh("other");
  const auto direct = open_store(cluster_->uri(), job(id));
  direct->set("test/decision", bytes("the other's"));
  direct->set("test/world", bytes("the other's"));
  const auto proxy = proxy_for(id, "test/decision");
  const auto store = open_store(through(*proxy), job(id));
  EXPECT_FALSE(store->set_if_absent("test/decision", bytes("mine")));
  EXPECT_EQ(proxy->lost(), 1) << "the proxy lost no reply: the test tested nothing";
  EXPECT_EQ(text(direct->get("test/decision")), "the other's");

  const auto proxy2 = proxy_for(id, "test/world");
  const auto store2 = open_store(through(*proxy2), job(id));
  try {
    store2->set("test/world", bytes("mine"));
    ADD_FAILURE() << "set of a key another writer had set succeeded";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("'test/world' is already set"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(proxy2->lost(), 1);
  EXPECT_EQ(text(direct->get("test/world")), "the other's");
}

INSTANTIATE_TEST_SUITE_P(Loss, EtcdStoreLostReply, ::testing::Values(Loss::withheld, Loss::reset),
                         [](const auto& info) {
                           return info.param == Loss::withheld ? "ReplyWithheld"
                                                               : "ConnectionReset";
                         });

}  // namespace
}  // namespace commgrid
