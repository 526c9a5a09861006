// The connection gate in front of Gloo's pair sockets; pair_gate.hpp says why and how.
#include "pair_gate.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "commgrid/store.hpp"

namespace commgrid::gloo_backend {

using Clock = std::chrono::steady_clock;

struct PairGateScope::State {
  std::string token, prefix;
  int rank = 0;
  std::vector<int> peers;  // when given: the peer of each listener, in creation order
  Clock::time_point deadline;
  mutable std::mutex m;  // guards the members below (the loop thread writes `refused`)
  std::vector<std::string> refused;
  std::vector<int> listeners;  // listening descriptors recorded in this scope
  bool poked = false;          // the deadline passed: the watcher woke the waiting listeners
  std::vector<int> late;       // peers whose listener was still waiting then
  std::vector<int> pokes;      // the watcher's connections, closed with the scope
};

namespace {

constexpr std::size_t kProof = 64;  // hex of HMAC-SHA256
// A genuine connector sends its proof a round trip after it is accepted, but a round trip is
// whatever the link makes it (seconds on a slow, lossy one, with TCP's retransmissions), so
// silence alone refuses nobody before the deadline, and a refused stranger does not end the
// wait for the genuine peer either. What bounds a listener's cost is the number of
// connections it holds without a proof: past this many, the oldest is refused.
constexpr std::size_t kMaxUnproven = 16;

void (*g_listen_hook)(int) = nullptr;
std::atomic<std::int64_t> g_connect_delay_ms{0};

using State = PairGateScope::State;

thread_local State* t_scope = nullptr;
thread_local int t_paused = 0;

// A Gloo pair listener: its socket's identity (descriptor numbers are reused once Gloo
// closes one) and the proof its peer must send.
struct Listener {
  dev_t dev = 0;
  ino_t ino = 0;
  sockaddr_storage self{};
  int peer = 0;
  std::string mine, theirs;  // the listener's proof and its peer's
  std::shared_ptr<State> scope;
};

// The recorded listeners and the live scopes (owned by PairGateScope; the registry finds a
// scope's shared_ptr, which the thread-local raw pointer cannot give). Never destroyed, like
// the watcher thread that reads it: a group may still be created while statics are
// destroyed at exit.
struct Registry {
  std::mutex mutex;
  std::map<int, Listener> listeners;
  std::map<const State*, std::weak_ptr<State>> scopes;
};
Registry& registry() {
  static Registry* const r = new Registry;
  return *r;
}
std::atomic<std::size_t> g_count{0};  // registry().listeners.size(), read without the lock

// What each end of a connection to a Gloo listener sends first: bound to the token, the
// group creation, the listening port and the end (one end's proof never passes as the other's).
enum class End { listener, connector };
std::string proof_for(const State& s, int port, End end) {
  std::string p = token_proof(
      s.token,
      std::string(end == End::listener ? "commgrid gloo listener\n" : "commgrid gloo connector\n") +
          s.prefix + "\n" + std::to_string(port));
  p.resize(kProof, '0');
  return p;
}

int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

std::string address_text(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, host, sizeof(host));
  else if (a.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, host, sizeof(host));
  const std::string h = a.ss_family == AF_INET6 ? "[" + std::string(host) + "]" : host;
  return h + ":" + std::to_string(port_of(a));
}

int wait_ms(Clock::time_point until) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 60'000));
}

int real_listen(int fd, int backlog) {
  return static_cast<int>(::syscall(SYS_listen, fd, backlog));
}

int real_connect(int fd, const sockaddr* addr, socklen_t len) {
  return static_cast<int>(::syscall(SYS_connect, fd, addr, len));
}

// Records a socket that just started listening inside a scope. Returns false (errno set)
// when the socket cannot be gated; listen() then fails rather than listen ungated.
bool record_listener(int fd, State& scope) {
  struct stat st {};
  sockaddr_storage self{};
  socklen_t len = sizeof(self);
  if (::fstat(fd, &st) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) != 0)
    return false;
  const int port = port_of(self);
  if (port < 0) return true;  // not an IP socket: not one of Gloo's pairs
  Listener l;
  l.dev = st.st_dev;
  l.ino = st.st_ino;
  l.self = self;
  try {
    l.mine = proof_for(scope, port, End::listener);
    l.theirs = proof_for(scope, port, End::connector);
  } catch (...) {
    errno = EPROTO;
    return false;
  }
  {
    std::lock_guard lock(registry().mutex);
    auto it = registry().scopes.find(&scope);
    if (it == registry().scopes.end()) return true;
    l.scope = it->second.lock();
    {
      std::lock_guard slock(scope.m);
      // Gloo makes a pair for every peer but itself, in rank order.
      const int k = static_cast<int>(scope.listeners.size());
      if (scope.peers.empty()) l.peer = k < scope.rank ? k : k + 1;
      else l.peer = scope.peers[static_cast<std::size_t>(k) % scope.peers.size()];
      scope.listeners.push_back(fd);
    }
    registry().listeners[fd] = std::move(l);
    g_count.store(registry().listeners.size());
  }
  if (g_listen_hook) {
    PairGatePause pause;
    g_listen_hook(port);
  }
  return true;
}

