// The tcp:// store. Rank 0 serves it from one event-loop thread (epoll): no thread per
// connection, whatever the number of ranks. The other ranks connect with a blocking client
// whose every read and write has a deadline. Frames are length-prefixed and bounded; each
// connection proves the job's token (HMAC-SHA256 over a fresh challenge, both ways) before
// any request.
//
// What a stranger can cost the server: before its proof a connection owns a fixed 256-byte
// buffer (nothing is allocated from a length it announces), must prove within a few seconds,
// and is the first closed when connections run short; a connection that closes at once
// costs nothing that stays. The limits a rank can meet (connections, descriptors, bytes) are
// named in the refusal it is sent.
#include "tcp_store.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <utility>

namespace commgrid::bootstrap {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

// A frame carries one message: type byte, then length-prefixed fields.
constexpr size_t kMaxFrame = 64 + kTcpStoreMaxKey + kTcpStoreMaxValue;
// Before its proof a connection may send one frame of at most this (the proof is 109 bytes).
constexpr size_t kPreAuthBuffer = 256;
// A client reads the server's greeting and proof, frames it has not yet trusted, up to this.
constexpr size_t kMaxHandshakeFrame = 4096;
// Connections that have not proven the token yet, at most: beyond, the oldest is closed.
constexpr size_t kMaxPending = 4096;
// A genuine rank proves within a round trip of the greeting; a loaded machine may take
// seconds to schedule it.
constexpr Ms kHandshakeDeadline = std::chrono::seconds(10);
// A wait is answered at the latest after this, with the keys still missing.
constexpr Ms kMaxWaitSlice = std::chrono::seconds(10);
// Replies queued for a connection before the server stops reading its requests.
constexpr size_t kMaxQueued = 256;

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

bool same_secret(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

void put_u32(std::string& out, uint32_t v) {
  const uint32_t be = htonl(v);
  out.append(reinterpret_cast<const char*>(&be), 4);
}

uint32_t get_u32(const char* in) {
  uint32_t be = 0;
  std::memcpy(&be, in, 4);
  return ntohl(be);
}

// A message: one type byte and string fields.
struct Message {
  char type = 0;
  std::vector<std::string> fields;
};

std::string encode(const Message& m) {
  size_t size = 1;
  for (const auto& f : m.fields) size += 4 + f.size();
  std::string out;
  out.reserve(4 + size);
  put_u32(out, static_cast<uint32_t>(size));
  out += m.type;
  for (const auto& f : m.fields) {
    put_u32(out, static_cast<uint32_t>(f.size()));
    out += f;
  }
  return out;
}

// A frame's body (after its length) as a message; nullopt when malformed.
std::optional<Message> decode(std::string_view body) {
  if (body.empty()) return std::nullopt;
  Message m;
  m.type = body[0];
  body.remove_prefix(1);
  while (!body.empty()) {
    if (body.size() < 4) return std::nullopt;
    const uint32_t n = get_u32(body.data());
    body.remove_prefix(4);
    if (n > body.size()) return std::nullopt;
    m.fields.emplace_back(body.substr(0, n));
    body.remove_prefix(n);
  }
  return m;
}

std::string client_context(const std::string& job, const std::string& nonce) {
  return "commgrid tcp store client\n" + job + "\n" + nonce;
}
std::string server_context(const std::string& job, const std::string& nonce) {
  return "commgrid tcp store server\n" + job + "\n" + nonce;
}

// Text from the other end, as it may be shown: printable, bounded.
std::string printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 300)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

std::string seconds_text(Ms d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// ---- the client's blocking I/O, every call bounded by a deadline ------------------------

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<Ms>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 200));
}

// Waits for `events` on fd until the deadline or `stop`; throws IoTimeout at the deadline.
void wait_fd(int fd, short events, Clock::time_point deadline, const std::atomic<bool>* stop) {
  for (;;) {
    if (stop != nullptr && stop->load()) throw IoError("aborted");
    if (Clock::now() >= deadline) throw IoTimeout("timed out");
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r < 0 && errno != EINTR) throw IoError(std::strerror(errno));
    if (r > 0) return;
  }
}

