// The tcp:// store. POSIX sockets with poll(): every read and write has a deadline, so a
// silent or hostile peer costs at most the store's timeout; frames are length-prefixed and
// bounded. Each connection proves the job's token (HMAC-SHA256 over a fresh challenge, both
// ways) before any request.
#include "tcp_store.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace commgrid::bootstrap {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

// A frame carries one message: type byte, then length-prefixed fields.
constexpr size_t kMaxFrame = 64 + kTcpStoreMaxKey + kTcpStoreMaxValue;
// Bounds on what one server holds, so that a client of the job cannot exhaust its memory.
constexpr size_t kMaxStoreBytes = size_t{256} << 20;
constexpr size_t kMaxConnections = 4096;

class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class IoTimeout : public IoError {
 public:
  using IoError::IoError;
};

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1)
    throw BackendError("tcp store: OpenSSL RAND_bytes failed");
  return out;
}

bool same_secret(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<Ms>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 200));
}

// Waits for `events` on fd until the deadline or `stop`; throws IoTimeout at the deadline.
void wait_fd(int fd, short events, Clock::time_point deadline, const std::atomic<bool>* stop) {
  for (;;) {
    if (stop != nullptr && stop->load()) throw IoError("store closed");
    if (Clock::now() >= deadline) throw IoTimeout("timed out");
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r < 0 && errno != EINTR) throw IoError(std::strerror(errno));
    if (r > 0) return;
  }
}