// Removes and returns the listener recorded for fd, if fd still is that socket.
std::optional<Listener> take_listener(int fd) {
  if (g_count.load() == 0) return std::nullopt;
  struct stat st {};
  std::lock_guard lock(registry().mutex);
  auto it = registry().listeners.find(fd);
  if (it == registry().listeners.end()) return std::nullopt;
  Listener l = std::move(it->second);
  registry().listeners.erase(it);
  g_count.store(registry().listeners.size());
  if (::fstat(fd, &st) != 0 || st.st_dev != l.dev || st.st_ino != l.ino) return std::nullopt;
  return l;
}

// Gloo bounds each pair's wait for its connector on its own, one pair after another, so a
// rank whose peers connect late, one by one, could wait many timeouts. At a scope's deadline
// the watcher connects to every listener of it that Gloo still waits on: Gloo's loop then
// calls accept(), which fails at once (the deadline has passed), and the rank's creation
// ends now. Connecting sides are bounded by gated_connect itself.
class Watcher {
 public:
  // Never destroyed (see Registry); the thread is detached.
  static Watcher& instance() {
    static Watcher* const w = new Watcher;
    return *w;
  }
  void wake() {
    { std::lock_guard lock(m_); }
    cv_.notify_all();
  }

 private:
  Watcher() {
    std::thread([this] { run(); }).detach();
  }

  void run() {
    std::unique_lock lock(m_);
    for (;;) {
      std::optional<Clock::time_point> next = poke_due();
      if (next) cv_.wait_until(lock, *next);
      else cv_.wait(lock);
    }
  }

  // Pokes the scopes whose deadline passed; returns the next deadline still ahead.
  std::optional<Clock::time_point> poke_due() {
    std::optional<Clock::time_point> next;
    const auto now = Clock::now();
    std::lock_guard lock(registry().mutex);
    for (auto& [raw, weak] : registry().scopes) {
      std::shared_ptr<State> scope = weak.lock();
      if (!scope || scope->poked) continue;
      if (scope->deadline > now) {
        if (!next || scope->deadline < *next) next = scope->deadline;
        continue;
      }
      std::lock_guard slock(scope->m);
      scope->poked = true;
      for (const auto& [fd, l] : registry().listeners) {
        struct stat st {};
        if (l.scope != scope || ::fstat(fd, &st) != 0 || st.st_dev != l.dev || st.st_ino != l.ino)
          continue;  // another scope's, or closed by Gloo (that pair connected out)
        sockaddr_storage to = l.self;
        if (to.ss_family == AF_INET) {
          auto& in = reinterpret_cast<sockaddr_in&>(to);
          if (in.sin_addr.s_addr == htonl(INADDR_ANY)) in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        } else if (to.ss_family == AF_INET6) {
          auto& in6 = reinterpret_cast<sockaddr_in6&>(to);
          if (IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr)) in6.sin6_addr = in6addr_loopback;
        }
        const int poke = ::socket(to.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (poke < 0) continue;
        const socklen_t len = to.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
        (void)real_connect(poke, reinterpret_cast<const sockaddr*>(&to), len);
        scope->pokes.push_back(poke);
        scope->late.push_back(l.peer);
      }
    }
    return next;
  }

  std::mutex m_;
  std::condition_variable cv_;
};

struct Candidate {
  int fd = -1;
  sockaddr_storage addr{};
  socklen_t len = sizeof(sockaddr_storage);
  std::string got;
  Clock::time_point since;
};

