// The tcp:// store as its ranks use it: the serving process calls its server directly, every
// other process connects (retrying while rank 0 starts, backing off while it refuses for a
// limit), proves the token (tcp_auth.hpp) and sends one request at a time, each bounded by
// the store's timeout.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "job_claim.hpp"
#include "tcp_auth.hpp"
#include "tcp_server.hpp"
#include "tcp_store.hpp"
#include "text.hpp"

namespace commgrid::bootstrap {
namespace {

using tcp::Clock;
using tcp::Handshake;
using tcp::IoError;
using tcp::IoTimeout;
using tcp::Message;
using tcp::Ms;
using tcp::Socket;
using tcp::TcpStoreServer;

// How much of a server's refusal or fencing message an error quotes.
constexpr std::size_t kShownReply = 300;

std::string seconds_text(Ms d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

class TcpStore final : public Store {
 public:
  TcpStore(std::string host, int port, StoreOptions options)
      : host_(std::move(host)), port_(port), options_(std::move(options)) {
    if (options_.serve) {
      server_ = std::make_unique<TcpStoreServer>(host_, port_, options_);
      local_ = server_->address();
      set_job_secret(server_->secret());
      return;
    }
    set_job_secret(connect());
    identify();
  }

  [[nodiscard]] std::string uri() const override {
    return "tcp://" + host_ + ":" + std::to_string(port_);
  }
  [[nodiscard]] std::string local_address() const override { return local_; }

 protected:
  // A set is a set_if_absent whose "already set" is an error (the server also still
  // answers the older 'S' request of a client that sends it).
  void do_set(const std::string& key, const std::vector<char>& value) override {
    if (!do_set_if_absent(key, value))
      throw BackendError("tcp store " + uri() + ": key '" + key + "' is already set");
  }
  bool do_set_if_absent(const std::string& key, const std::vector<char>& value) override {
    check_sizes(key, value.size());
    if (server_) {
      std::string why;
      switch (server_->set(key, std::string_view(value.data(), value.size()), &why)) {
        case TcpStoreServer::SetResult::ok: return true;
        case TcpStoreServer::SetResult::exists: return false;
        case TcpStoreServer::SetResult::full: throw BackendError("tcp store " + uri() + ": " + why);
      }
    }
    Message r = request({'X', {key, std::string(value.begin(), value.end())}});
    if (r.type == 'E' && !r.fields.empty())
      throw BackendError("tcp store " + uri() +
                         ": the server refused it: " + quote_untrusted(r.fields[0], kShownReply));
    if (r.type != 'K' && r.type != 'F')
      throw BackendError("tcp store " + uri() + ": unexpected reply to set_if_absent");
    return r.type == 'K';
  }
  bool do_fence(const std::string& process, const std::string& message) override {
    if (server_) {
      server_->fence(process, message);
      return true;
    }
    Message r = request({'P', {process, message}});
    if (r.type != 'K') throw BackendError("tcp store " + uri() + ": unexpected reply to fence");
    return true;
  }
  std::vector<char> do_get(const std::string& key) override {
    check_sizes(key, 0);
    std::optional<std::string> v;
    if (server_) {
      v = server_->get(key);
    } else {
      Message r = request({'G', {key}});
      if (r.type == 'V' && r.fields.size() == 1) v = std::move(r.fields[0]);
      else if (r.type != 'N')
        throw BackendError("tcp store " + uri() + ": unexpected reply to get");
    }
    if (!v) throw BackendError("tcp store " + uri() + ": key '" + key + "' is not set");
    return {v->begin(), v->end()};
  }
  bool do_has(const std::string& key) override {
    check_sizes(key, 0);
    if (server_) return server_->has(key);
    Message r = request({'C', {key}});
    if (r.type != 'Y' && r.type != 'N')
      throw BackendError("tcp store " + uri() + ": unexpected reply to check");
    return r.type == 'Y';
  }
  // The server answers a wait when the keys are set: no polling, and a key is seen the
  // moment it is set.
  std::vector<std::string> do_wait(std::vector<std::string> keys, Ms slice) override {
    if (keys.empty()) return keys;
    for (const auto& k : keys) check_sizes(k, 0);
    if (server_) return server_->wait(std::move(keys), slice);
    // A wait longer than one request may carry is asked in parts, in order; the first part
    // with keys still missing ends this round (wait_for asks again).
    for (size_t begin = 0; begin < keys.size();) {
      size_t end = begin, bytes = 1 + 4 + 20;  // the type and the slice's field
      while (end < keys.size() && end - begin < kTcpStoreMaxWaitKeys &&
             bytes + 4 + keys[end].size() <= kTcpStoreMaxWaitBytes)
        bytes += 4 + keys[end++].size();
      Message m{'W', {std::to_string(slice.count())}};
      m.fields.insert(m.fields.end(), keys.begin() + static_cast<std::ptrdiff_t>(begin),
                      keys.begin() + static_cast<std::ptrdiff_t>(end));
      std::optional<Message> r = request(m, slice, &abort_flag());
      if (!r) return keys;  // aborted: wait_for says so
      if (r->type == 'E' && !r->fields.empty())
        throw BackendError("tcp store " + uri() + ": the server refused a wait: " +
                           quote_untrusted(r->fields[0], kShownReply));
      if (r->type != 'M') throw BackendError("tcp store " + uri() + ": unexpected reply to wait");
      if (!r->fields.empty()) {
        std::vector<std::string> missing = std::move(r->fields);
        missing.insert(missing.end(), keys.begin() + static_cast<std::ptrdiff_t>(end), keys.end());
        return missing;
      }
      begin = end;
    }
    return {};
  }
  [[nodiscard]] bool waits_in_slices() const override { return true; }

 private:
  void check_sizes(const std::string& key, size_t value) const {
    if (key.size() > kTcpStoreMaxKey)
      throw BackendError("tcp store " + uri() + ": a key of " + std::to_string(key.size()) +
                         " bytes exceeds the limit of " + std::to_string(kTcpStoreMaxKey) +
                         " bytes per key");
    if (value > kTcpStoreMaxValue)
      throw BackendError("tcp store " + uri() + ": a value of " + std::to_string(value) +
                         " bytes exceeds the limit of " + std::to_string(kTcpStoreMaxValue) +
                         " bytes per value");
  }

  // Tells the server which process this connection is (StoreOptions::process), so that a
  // fence of it closes this connection too; FencedError when it was fenced already.
  void identify() {
    if (options_.process.empty()) return;
    Message r = request({'I', {options_.process}});
    if (r.type != 'K') throw BackendError("tcp store " + uri() + ": unexpected reply to identify");
  }

  // Connects, retrying while the server (rank 0) is not listening yet, refuses this rank
  // for a limit (the refusal is said if it lasts the whole timeout) or drops the connection
  // before the handshake ends; then proves the token and checks the server's proof; all
  // within options_.timeout. Returns the job secret the server sent.
  std::string connect() {
    const auto start = Clock::now();
    const auto deadline = start + options_.timeout;
    const auto where = tcp::resolve(uri(), host_, port_);
    std::string last = "no address", refusal;
    std::minstd_rand jitter(static_cast<unsigned>(::getpid()) ^
                            static_cast<unsigned>(start.time_since_epoch().count()));
    Ms backoff(20);
    for (;;) {
      for (const auto& [addr, len] : where) {
        Socket s(::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (s.get() < 0) {
          last = std::strerror(errno);
          continue;
        }
        if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
          if (errno != EINPROGRESS) {
            last = std::strerror(errno);
            continue;
          }
          try {
            tcp::wait_fd(s.get(), POLLOUT, deadline, nullptr);
          } catch (const IoTimeout&) {
            // An attempt the deadline cut short says less than the error before it.
            if (last == "no address") last = "connection timed out";
            continue;
          }
          int err = 0;
          socklen_t elen = sizeof(err);
          ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &elen);
          if (err != 0) {
            last = std::strerror(err);
            continue;
          }
        }
        const int one = 1;
        ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        std::string secret;
        const Handshake h =
            tcp::client_handshake(s.get(), deadline, options_, uri(), refusal, secret);
        if (h == Handshake::ok) {
          local_ = socket_local_address(s.get());
          socket_ = std::move(s);
          return secret;
        }
        if (h == Handshake::timed_out && refusal.empty())
          throw TimeoutError("tcp store " + uri() + ": no handshake within the timeout of " +
                             std::to_string(options_.timeout.count()) + " ms");
        if (h == Handshake::dropped)
          last =
              "the server closed the connection before the handshake ended (it may be "
              "overloaded)";
        break;  // refused, dropped, or out of time after a refusal: back off or say so
      }
      auto now = Clock::now();
      if (now < deadline) {
        const Ms pause = backoff + Ms(jitter() % static_cast<unsigned>(backoff.count() + 1));
        std::this_thread::sleep_for(
            std::min<Ms>(pause, std::chrono::duration_cast<Ms>(deadline - now)));
        backoff = std::min<Ms>(backoff * 2, Ms(500));
        now = Clock::now();
      }
      if (now >= deadline) {
        const Ms tried = std::chrono::duration_cast<Ms>(now - start);
        if (!refusal.empty())
          throw BackendError("store at " + host_ + ":" + std::to_string(port_) + " refused: " +
                             refusal + " (this rank retried for " + seconds_text(tried) + ")");
        throw TimeoutError(
            "tcp store " + uri() + ": no server answered within " +
            std::to_string(options_.timeout.count()) +
            " ms (rank 0 serves it, or commgrid launch with --spares: it has not started, has ended, or "
            "MASTER_ADDR:MASTER_PORT names another host or port; last error: " +
            last + ")");
      }
    }
  }

  // One request and its reply, within options_.timeout (plus `wait` for a parked wait).
  // With `stop`, nullopt when it turned true first: the connection, now out of step, is
  // dropped and made again by the next request.
  std::optional<Message> request(const Message& m, Ms wait, const std::atomic<bool>* stop) {
    if (!fenced_.empty()) throw FencedError(fenced_);
    if (socket_.get() < 0) {
      // Said with the failure that dropped the connection: the caller that saw it first
      // may have gone on without it (as Gloo does, naming a peer).
      if (!reconnect_)
        throw BackendError("tcp store " + uri() + ": not connected" +
                           (lost_.empty() ? "" : " since an earlier request failed: " + lost_));
      reconnect_ = false;
      (void)connect();
      if (!options_.process.empty() && m.type != 'I') identify();
    }
    const auto deadline = Clock::now() + options_.timeout;
    try {
      tcp::send_message(socket_.get(), m, deadline);
      Message r = tcp::recv_message(socket_.get(), deadline + wait, tcp::kMaxFrame, stop);
      if (r.type == 'Z') {
        socket_ = Socket();
        // Kept: every later request says it again (a caller may have wrapped the first).
        fenced_ = "tcp store " + uri() + ": " +
                  (r.fields.empty() ? std::string("this process is fenced")
                                    : quote_untrusted(r.fields[0], kShownReply));
        throw FencedError(fenced_);
      }
      return r;
    } catch (const IoTimeout&) {
      socket_ = Socket();
      lost_ = "no reply within " + std::to_string(options_.timeout.count()) + " ms";
      throw TimeoutError("tcp store " + uri() + ": " + lost_);
    } catch (const IoError& e) {
      socket_ = Socket();
      if (stop != nullptr && stop->load()) {
        reconnect_ = true;
        return std::nullopt;
      }
      lost_ = std::string(e.what()) +
              " (the process serving it ended or failed: rank 0, or commgrid launch with --spares)";
      throw BackendError("tcp store " + uri() + ": " + lost_);
    }
  }
  Message request(const Message& m) { return *request(m, Ms(0), nullptr); }

  std::string host_;
  int port_;
  StoreOptions options_;
  std::unique_ptr<TcpStoreServer> server_;
  Socket socket_;
  bool reconnect_ = false;
  std::string fenced_;  // the server's refusal, once it fenced this process
  std::string lost_;    // why the connection was dropped, said again by each later request
  std::string local_ = "127.0.0.1";
};

}  // namespace

std::shared_ptr<Store> make_tcp_store(const std::string& host, int port,
                                      const StoreOptions& options) {
  if (host.empty()) throw ConfigError("store", "tcp store: empty host name");
  auto store = std::make_shared<TcpStore>(host, port, options);
  join_as_rank(*store, options);
  return store;
}

}  // namespace commgrid::bootstrap