void send_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    wait_fd(fd, POLLOUT, deadline, nullptr);
    // MSG_NOSIGNAL: a closed peer is an error here, never SIGPIPE.
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) throw IoError(std::string("send: ") + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

void recv_exact(int fd, char* out, size_t size, Clock::time_point deadline,
                const std::atomic<bool>* stop) {
  size_t done = 0;
  while (done < size) {
    wait_fd(fd, POLLIN, deadline, stop);
    const ssize_t n = ::recv(fd, out + done, size - done, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n == 0) throw IoError("connection closed");
    if (n < 0) throw IoError(std::string("recv: ") + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

void send_message(int fd, const Message& m, Clock::time_point deadline) {
  send_all(fd, encode(m), deadline);
}

Message recv_message(int fd, Clock::time_point deadline, size_t max,
                     const std::atomic<bool>* stop = nullptr) {
  char head[4];
  recv_exact(fd, head, 4, deadline, stop);
  const uint32_t size = get_u32(head);
  if (size == 0 || size > max)
    throw IoError("malformed frame of " + std::to_string(size) + " bytes");
  std::string body(size, '\0');
  recv_exact(fd, body.data(), size, deadline, stop);
  auto m = decode(body);
  if (!m) throw IoError("malformed frame");
  return std::move(*m);
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

Resolved resolve(const std::string& where, const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
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

// ---- the server's limits -------------------------------------------------------------------

// A limit and where it came from, as a refused rank is told.
struct Limit {
  size_t value = 0;
  std::string source;
};

std::optional<size_t> size_from_env(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  const std::string_view t(text);
  size_t v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size() || v == 0)
    throw InvalidValueError(
        name, std::string(name) + "='" + printable(t) + "' is not a positive whole number");
  return v;
}

Limit connection_limit(const StoreOptions& o) {
  if (o.max_connections > 0) return {o.max_connections, "StoreOptions::max_connections"};
  if (auto v = size_from_env("COMMGRID_STORE_MAX_CONNECTIONS"))
    return {*v, "COMMGRID_STORE_MAX_CONNECTIONS=" + std::to_string(*v)};
  return {SIZE_MAX, ""};  // the descriptor limit alone
}

Limit byte_limit(const StoreOptions& o) {
  if (o.max_bytes > 0) return {o.max_bytes, "StoreOptions::max_bytes"};
  if (auto v = size_from_env("COMMGRID_STORE_MAX_BYTES"))
    return {*v, "COMMGRID_STORE_MAX_BYTES=" + std::to_string(*v)};
  constexpr size_t kCeiling = size_t{16} << 30;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const size_t quarter =
      pages > 0 && page > 0 ? static_cast<size_t>(pages) / 4 * static_cast<size_t>(page) : kCeiling;
  return {std::min(kCeiling, quarter),
          "the default, a quarter of this machine's memory and at most 16 GiB "
          "(COMMGRID_STORE_MAX_BYTES sets it)"};
}

// The connections this process may hold: the configured limit, or fewer when its descriptor
// limit is lower (less a reserve for its other uses: Gloo's pairs, files, the reserve
// descriptor below). Read at each connection: a program may raise its limit meanwhile.
Limit connection_cap(const Limit& configured) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return configured;
  const size_t soft = static_cast<size_t>(rl.rlim_cur);
  const size_t reserve = std::clamp<size_t>(soft / 8, 16, 256);
  const size_t fd_cap = soft > reserve ? soft - reserve : 1;
  if (configured.value <= fd_cap) return configured;
  return {fd_cap, "the serving process's descriptor limit (ulimit -n " + std::to_string(soft) +
                      ", of which " + std::to_string(reserve) +
                      " are kept for its other uses): raise it on rank 0's machine"};
}

size_t open_descriptor_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  return static_cast<size_t>(rl.rlim_cur);
}

// ---- the server ------------------------------------------------------------------------

class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port, const StoreOptions& options)
      : where_(host + ":" + std::to_string(port)), options_(options),
        secret_(options.token.empty() ? random_hex(32) : ""),
        connections_(connection_limit(options)), bytes_limit_(byte_limit(options)) {
    listen_on(host, port);
    epoll_ = Socket(::epoll_create1(EPOLL_CLOEXEC));
    wake_ = Socket(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (epoll_.get() < 0 || wake_.get() < 0)
      throw BackendError("tcp store " + where_ +
                         ": cannot start its event loop: " + std::strerror(errno));
    watch(listener_.get(), kListenerId, EPOLLIN);
    watch(wake_.get(), kWakeId, EPOLLIN);
    reserve_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    loop_ = std::thread([this] { loop(); });
  }

  ~TcpStoreServer() {
    stop_.store(true);
    signal_loop();
    loop_.join();
    if (reserve_ >= 0) ::close(reserve_);
  }
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  [[nodiscard]] const std::string& address() const { return address_; }
  [[nodiscard]] const std::string& secret() const { return secret_; }

  // The serving process uses the map directly.
  enum class SetResult { ok, exists, full };
  SetResult set(const std::string& key, std::string_view value, std::string* why) {
    const SetResult r = insert(key, value, why);
    if (r == SetResult::ok) {
      {
        std::lock_guard lock(mutex_);
        woken_.push_back(key);
      }
      signal_loop();
    }
    return r;
  }
  std::optional<std::string> get(const std::string& key) const {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  bool has(const std::string& key) const {
    std::lock_guard lock(mutex_);
    return map_.count(key) != 0;
  }
  // Fences a process (resilience): every later request of a connection that identified as it
  // is refused with `message` and the connection closed, and it cannot identify again.
  void fence(const std::string& process, const std::string& message) {
    std::lock_guard lock(mutex_);
    fenced_.emplace(process, message);
  }
  std::optional<std::string> fenced(const std::string& process) const {
    std::lock_guard lock(mutex_);
    auto it = fenced_.find(process);
    if (it == fenced_.end()) return std::nullopt;
    return it->second;
  }
  // Waits at most `slice` (and at most 100 ms: the caller then sees abort()) for the keys.
  std::vector<std::string> wait(std::vector<std::string> keys, Ms slice) {
    std::unique_lock lock(mutex_);
    const auto until = Clock::now() + std::min(slice, Ms(100));
    auto done = [&] {
      std::erase_if(keys, [&](const std::string& k) { return map_.count(k) != 0; });
      return keys.empty();
    };
    cv_.wait_until(lock, until, done);
    return keys;
  }

 private:
  static constexpr uint64_t kListenerId = 0, kWakeId = 1;

  // Bytes to send: a header this server built, then (for a value) a view of the value in
  // the map, which is never changed or removed while the server lives.
  struct Segment {
    std::string head;
    std::string_view body;
  };

  struct Conn {
    uint64_t id = 0;
    Socket socket;
    uint32_t events = 0;  // as registered with epoll
    bool authed = false, closing = false, dead = false;
    std::string process;  // the identity it gave ('I'), for fencing; empty: none
    std::string nonce;    // the challenge sent in the greeting
    // Before the proof: the fixed buffer. After: requests as they arrive.
    std::array<char, kPreAuthBuffer> small{};
    size_t small_len = 0;
    std::string in;
    size_t in_off = 0;
    std::deque<Segment> out;
    size_t out_off = 0;  // bytes of out.front() already sent
    std::list<uint64_t>::iterator pending_it;
    bool has_timer = false;
    std::multimap<Clock::time_point, uint64_t>::iterator timer;
    // A wait parked at the server: the keys, the first not yet seen, where it is listed.
    bool parked = false;
    std::vector<std::string> wait_keys;
    size_t wait_next = 0;
    Clock::time_point wait_until;
    bool listed = false;
    std::list<uint64_t>::iterator wait_it;
  };

  void listen_on(const std::string& host, int port) {
    // Bound to MASTER_ADDR's own address: the job's interface, not every interface.
    std::string last = "no address";
    for (auto& [addr, len] : resolve(where_, host, port).addresses) {
      Socket s(::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (s.get() < 0) {
        last = std::strerror(errno);
        continue;
      }
      if (::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
        const int e = errno;
        if (e == EADDRINUSE)
          throw JobConflictError("tcp store " + where_ + ": port " + std::to_string(port) +
                                 " is in use (another job, or another program, listens there): "
                                 "give each job its own MASTER_PORT");
        last = std::strerror(e);
        continue;
      }
      // The kernel caps the backlog at net.core.somaxconn.
      if (::listen(s.get(), 65535) != 0) {
        last = std::strerror(errno);
        continue;
      }
      address_ = numeric_host(reinterpret_cast<sockaddr*>(&addr), len);
      listener_ = std::move(s);
      return;
    }
    throw BackendError("tcp store " + where_ + ": cannot listen: " + last);
  }

  void watch(int fd, uint64_t id, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
      throw BackendError("tcp store " + where_ + ": epoll: " + std::strerror(errno));
  }

  void signal_loop() {
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }

  SetResult insert(const std::string& key, std::string_view value, std::string* why) {
    const size_t cost = kTcpStoreKeyOverhead + key.size() + value.size();
    {
      std::lock_guard lock(mutex_);
      if (map_.count(key) != 0) return SetResult::exists;
      if (bytes_ + cost > bytes_limit_.value) {
        if (why != nullptr)
          *why = "store at " + where_ + " refused to set key '" + printable(key) + "' (" +
                 std::to_string(cost) + " bytes with its bookkeeping): it holds " +
                 std::to_string(bytes_) + " bytes in " + std::to_string(map_.size()) +
                 " keys, and its limit is " + std::to_string(bytes_limit_.value) +
                 " bytes, set by " + bytes_limit_.source;
        return SetResult::full;
      }
      bytes_ += cost;
      map_.emplace(key, value);
    }
    cv_.notify_all();
    return SetResult::ok;
  }

  // -- the loop ---------------------------------------------------------------------------

  void loop() {
    std::array<epoll_event, 256> events{};
    while (!stop_.load()) {
      int timeout = 1000;
      if (!timers_.empty())
        timeout = static_cast<int>(std::clamp<long long>(
            std::chrono::ceil<Ms>(timers_.begin()->first - Clock::now()).count(), 0, 1000));
      if (accept_paused_) timeout = std::min(timeout, 100);
      const int n =
          ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), timeout);
      if (n < 0 && errno != EINTR) {
        std::this_thread::sleep_for(Ms(10));  // cannot happen with valid descriptors; never spin
        continue;
      }
      for (int i = 0; i < n; ++i) {
        const uint64_t id = events[static_cast<size_t>(i)].data.u64;
        try {
          if (id == kListenerId) on_listener();
          else if (id == kWakeId) on_wake();
          else on_conn(id, events[static_cast<size_t>(i)].events);
        } catch (const std::exception&) {
          // Out of memory or randomness for one connection: it alone ends.
          if (id > kWakeId)
            if (Conn* c = find(id)) kill(*c);
        }
        sweep();
        resume_serving();
      }
      fire_timers();
      sweep();
      resume_serving();
      if (accept_paused_ && Clock::now() >= accept_resume_) resume_accepting();
    }
    conns_.clear();  // closes every connection
  }

  Conn* find(uint64_t id) {
    auto it = conns_.find(id);
    return it == conns_.end() ? nullptr : it->second.get();
  }

  void kill(Conn& c) {
    if (c.dead) return;
    c.dead = true;
    dead_.push_back(c.id);
  }

  // Closes the connections marked dead (never while one of their calls is on the stack).
  void sweep() {
    for (uint64_t id : dead_) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      Conn& c = *it->second;
      cancel_timer(c);
      unlist(c);
      if (!c.authed) pending_.erase(c.pending_it);
      conns_.erase(it);  // closes the socket, which leaves the epoll set
    }
    dead_.clear();
  }

  void set_timer(Conn& c, Clock::time_point when) {
    cancel_timer(c);
    c.timer = timers_.emplace(when, c.id);
    c.has_timer = true;
  }
  void cancel_timer(Conn& c) {
    if (!c.has_timer) return;
    timers_.erase(c.timer);
    c.has_timer = false;
  }

  void fire_timers() {
    const auto now = Clock::now();
    while (!timers_.empty() && timers_.begin()->first <= now) {
      const uint64_t id = timers_.begin()->second;
      timers_.erase(timers_.begin());
      Conn* c = find(id);
      if (c == nullptr || c->dead) continue;
      c->has_timer = false;
      if (!c->authed) {
        kill(*c);  // no proof within the handshake deadline
      } else if (c->parked) {
        std::vector<std::string> missing;
        {
          std::lock_guard lock(mutex_);
          for (size_t k = c->wait_next; k < c->wait_keys.size(); ++k)
            if (map_.count(c->wait_keys[k]) == 0) missing.push_back(c->wait_keys[k]);
        }
        finish_wait(*c, std::move(missing), true);
      }
    }
  }

  void on_wake() {
    uint64_t count = 0;
    (void)!::read(wake_.get(), &count, sizeof(count));
    std::vector<std::string> keys;
    {
      std::lock_guard lock(mutex_);
      keys.swap(woken_);
    }
    for (const auto& k : keys) wake_key(k);
  }

  // -- accepting ----------------------------------------------------------------------------

  void on_listener() {
    // A bounded batch, so that a flood of connections cannot starve the ranks' requests.
    for (int i = 0; i < 256; ++i) {
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        admit(Socket(fd));
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EMFILE || errno == ENFILE) {
        refuse_for_descriptors(errno);
        return;
      }
      pause_accepting();  // ENOBUFS, ENOMEM, ...: try again shortly, never spin
      return;
    }
  }

  // Out of descriptors: the listener stays readable, and a loop that only retried accept()
  // would spin. The reserve descriptor makes room to accept one waiting connection at a
  // time, tell it why and close it; when even that fails, accepting pauses for 100 ms.
  void refuse_for_descriptors(int err) {
    const std::string why =
        err == ENFILE
            ? std::string("the machine is out of file descriptors (ENFILE)")
            : "the serving process is out of file descriptors (" + std::to_string(conns_.size()) +
                  " connections in use, its limit ulimit -n is " +
                  std::to_string(open_descriptor_limit()) + "): raise it on rank 0's machine";
    for (int i = 0; i < 64; ++i) {
      if (reserve_ >= 0) {
        ::close(reserve_);
        reserve_ = -1;
      }
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      const int accept_errno = errno;
      if (fd >= 0) {
        refuse(fd, why);
        ::close(fd);
      }
      reserve_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        if (accept_errno != EAGAIN && accept_errno != EWOULDBLOCK) pause_accepting();
        return;
      }
      if (reserve_ < 0) {
        pause_accepting();
        return;
      }
    }
  }

  void pause_accepting() {
    epoll_event ev{};
    ev.data.u64 = kListenerId;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &ev);
    accept_paused_ = true;
    accept_resume_ = Clock::now() + Ms(100);
  }
  void resume_accepting() {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenerId;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &ev);
    accept_paused_ = false;
  }

  // Tells a connection why it is refused: one small frame, which a fresh socket's buffer
  // always holds; then it is closed.
  static void refuse(int fd, const std::string& why) {
    const std::string frame = encode({'R', {why}});
    (void)!::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  void admit(Socket s) {
    const Limit cap = connection_cap(connections_);
    if (conns_.size() >= cap.value) {
      if (pending_.empty()) {
        refuse(s.get(), std::to_string(conns_.size()) + " connections in use, the limit set by " +
                            cap.source);
        return;
      }
      evict_oldest_pending();
    } else if (pending_.size() >= kMaxPending) {
      evict_oldest_pending();
    }
    const int one = 1;
    ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto conn = std::make_unique<Conn>();
    Conn& c = *conn;
    c.id = next_id_++;
    c.socket = std::move(s);
    c.nonce = random_bytes(32);
    c.events = EPOLLIN | EPOLLRDHUP;
    epoll_event ev{};
    ev.events = c.events;
    ev.data.u64 = c.id;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, c.socket.get(), &ev) != 0) return;
    conns_.emplace(c.id, std::move(conn));
    c.pending_it = pending_.insert(pending_.end(), c.id);
    set_timer(c, Clock::now() +
                     std::min<Ms>(kHandshakeDeadline, std::max<Ms>(options_.timeout, Ms(1000))));
    queue(c, encode({'H', {options_.job_id, c.nonce}}));
    flush(c);
    update_events(c);
  }

  // Room for a new connection: the connection waiting longest for a proof goes (a genuine
  // rank proves within a round trip; a stranger that says nothing is what stays).
  void evict_oldest_pending() {
    if (pending_.empty()) return;
    Conn* c = find(pending_.front());
    if (c == nullptr) {
      pending_.pop_front();
      return;
    }
    kill(*c);
    sweep();
  }

  // -- one connection ----------------------------------------------------------------------

  void on_conn(uint64_t id, uint32_t events) {
    Conn* c = find(id);
    if (c == nullptr || c->dead) return;
    if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0) {
      if (c->authed && c->parked && (events & EPOLLIN) == 0) {
        kill(*c);  // the client went away while its wait was parked
        return;
      }
      if (!(c->authed ? read_requests(*c) : read_proof(*c))) {
        kill(*c);
        return;
      }
    }
    if (!c->dead) {
      flush(*c);
      // Requests held back while replies queued up: served now that they have gone.
      if (c->authed && !c->parked && c->in.size() > c->in_off && !serve_requests(*c)) kill(*c);
      if (!c->dead) flush(*c);
      update_events(*c);
    }
  }

  // Before the proof: at most the fixed buffer, one frame, which must be the proof.
  bool read_proof(Conn& c) {
    for (;;) {
      if (c.small_len == c.small.size()) break;
      const ssize_t n =
          ::recv(c.socket.get(), c.small.data() + c.small_len, c.small.size() - c.small_len, 0);
      if (n > 0) {
        c.small_len += static_cast<size_t>(n);
        continue;
      }
      if (n == 0) return false;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    if (c.closing) return true;  // refused already: its bytes are not read
    if (c.small_len < 4) return true;
    const uint32_t size = get_u32(c.small.data());
    if (size == 0 || size > c.small.size() - 4) return false;  // not a proof: nothing kept for it
    if (c.small_len < 4 + size) return true;
    const auto a = decode(std::string_view(c.small.data() + 4, size));
    if (!a || a->type != 'A' || a->fields.size() != 2 || a->fields[1].size() != 32) return false;
    if (!same_secret(a->fields[0],
                     token_proof(options_.token, client_context(options_.job_id, c.nonce)))) {
      queue(c, encode({'R', {"unauthenticated: the job's token was not proven"}}));
      c.closing = true;
      return true;
    }
    c.authed = true;
    cancel_timer(c);
    pending_.erase(c.pending_it);
    queue(c, encode({'O',
                     {token_proof(options_.token, server_context(options_.job_id, a->fields[1])),
                      secret_}}));
    c.in.assign(c.small.data() + 4 + size, c.small_len - 4 - size);
    return serve_requests(c);
  }

  // After the proof: bytes as they come (never more than the frame they belong to needs).
  bool read_requests(Conn& c) {
    size_t total = 0;
    while (total < (size_t{1} << 20) && c.in.size() - c.in_off < 4 + kMaxFrame) {
      const ssize_t n = ::recv(c.socket.get(), buffer_.data(), buffer_.size(), 0);
      if (n > 0) {
        c.in.append(buffer_.data(), static_cast<size_t>(n));
        total += static_cast<size_t>(n);
        continue;
      }
      if (n == 0) return false;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    return serve_requests(c);
  }

  // Serves the complete requests received, in order, until one is parked (a wait) or the
  // replies queue up. False: the connection broke the protocol.
  bool serve_requests(Conn& c) {
    while (!c.dead && !c.parked && c.out.size() < kMaxQueued) {
      const size_t avail = c.in.size() - c.in_off;
      if (avail < 4) break;
      const uint32_t size = get_u32(c.in.data() + c.in_off);
      if (size == 0 || size > kMaxFrame) return false;
      if (avail < 4 + size) break;
      auto m = decode(std::string_view(c.in).substr(c.in_off + 4, size));
      c.in_off += 4 + size;
      if (!m || !serve(c, std::move(*m))) return false;
    }
    if (c.in_off == c.in.size()) {
      c.in_off = 0;
      if (c.in.capacity() > (size_t{64} << 10)) std::string().swap(c.in);
      else c.in.clear();
    } else if (c.in_off > (size_t{64} << 10)) {
      c.in.erase(0, c.in_off);
      c.in_off = 0;
    }
    return true;
  }

  // A fenced process's request: refused with the fencing message, and the connection closed.
  bool refuse_fenced(Conn& c, const std::string& process) {
    std::optional<std::string> why = fenced(process);
    if (!why) return false;
    queue(c, encode({'Z', {*why}}));
    c.closing = true;
    c.in_off = c.in.size();  // what else it sent is not served
    return true;
  }

  bool serve(Conn& c, Message m) {
    if (!c.process.empty() && refuse_fenced(c, c.process)) return true;
    if (m.type == 'W') return park(c, std::move(m));
    if (m.fields.empty() || m.fields[0].size() > kTcpStoreMaxKey) return false;
    const std::string& key = m.fields[0];
    if (m.type == 'I' && m.fields.size() == 1) {  // identify as a process
      if (refuse_fenced(c, key)) return true;
      c.process = key;
      queue(c, encode({'K', {}}));
      return true;
    }
    if (m.type == 'P' && m.fields.size() == 2) {  // fence a process
      if (m.fields[1].size() > kTcpStoreMaxKey) return false;
      fence(key, m.fields[1]);
      queue(c, encode({'K', {}}));
      return true;
    }
    if ((m.type == 'S' || m.type == 'X') && m.fields.size() == 2) {
      if (m.fields[1].size() > kTcpStoreMaxValue) return false;
      std::string why;
      switch (insert(key, m.fields[1], &why)) {
        case SetResult::ok:
          queue(c, encode({'K', {}}));
          wake_key(key);
          break;
        case SetResult::exists:
          // 'X' (set if absent): the key existed, which is an answer, not an error.
          if (m.type == 'X') queue(c, encode({'F', {}}));
          else queue(c, encode({'E', {"key '" + printable(key) + "' is already set"}}));
          break;
        case SetResult::full: queue(c, encode({'E', {why}})); break;
      }
      return true;
    }
    if (m.type == 'G' && m.fields.size() == 1) {
      std::optional<std::string_view> value;
      {
        std::lock_guard lock(mutex_);
        if (auto it = map_.find(key); it != map_.end()) value = it->second;
      }
      if (!value) {
        queue(c, encode({'N', {}}));
        return true;
      }
      // The value is sent from the map, not copied: every rank may read the same one.
      std::string head;
      put_u32(head, static_cast<uint32_t>(1 + 4 + value->size()));
      head += 'V';
      put_u32(head, static_cast<uint32_t>(value->size()));
      c.out.push_back({std::move(head), *value});
      return true;
    }
    if (m.type == 'C' && m.fields.size() == 1) {
      bool present = false;
      {
        std::lock_guard lock(mutex_);
        present = map_.count(key) != 0;  // never copies the value
      }
      queue(c, encode({present ? 'Y' : 'N', {}}));
      return true;
    }
    return false;
  }

  // 'W' {slice in ms, keys...}: answered when every key is set, or after the slice with
  // those still missing.
  bool park(Conn& c, Message m) {
    if (m.fields.empty()) return false;
    long long slice = 0;
    const std::string& t = m.fields[0];
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), slice);
    if (ec != std::errc() || end != t.data() + t.size() || slice < 0) return false;
    for (size_t k = 1; k < m.fields.size(); ++k)
      if (m.fields[k].size() > kTcpStoreMaxKey) return false;
    c.wait_keys.assign(std::make_move_iterator(m.fields.begin() + 1),
                       std::make_move_iterator(m.fields.end()));
    c.wait_next = 0;
    c.wait_until = Clock::now() + std::min<Ms>(Ms(slice), kMaxWaitSlice);
    c.parked = true;
    advance_wait(c, false);
    return true;
  }

  // Skips the keys of a parked wait that are set; answers it when none is left, else lists
  // it under the first missing key (so that a set wakes one list, not every wait).
  // `resume`: see finish_wait.
  void advance_wait(Conn& c, bool resume) {
    {
      std::lock_guard lock(mutex_);
      while (c.wait_next < c.wait_keys.size() && map_.count(c.wait_keys[c.wait_next]) != 0)
        ++c.wait_next;
    }
    if (c.wait_next == c.wait_keys.size()) {
      finish_wait(c, {}, resume);
      return;
    }
    auto& list = waiters_[c.wait_keys[c.wait_next]];
    c.wait_it = list.insert(list.end(), c.id);
    c.listed = true;
    if (!c.has_timer) set_timer(c, c.wait_until);
  }

  void unlist(Conn& c) {
    if (!c.listed) return;
    c.listed = false;
    auto it = waiters_.find(c.wait_keys[c.wait_next]);
    if (it == waiters_.end()) return;
    it->second.erase(c.wait_it);
    if (it->second.empty()) waiters_.erase(it);
  }

  // Answers a parked wait. `resume`: the connection's later requests are served by the
  // loop (resume_serving) rather than here, on another connection's call or a timer's, so
  // that no chain of connections nests calls.
  void finish_wait(Conn& c, std::vector<std::string> missing, bool resume) {
    unlist(c);
    cancel_timer(c);
    c.parked = false;
    c.wait_keys.clear();
    queue(c, encode({'M', std::move(missing)}));
    if (resume) resume_.push_back(c.id);
  }

  void resume_serving() {
    while (!resume_.empty()) {
      std::vector<uint64_t> ids;
      ids.swap(resume_);
      for (uint64_t id : ids) {
        Conn* c = find(id);
        if (c == nullptr || c->dead) continue;
        if (!c->parked && !serve_requests(*c)) kill(*c);
        if (!c->dead) {
          flush(*c);
          update_events(*c);
        }
      }
      sweep();
    }
  }

  void wake_key(const std::string& key) {
    auto it = waiters_.find(key);
    if (it == waiters_.end()) return;
    std::list<uint64_t> ids;
    ids.swap(it->second);
    waiters_.erase(it);
    for (uint64_t id : ids) {
      Conn* c = find(id);
      if (c == nullptr || c->dead || !c->parked || !c->listed) continue;
      c->listed = false;
      advance_wait(*c, true);
    }
  }

  void queue(Conn& c, std::string frame) { c.out.push_back({std::move(frame), {}}); }

  // Sends what is queued until the socket is full; a failed send ends the connection.
  void flush(Conn& c) {
    while (!c.out.empty() && !c.dead) {
      std::array<iovec, 64> iov{};
      size_t n = 0;
      size_t skip = c.out_off;
      for (auto it = c.out.begin(); it != c.out.end() && n + 2 <= iov.size(); ++it) {
        std::string_view parts[2] = {it->head, it->body};
        for (std::string_view p : parts) {
          if (skip >= p.size()) {
            skip -= p.size();
            continue;
          }
          iov[n++] = {const_cast<char*>(p.data() + skip), p.size() - skip};
          skip = 0;
        }
      }
      msghdr msg{};
      msg.msg_iov = iov.data();
      msg.msg_iovlen = n;
      const ssize_t w = ::sendmsg(c.socket.get(), &msg, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        kill(c);
        return;
      }
      size_t sent = static_cast<size_t>(w);
      while (sent > 0) {
        const size_t left = c.out.front().head.size() + c.out.front().body.size() - c.out_off;
        if (sent < left) {
          c.out_off += sent;
          break;
        }
        sent -= left;
        c.out.pop_front();
        c.out_off = 0;
      }
    }
    if (c.out.empty() && c.closing) kill(c);
  }

  void update_events(Conn& c) {
    if (c.dead) return;
    const bool want_in = !c.closing && !(c.authed && (c.parked || c.out.size() >= kMaxQueued));
    const uint32_t events = EPOLLRDHUP | (want_in ? EPOLLIN : 0u) | (c.out.empty() ? 0u : EPOLLOUT);
    if (events == c.events) return;
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = c.id;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.socket.get(), &ev) == 0) c.events = events;
    // A parked wait with requests already received resumes them when it is answered.
  }

  const std::string where_;  // host:port as given
  const StoreOptions options_;
  const std::string secret_;
  const Limit connections_, bytes_limit_;
  Socket listener_, epoll_, wake_;
  std::string address_;
  int reserve_ = -1;
  std::atomic<bool> stop_{false};

  mutable std::mutex mutex_;  // guards map_, bytes_, woken_
  std::condition_variable cv_;
  std::unordered_map<std::string, std::string> map_;  // nodes stay put: values are sent from it
  size_t bytes_ = 0;
  std::vector<std::string> woken_;  // keys the serving process set, to wake waits with
  std::unordered_map<std::string, std::string> fenced_;  // process -> why (guarded by mutex_)

  // The loop thread's alone.
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::list<uint64_t> pending_;  // connections without proof, oldest first
  std::multimap<Clock::time_point, uint64_t> timers_;
  std::unordered_map<std::string, std::list<uint64_t>> waiters_;
  std::vector<uint64_t> dead_;
  std::vector<uint64_t> resume_;  // connections whose wait was answered
  std::array<char, size_t{64} << 10> buffer_{};
  uint64_t next_id_ = 2;
  bool accept_paused_ = false;
  Clock::time_point accept_resume_;
  std::thread loop_;
};