// Accepts on a Gloo listener until a connection sends the whole proof (see the header).
int gated_accept(int lfd, sockaddr* addr, socklen_t* addrlen, const Listener& l) {
  State& scope = *l.scope;
  const int flags = ::fcntl(lfd, F_GETFL);
  if (flags >= 0) ::fcntl(lfd, F_SETFL, flags | O_NONBLOCK);
  std::vector<Candidate> cands;
  bool refused_any = false;
  auto refuse = [&](Candidate& c, const std::string& why) {
    {
      std::lock_guard lock(scope.m);
      scope.refused.push_back("unauthenticated peer at " + address_text(c.addr) +
                              " (on the listener for peer " + std::to_string(l.peer) +
                              " of this group): " + why);
    }
    ::close(c.fd);
    c.fd = -1;
    refused_any = true;
  };
  for (;;) {
    std::erase_if(cands, [](const Candidate& c) { return c.fd < 0; });
    while (cands.size() > kMaxUnproven) {
      refuse(cands.front(), "one of more than " + std::to_string(kMaxUnproven) +
                                " connections that had sent no proof of the job's token");
      cands.erase(cands.begin());
    }
    if (Clock::now() >= scope.deadline) {
      for (auto& c : cands) ::close(c.fd);
      errno = refused_any ? ECONNABORTED : ETIMEDOUT;
      return -1;
    }
    std::vector<pollfd> fds{{lfd, POLLIN, 0}};
    for (const auto& c : cands) fds.push_back({c.fd, POLLIN, 0});
    const int n = ::poll(fds.data(), fds.size(), wait_ms(scope.deadline));
    if (n < 0 && errno != EINTR) {
      const int e = errno;
      for (auto& c : cands) ::close(c.fd);
      errno = e;
      return -1;
    }
    if (n <= 0) continue;
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Candidate& c = cands[i - 1];
      char buf[kProof];
      const ssize_t r = ::recv(c.fd, buf, kProof - c.got.size(), MSG_DONTWAIT);
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (r <= 0) {
        refuse(c, r == 0 ? "it closed the connection without proving the job's token"
                         : std::string("it failed before proving the job's token: ") +
                               std::strerror(errno));
        continue;
      }
      c.got.append(buf, static_cast<std::size_t>(r));
      if (c.got.size() < kProof) continue;  // compared whole: a prefix must reveal nothing
      if (CRYPTO_memcmp(c.got.data(), l.theirs.data(), kProof) != 0) {
        refuse(c, "it did not prove the job's token");
        continue;
      }
      for (auto& other : cands)
        if (other.fd >= 0 && other.fd != c.fd) ::close(other.fd);
      if (addr && addrlen) {
        std::memcpy(addr, &c.addr, std::min<socklen_t>(*addrlen, c.len));
        *addrlen = c.len;
      }
      return c.fd;
    }
    if (fds[0].revents != 0) {
      for (;;) {
        Candidate c;
        c.fd = ::accept4(lfd, reinterpret_cast<sockaddr*>(&c.addr), &c.len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c.fd < 0) break;
        c.since = Clock::now();
        // A fresh socket's buffer takes the 64 bytes at once; one that does not is refused.
        if (::send(c.fd, l.mine.data(), kProof, MSG_NOSIGNAL | MSG_DONTWAIT) !=
            static_cast<ssize_t>(kProof)) {
          refuse(c, "the listener's proof could not be sent to it");
          continue;
        }
        cands.push_back(std::move(c));
      }
    }
  }
}

// Waits until fd is ready for `events` or the deadline passes (errno ETIMEDOUT then).
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, wait_ms(deadline));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
    if (n == 0 && Clock::now() >= deadline) {
      errno = ETIMEDOUT;
      return false;
    }
  }
}

// Gloo's connecting side: completes the connection, checks the listener's proof and sends
// its own, all before Gloo sees the socket.
int gated_connect(int fd, const sockaddr* addr, socklen_t len, State& scope) {
  sockaddr_storage peer{};
  std::memcpy(&peer, addr, std::min<std::size_t>(len, sizeof(peer)));
  std::string mine, theirs;
  try {
    mine = proof_for(scope, port_of(peer), End::connector);
    theirs = proof_for(scope, port_of(peer), End::listener);
  } catch (...) {
    errno = EPROTO;
    return -1;
  }
  auto refuse = [&](const std::string& why) {
    std::lock_guard lock(scope.m);
    scope.refused.push_back("unauthenticated peer at " + address_text(peer) +
                            " (a listener of this group): " + why);
    errno = ECONNREFUSED;
    return -1;
  };
  if (real_connect(fd, addr, len) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) return -1;
    if (!wait_ready(fd, POLLOUT, scope.deadline)) return -1;
    int err = 0;
    socklen_t elen = sizeof(err);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) return -1;
    if (err != 0) {
      errno = err;
      return -1;
    }
  }
  std::string got;
  while (got.size() < kProof) {
    char buf[kProof];
    const ssize_t r = ::recv(fd, buf, kProof - got.size(), MSG_DONTWAIT);
    if (r > 0) {
      got.append(buf, static_cast<std::size_t>(r));
      continue;
    }
    if (r == 0) return refuse("it closed the connection without proving the job's token");
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return -1;
    if (!wait_ready(fd, POLLIN, scope.deadline)) return -1;
  }
  if (CRYPTO_memcmp(got.data(), theirs.data(), kProof) != 0)
    return refuse("it did not prove the job's token");
  if (const auto ms = g_connect_delay_ms.load(); ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  std::size_t sent = 0;
  while (sent < kProof) {
    const ssize_t w = ::send(fd, mine.data() + sent, kProof - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      sent += static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN) return -1;
    if (!wait_ready(fd, POLLOUT, scope.deadline)) return -1;
  }
  return 0;
}