void send_all(int fd, const std::string& data, Clock::time_point deadline,
              const std::atomic<bool>* stop = nullptr) {
  size_t done = 0;
  while (done < data.size()) {
    wait_fd(fd, POLLOUT, deadline, stop);
    // MSG_NOSIGNAL: a closed peer is an error here, never SIGPIPE.
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) throw IoError(std::string("send: ") + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

std::string recv_exact(int fd, size_t size, Clock::time_point deadline,
                       const std::atomic<bool>* stop = nullptr) {
  std::string out(size, '\0');
  size_t done = 0;
  while (done < size) {
    wait_fd(fd, POLLIN, deadline, stop);
    const ssize_t n = ::recv(fd, out.data() + done, size - done, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n == 0) throw IoError("connection closed");
    if (n < 0) throw IoError(std::string("recv: ") + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  return out;
}

void put_u32(std::string& out, uint32_t v) {
  const uint32_t be = htonl(v);
  out.append(reinterpret_cast<const char*>(&be), 4);
}

uint32_t get_u32(std::string_view in) {
  uint32_t be = 0;
  std::memcpy(&be, in.data(), 4);
  return ntohl(be);
}

// A message: one type byte and string fields.
struct Message {
  char type = 0;
  std::vector<std::string> fields;
};

void send_message(int fd, const Message& m, Clock::time_point deadline,
                  const std::atomic<bool>* stop = nullptr) {
  std::string body(1, m.type);
  for (const auto& f : m.fields) {
    put_u32(body, static_cast<uint32_t>(f.size()));
    body += f;
  }
  std::string frame;
  put_u32(frame, static_cast<uint32_t>(body.size()));
  send_all(fd, frame + body, deadline, stop);
}

Message recv_message(int fd, Clock::time_point deadline, const std::atomic<bool>* stop = nullptr) {
  const uint32_t size = get_u32(recv_exact(fd, 4, deadline, stop));
  if (size == 0 || size > kMaxFrame)
    throw IoError("malformed frame of " + std::to_string(size) + " bytes");
  const std::string body = recv_exact(fd, size, deadline, stop);
  Message m;
  m.type = body[0];
  std::string_view rest(body);
  rest.remove_prefix(1);
  while (!rest.empty()) {
    if (rest.size() < 4) throw IoError("malformed frame");
    const uint32_t n = get_u32(rest);
    rest.remove_prefix(4);
    if (n > rest.size()) throw IoError("malformed frame");
    m.fields.emplace_back(rest.substr(0, n));
    rest.remove_prefix(n);
  }
  return m;
}

std::string client_context(const std::string& job, const std::string& nonce) {
  return "commgrid tcp store client\n" + job + "\n" + nonce;
}
std::string server_context(const std::string& job, const std::string& nonce) {
  return "commgrid tcp store server\n" + job + "\n" + nonce;
}

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] int get() const { return fd_; }

 private:
  int fd_;
};

std::string numeric_host(const sockaddr* a, socklen_t len) {
  char host[NI_MAXHOST];
  if (getnameinfo(a, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return host;
}

struct Resolved {
  std::vector<std::pair<sockaddr_storage, socklen_t>> addresses;
};

Resolved resolve(const std::string& where, const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0)
    throw BackendError("tcp store " + where + ": cannot resolve host '" + host +
                       "': " + gai_strerror(rc));
  Resolved out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    sockaddr_storage s{};
    std::memcpy(&s, a->ai_addr, a->ai_addrlen);
    out.addresses.emplace_back(s, a->ai_addrlen);
  }
  freeaddrinfo(found);
  return out;
}

// ---- the server ------------------------------------------------------------------------

class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& where, const std::string& host, int port,
                 StoreOptions options)
      : where_(where), options_(std::move(options)) {
    // Bound to MASTER_ADDR's own address: the job's interface, not every interface.
    std::string last = "no address";
    for (auto& [addr, len] : resolve(where, host, port, false).addresses) {
      Socket s(::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (s.get() < 0) {
        last = std::strerror(errno);
        continue;
      }
      if (::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
        const int e = errno;
        if (e == EADDRINUSE)
          throw JobConflictError("tcp store " + where + ": port " + std::to_string(port) +
                                 " is in use (another job, or another program, listens there): "
                                 "give each job its own MASTER_PORT");
        last = std::strerror(e);
        continue;
      }
      if (::listen(s.get(), 1024) != 0) {
        last = std::strerror(errno);
        continue;
      }
      address_ = numeric_host(reinterpret_cast<sockaddr*>(&addr), len);
      listener_ = std::move(s);
      break;
    }
    if (listener_.get() < 0)
      throw BackendError("tcp store " + where + ": cannot listen: " + last);
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  ~TcpStoreServer() {
    stop_.store(true);
    accept_thread_.join();
    std::list<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

  [[nodiscard]] const std::string& address() const { return address_; }

  // The server's own process uses the map directly.
  bool set(const std::string& key, const std::string& value) {
    std::lock_guard lock(mutex_);
    if (map_.count(key) != 0) return false;
    if (bytes_ + key.size() + value.size() > kMaxStoreBytes)
      throw BackendError("tcp store " + where_ + ": full (" + std::to_string(kMaxStoreBytes) +
                         " bytes)");
    bytes_ += key.size() + value.size();
    map_.emplace(key, value);
    return true;
  }
  std::optional<std::string> get(const std::string& key) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }

 private:
  void accept_loop() {
    while (!stop_.load()) {
      pollfd p{listener_.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      Socket c(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (c.get() < 0) continue;
      std::lock_guard lock(mutex_);
      if (connections_ >= kMaxConnections) continue;  // closed: bounded resources
      ++connections_;
      threads_.emplace_back([this, s = std::move(c)]() mutable {
        serve(std::move(s));
        std::lock_guard l(mutex_);
        --connections_;
      });
    }
  }

  void serve(Socket s) {
    const int fd = s.get();
    try {
      // The handshake is bounded by the store's timeout; a stranger that says nothing is
      // dropped then.
      const auto deadline = Clock::now() + options_.timeout;
      const std::string nonce = random_bytes(32);
      send_message(fd, {'H', {options_.job_id, nonce}}, deadline, &stop_);
      Message a = recv_message(fd, deadline, &stop_);
      if (a.type != 'A' || a.fields.size() != 2 || a.fields[1].size() != 32) return;
      if (!same_secret(a.fields[0],
                       token_proof(options_.token, client_context(options_.job_id, nonce)))) {
        send_message(fd, {'R', {"unauthenticated: the job's token was not proven"}}, deadline,
                     &stop_);
        return;
      }
      send_message(fd,
                   {'O', {token_proof(options_.token, server_context(options_.job_id, a.fields[1]))}},
                   deadline, &stop_);
      // Requests: a client of the job may be idle for long (between group creations).
      for (;;) {
        Message m = recv_message(fd, Clock::now() + std::chrono::hours(24 * 365), &stop_);
        const auto reply_by = Clock::now() + options_.timeout;
        if (m.fields.empty() || m.fields[0].size() > kTcpStoreMaxKey) return;
        if (m.type == 'S' && m.fields.size() == 2) {
          if (m.fields[1].size() > kTcpStoreMaxValue) return;
          std::string error;
          bool ok = false;
          try {
            ok = set(m.fields[0], m.fields[1]);
            if (!ok) error = "key '" + m.fields[0] + "' is already set";
          } catch (const Error& e) {
            error = e.what();
          }
          send_message(fd, ok ? Message{'K', {""}} : Message{'E', {error}}, reply_by, &stop_);
        } else if (m.type == 'G') {
          auto v = get(m.fields[0]);
          send_message(fd, v ? Message{'V', {*v}} : Message{'N', {""}}, reply_by, &stop_);
        } else if (m.type == 'C') {
          send_message(fd, {get(m.fields[0]) ? 'Y' : 'N', {""}}, reply_by, &stop_);
        } else {
          return;
        }
      }
    } catch (const std::exception&) {
      // A closed, silent or malformed connection ends only itself.
    }
  }

  std::string where_;
  StoreOptions options_;
  Socket listener_;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::map<std::string, std::string> map_;
  size_t bytes_ = 0;
  size_t connections_ = 0;
  std::list<std::thread> threads_;
  std::thread accept_thread_;
};

// ---- the store ---------------------------------------------------------------------------

class TcpStore final : public Store {
 public:
  TcpStore(std::string host, int port, StoreOptions options)
      : host_(std::move(host)), port_(port), options_(std::move(options)) {
    if (options_.serve) {
      server_ = std::make_unique<TcpStoreServer>(uri(), host_, port_, options_);
      local_ = server_->address();
      return;
    }
    connect();
  }

  std::string uri() const override { return "tcp://" + host_ + ":" + std::to_string(port_); }
  std::string local_address() const override { return local_; }

 protected:
  void do_set(const std::string& key, const std::vector<char>& value) override {
    check_sizes(key, value.size());
    if (server_) {
      if (!server_->set(key, std::string(value.begin(), value.end())))
        throw BackendError("tcp store " + uri() + ": key '" + key + "' is already set");
      return;
    }
    Message r = request({'S', {key, std::string(value.begin(), value.end())}});
    if (r.type == 'E' && !r.fields.empty())
      throw BackendError("tcp store " + uri() + ": " + r.fields[0]);
    if (r.type != 'K') throw BackendError("tcp store " + uri() + ": unexpected reply to set");
  }
  std::vector<char> do_get(const std::string& key) override {
    check_sizes(key, 0);
    std::optional<std::string> v;
    if (server_) {
      v = server_->get(key);
    } else {
      Message r = request({'G', {key}});
      if (r.type == 'V' && r.fields.size() == 1) v = r.fields[0];
      else if (r.type != 'N') throw BackendError("tcp store " + uri() + ": unexpected reply to get");
    }
    if (!v) throw BackendError("tcp store " + uri() + ": key '" + key + "' is not set");
    return {v->begin(), v->end()};
  }
  bool do_has(const std::string& key) override {
    check_sizes(key, 0);
    if (server_) return server_->get(key).has_value();
    Message r = request({'C', {key}});
    if (r.type != 'Y' && r.type != 'N')
      throw BackendError("tcp store " + uri() + ": unexpected reply to check");
    return r.type == 'Y';
  }

 private:
  void check_sizes(const std::string& key, size_t value) const {
    if (key.size() > kTcpStoreMaxKey || value > kTcpStoreMaxValue)
      throw BackendError("tcp store " + uri() + ": key of " + std::to_string(key.size()) +
                         " bytes or value of " + std::to_string(value) +
                         " bytes exceeds the limits (" + std::to_string(kTcpStoreMaxKey) +
                         ", " + std::to_string(kTcpStoreMaxValue) + ")");
  }

  // Connects, retrying while the server (rank 0) is not listening yet, then proves the token
  // and checks the server's proof; all within options_.timeout.
  void connect() {
    const auto deadline = Clock::now() + options_.timeout;
    const Resolved where = resolve(uri(), host_, port_, false);
    std::string last = "no address";
    for (;;) {
      for (const auto& [addr, len] : where.addresses) {
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
            wait_fd(s.get(), POLLOUT, deadline, nullptr);
          } catch (const IoTimeout&) {
            last = "connection timed out";
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
        handshake(s.get(), deadline);
        local_ = socket_local_address(s.get());
        socket_ = std::move(s);
        return;
      }
      if (Clock::now() >= deadline)
        throw TimeoutError("tcp store " + uri() + ": no server answered within " +
                           std::to_string(options_.timeout.count()) +
                           " ms (rank 0 serves it; last error: " + last + ")");
      std::this_thread::sleep_for(Ms(50));
    }
  }

  void handshake(int fd, Clock::time_point deadline) {
    try {
      Message h = recv_message(fd, deadline);
      if (h.type != 'H' || h.fields.size() != 2 || h.fields[1].size() != 32)
        throw AuthenticationError("tcp store " + uri() +
                                  ": the server does not speak commgrid's store protocol");
      if (h.fields[0] != options_.job_id)
        throw JobConflictError("tcp store " + uri() + " serves job '" + h.fields[0] +
                               "' (this is job '" + options_.job_id +
                               "'): give each job its own MASTER_PORT");
      const std::string nonce = random_bytes(32);
      send_message(fd,
                   {'A', {token_proof(options_.token, client_context(options_.job_id, h.fields[1])),
                          nonce}},
                   deadline);
      Message o = recv_message(fd, deadline);
      if (o.type == 'R')
        throw AuthenticationError("tcp store " + uri() + " refused this rank: it serves job '" +
                                  options_.job_id +
                                  "' with another token (COMMGRID_TOKEN differs)");
      if (o.type != 'O' || o.fields.size() != 1 ||
          !same_secret(o.fields[0],
                       token_proof(options_.token, server_context(options_.job_id, nonce))))
        throw AuthenticationError("tcp store " + uri() +
                                  ": the server did not prove the job's token");
    } catch (const IoTimeout&) {
      throw TimeoutError("tcp store " + uri() + ": no handshake within the timeout");
    } catch (const IoError& e) {
      throw BackendError("tcp store " + uri() + ": handshake failed: " + e.what());
    }
  }

  Message request(const Message& m) {
    if (socket_.get() < 0) throw BackendError("tcp store " + uri() + ": not connected");
    const auto deadline = Clock::now() + options_.timeout;
    try {
      send_message(socket_.get(), m, deadline);
      return recv_message(socket_.get(), deadline);
    } catch (const IoTimeout&) {
      throw TimeoutError("tcp store " + uri() + ": no reply within " +
                         std::to_string(options_.timeout.count()) + " ms");
    } catch (const IoError& e) {
      socket_ = Socket();
      throw BackendError("tcp store " + uri() + ": " + e.what() +
                         " (the serving rank 0 ended or failed)");
    }
  }

  std::string host_;
  int port_;
  StoreOptions options_;
  std::unique_ptr<TcpStoreServer> server_;
  Socket socket_;
  std::string local_ = "127.0.0.1";
};

}  // namespace

std::string socket_local_address(int fd) {
  sockaddr_storage s{};
  socklen_t len = sizeof(s);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0) return "127.0.0.1";
  std::string h = numeric_host(reinterpret_cast<sockaddr*>(&s), len);
  return h.empty() ? "127.0.0.1" : h;
}

std::shared_ptr<Store> make_tcp_store(const std::string& host, int port,
                                      const StoreOptions& options) {
  if (host.empty()) throw ConfigError("store", "tcp store: empty host name");
  return std::make_shared<TcpStore>(host, port, options);
}

}  // namespace commgrid::bootstrap