// ---- the store ---------------------------------------------------------------------------

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

  std::string uri() const override { return "tcp://" + host_ + ":" + std::to_string(port_); }
  std::string local_address() const override { return local_; }

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
      throw BackendError("tcp store " + uri() + ": " + printable(r.fields[0]));
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
    Message m{'W', {std::to_string(slice.count())}};
    m.fields.insert(m.fields.end(), keys.begin(), keys.end());
    std::optional<Message> r = request(m, slice, &abort_flag());
    if (!r) return keys;  // aborted: wait_for says so
    if (r->type != 'M') throw BackendError("tcp store " + uri() + ": unexpected reply to wait");
    return std::move(r->fields);
  }
  bool waits_in_slices() const override { return true; }

 private:
  void check_sizes(const std::string& key, size_t value) const {
    if (key.size() > kTcpStoreMaxKey || value > kTcpStoreMaxValue)
      throw BackendError("tcp store " + uri() + ": key of " + std::to_string(key.size()) +
                         " bytes or value of " + std::to_string(value) +
                         " bytes exceeds the limits (" + std::to_string(kTcpStoreMaxKey) + ", " +
                         std::to_string(kTcpStoreMaxValue) + ")");
  }

  enum class Handshake { ok, refused, dropped, timed_out };

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
    const Resolved where = resolve(uri(), host_, port_);
    std::string last = "no address", refusal;
    std::minstd_rand jitter(static_cast<unsigned>(::getpid()) ^
                            static_cast<unsigned>(start.time_since_epoch().count()));
    Ms backoff(20);
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
        const Handshake h = handshake(s.get(), deadline, refusal, secret);
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

  Handshake handshake(int fd, Clock::time_point deadline, std::string& refusal,
                      std::string& secret) {
    try {
      Message h;
      try {
        h = recv_message(fd, deadline, kMaxHandshakeFrame);
      } catch (const IoTimeout&) { throw; } catch (const IoError&) {
        return Handshake::dropped;
      }
      if (h.type == 'R' && h.fields.size() == 1) {
        refusal = printable(h.fields[0]);
        return Handshake::refused;
      }
      if (h.type != 'H' || h.fields.size() != 2 || h.fields[1].size() != 32)
        throw AuthenticationError("tcp store " + uri() +
                                  ": the server does not speak commgrid's store protocol");
      if (h.fields[0] != options_.job_id)
        throw JobConflictError("tcp store " + uri() + " serves job '" + printable(h.fields[0]) +
                               "' (this is job '" + options_.job_id +
                               "'): give each job its own MASTER_PORT");
      const std::string nonce = random_bytes(32);
      Message o;
      try {
        send_message(
            fd,
            {'A',
             {token_proof(options_.token, client_context(options_.job_id, h.fields[1])), nonce}},
            deadline);
        o = recv_message(fd, deadline, kMaxHandshakeFrame);
      } catch (const IoTimeout&) { throw; } catch (const IoError&) {
        return Handshake::dropped;
      }
      if (o.type == 'R')
        throw AuthenticationError("tcp store " + uri() + " refused this rank: it serves job '" +
                                  options_.job_id +
                                  "' with another token (COMMGRID_TOKEN differs)");
      if (o.type != 'O' || o.fields.size() != 2 ||
          !same_secret(o.fields[0],
                       token_proof(options_.token, server_context(options_.job_id, nonce))))
        throw AuthenticationError("tcp store " + uri() +
                                  ": the server did not prove the job's token");
      secret = o.fields[1];
      return Handshake::ok;
    } catch (const IoTimeout&) { return Handshake::timed_out; }
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
      send_message(socket_.get(), m, deadline);
      Message r = recv_message(socket_.get(), deadline + wait, kMaxFrame, stop);
      if (r.type == 'Z') {
        socket_ = Socket();
        // Kept: every later request says it again (a caller may have wrapped the first).
        fenced_ =
            "tcp store " + uri() + ": " +
            (r.fields.empty() ? std::string("this process is fenced") : printable(r.fields[0]));
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
  auto store = std::make_shared<TcpStore>(host, port, options);
  join_as_rank(*store, options);
  return store;
}

}  // namespace commgrid::bootstrap