bool is_stream_ip(int fd, const sockaddr* addr) {
  if (!addr || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)) return false;
  int type = 0;
  socklen_t len = sizeof(type);
  return ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
}

// Whether `symbol`, looked up the way Gloo's own calls are, is defined in this object.
bool resolves_here(const char* symbol) {
  Dl_info mine{}, theirs{};
  void* found = ::dlsym(RTLD_DEFAULT, symbol);
  return found && ::dladdr(reinterpret_cast<void*>(&resolves_here), &mine) != 0 &&
         ::dladdr(found, &theirs) != 0 && mine.dli_fbase == theirs.dli_fbase;
}

}  // namespace

bool pair_gate_available() {
  static const bool available =
      resolves_here("accept") && resolves_here("connect") && resolves_here("listen");
  return available;
}

PairGateScope::PairGateScope(const std::string& token, const std::string& prefix, int rank,
                             Clock::time_point deadline)
    : PairGateScope(token, prefix, rank, {}, deadline) {}

PairGateScope::PairGateScope(const std::string& token, const std::string& prefix, int rank,
                             std::vector<int> peers, Clock::time_point deadline) {
  if (!pair_gate_available()) return;
  state_ = std::make_shared<State>();
  state_->token = token;
  state_->prefix = prefix;
  state_->rank = rank;
  state_->peers = std::move(peers);
  state_->deadline = deadline;
  {
    std::lock_guard lock(registry().mutex);
    registry().scopes[state_.get()] = state_;
  }
  Watcher::instance().wake();
  outer_ = t_scope;
  t_scope = state_.get();
}

PairGateScope::~PairGateScope() {
  if (!state_) return;
  if (t_scope == state_.get()) t_scope = outer_;
  std::lock_guard lock(registry().mutex);
  registry().scopes.erase(state_.get());
  // Listeners Gloo closed itself (the connecting side of each pair) leave entries behind.
  std::erase_if(registry().listeners, [&](const auto& e) { return e.second.scope == state_; });
  g_count.store(registry().listeners.size());
  std::lock_guard slock(state_->m);
  for (int fd : state_->pokes) ::close(fd);
}

void PairGateScope::leave() {
  if (state_ && t_scope == state_.get()) t_scope = outer_;
}

PairGateScope::Entered::Entered(PairGateScope& scope) {
  if (!scope.state_) return;
  previous_ = t_scope;
  t_scope = scope.state_.get();
  active_ = true;
}

PairGateScope::Entered::~Entered() {
  if (active_) t_scope = previous_;
}

std::vector<int> PairGateScope::late_peers() const {
  if (!state_) return {};
  std::lock_guard lock(state_->m);
  return state_->late;
}

std::vector<std::string> PairGateScope::refused() const {
  if (!state_) return {};
  std::lock_guard lock(state_->m);
  return state_->refused;
}

void set_pair_gate_listen_hook(void (*hook)(int port)) { g_listen_hook = hook; }

void set_pair_gate_connect_delay_for_testing(std::chrono::milliseconds delay) {
  g_connect_delay_ms.store(delay.count());
}

PairGatePause::PairGatePause() { ++t_paused; }
PairGatePause::~PairGatePause() { --t_paused; }

}  // namespace commgrid::gloo_backend

// ---- the interposed C library calls ----------------------------------------------------
// Outside a scope (and for every descriptor that is not a recorded Gloo listener) each is
// the system call itself.

extern "C" int listen(int fd, int backlog) noexcept {
  using namespace commgrid::gloo_backend;
  const int rv = real_listen(fd, backlog);
  if (rv != 0 || t_scope == nullptr || t_paused != 0) return rv;
  if (!record_listener(fd, *t_scope)) return -1;
  return 0;
}

extern "C" int connect(int fd, const sockaddr* addr, socklen_t len) {
  using namespace commgrid::gloo_backend;
  if (t_scope == nullptr || t_paused != 0 || !is_stream_ip(fd, addr))
    return real_connect(fd, addr, len);
  return gated_connect(fd, addr, len, *t_scope);
}

extern "C" int accept(int fd, sockaddr* addr, socklen_t* len) {
  using namespace commgrid::gloo_backend;
  if (std::optional<Listener> l = take_listener(fd)) return gated_accept(fd, addr, len, *l);
  return ::accept4(fd, addr, len, 0);
}
