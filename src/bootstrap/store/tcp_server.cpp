// The tcp:// store's server: listening, the event loop, timers and accepting connections
// (tcp_server.hpp). One connection's proof, requests and waits are tcp_server_requests.cpp.
#include "tcp_server.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>

#include "secrets.hpp"
#include "tcp_auth.hpp"
#include "text.hpp"

namespace commgrid::bootstrap::tcp {

TcpStoreServer::TcpStoreServer(const std::string& host, int port, const StoreOptions& options)
    : where_(host + ":" + std::to_string(port)), options_(options),
      secret_(options.token.empty() ? random_hex(32) : ""), connections_(connection_limit(options)),
      bytes_limit_(byte_limit(options)) {
  raise_descriptor_limit();
  listen_on(host, port);
  epoll_ = Socket(::epoll_create1(EPOLL_CLOEXEC));
  wake_ = Socket(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (epoll_.get() < 0 || wake_.get() < 0)
    throw BackendError("tcp store " + where_ +
                       ": cannot start its event loop: " + std::strerror(errno));
  watch(listener_.get(), kListenerId, EPOLLIN);
  watch(wake_.get(), kWakeId, EPOLLIN);
  reserve_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Returns once the loop thread runs: a server that exists serves, whatever happens to
  // the process next (a thread that had not yet started when the process ran out of
  // descriptors failed UBSan's type check at its start, under a loaded asan run).
  std::promise<void> running;
  std::future<void> started = running.get_future();
  loop_ = std::thread([this, running = std::move(running)]() mutable {
    running.set_value();
    loop();
  });
  started.wait();
}

TcpStoreServer::~TcpStoreServer() {
  stop_.store(true);
  signal_loop();
  loop_.join();
  if (reserve_ >= 0) ::close(reserve_);
}

TcpStoreServer::SetResult TcpStoreServer::set(const std::string& key, std::string_view value,
                                              std::string* why) {
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

std::optional<std::string> TcpStoreServer::get(const std::string& key) const {
  std::lock_guard lock(mutex_);
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

bool TcpStoreServer::has(const std::string& key) const {
  std::lock_guard lock(mutex_);
  return map_.count(key) != 0;
}

// Fences a process (resilience): every later request of a connection that identified as it
// is refused with `message` and the connection closed, and it cannot identify again.
void TcpStoreServer::fence(const std::string& process, const std::string& message) {
  std::lock_guard lock(mutex_);
  fenced_.emplace(process, message);
}

std::optional<std::string> TcpStoreServer::fenced(const std::string& process) const {
  std::lock_guard lock(mutex_);
  auto it = fenced_.find(process);
  if (it == fenced_.end()) return std::nullopt;
  return it->second;
}

// Waits at most `slice` (and at most 100 ms: the caller then sees abort()) for the keys.
std::vector<std::string> TcpStoreServer::wait(std::vector<std::string> keys, Ms slice) {
  std::unique_lock lock(mutex_);
  const auto until = Clock::now() + std::min(slice, Ms(100));
  auto done = [&] {
    std::erase_if(keys, [&](const std::string& k) { return map_.count(k) != 0; });
    return keys.empty();
  };
  cv_.wait_until(lock, until, done);
  return keys;
}

void TcpStoreServer::listen_on(const std::string& host, int port) {
  // Bound to MASTER_ADDR's own address: the job's interface, not every interface.
  std::string last = "no address";
  for (auto& [addr, len] : resolve(where_, host, port)) {
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

void TcpStoreServer::watch(int fd, uint64_t id, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
    throw BackendError("tcp store " + where_ + ": epoll: " + std::strerror(errno));
}

void TcpStoreServer::signal_loop() {
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
}

TcpStoreServer::SetResult TcpStoreServer::insert(const std::string& key, std::string_view value,
                                                 std::string* why) {
  const size_t cost = kTcpStoreKeyOverhead + key.size() + value.size();
  {
    std::lock_guard lock(mutex_);
    if (map_.count(key) != 0) return SetResult::exists;
    if (bytes_ + cost > bytes_limit_.value) {
      if (why != nullptr)
        *why = "store at " + where_ + " refused to set key " + quote_untrusted(key) + " (" +
               std::to_string(cost) + " bytes with its bookkeeping): it holds " +
               std::to_string(bytes_) + " bytes in " + std::to_string(map_.size()) +
               " keys, and its limit is " + std::to_string(bytes_limit_.value) + " bytes, set by " +
               bytes_limit_.source;
      return SetResult::full;
    }
    bytes_ += cost;
    map_.emplace(key, value);
  }
  cv_.notify_all();
  return SetResult::ok;
}

void TcpStoreServer::loop() {
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

TcpStoreServer::Conn* TcpStoreServer::find(uint64_t id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

void TcpStoreServer::kill(Conn& c) {
  if (c.dead) return;
  c.dead = true;
  dead_.push_back(c.id);
}

// Closes the connections marked dead (never while one of their calls is on the stack).
void TcpStoreServer::sweep() {
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

void TcpStoreServer::set_timer(Conn& c, Clock::time_point when) {
  cancel_timer(c);
  c.timer = timers_.emplace(when, c.id);
  c.has_timer = true;
}

void TcpStoreServer::cancel_timer(Conn& c) {
  if (!c.has_timer) return;
  timers_.erase(c.timer);
  c.has_timer = false;
}

void TcpStoreServer::fire_timers() {
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

void TcpStoreServer::on_wake() {
  uint64_t count = 0;
  (void)!::read(wake_.get(), &count, sizeof(count));
  std::vector<std::string> keys;
  {
    std::lock_guard lock(mutex_);
    keys.swap(woken_);
  }
  for (const auto& k : keys) wake_key(k);
}

void TcpStoreServer::on_listener() {
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
void TcpStoreServer::refuse_for_descriptors(int err) {
  const std::string why =
      err == ENFILE
          ? std::string("the machine is out of file descriptors (ENFILE)")
          : "the serving process is out of file descriptors (" + std::to_string(conns_.size()) +
                " connections in use, its limit ulimit -n is " +
                std::to_string(open_descriptor_limit()) + "): raise it on the machine of rank 0";
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

void TcpStoreServer::pause_accepting() {
  epoll_event ev{};
  ev.data.u64 = kListenerId;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &ev);
  accept_paused_ = true;
  accept_resume_ = Clock::now() + Ms(100);
}

void TcpStoreServer::resume_accepting() {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerId;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, listener_.get(), &ev);
  accept_paused_ = false;
}

// Tells a connection why it is refused: one small frame, which a fresh socket's buffer
// always holds; then it is closed.
void TcpStoreServer::refuse(int fd, const std::string& why) {
  const std::string frame = encode({'R', {why}});
  (void)!::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void TcpStoreServer::admit(Socket s) {
  const Limit cap = connection_cap(connections_);
  if (conns_.size() >= cap.value) {
    if (pending_.empty()) {
      refuse(s.get(),
             std::to_string(conns_.size()) + " connections in use, the limit set by " + cap.source);
      return;
    }
    evict_oldest_pending();
  } else if (pending_.size() >= pending_limit(cap.value, options_.world_size)) {
    evict_oldest_pending();  // strangers keep to their share; the ranks' is kept for them
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
  set_timer(
      c, Clock::now() + std::min<Ms>(kHandshakeDeadline, std::max<Ms>(options_.timeout, Ms(1000))));
  queue(c, encode(greeting(options_, c.nonce)));
  flush(c);
  update_events(c);
}

// Room for a new connection: the connection waiting longest for a proof goes (a genuine
// rank proves within a round trip; a stranger that says nothing is what stays).
void TcpStoreServer::evict_oldest_pending() {
  if (pending_.empty()) return;
  Conn* c = find(pending_.front());
  if (c == nullptr) {
    pending_.pop_front();
    return;
  }
  kill(*c);
  sweep();
}

}  // namespace commgrid::bootstrap::tcp
