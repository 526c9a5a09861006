// The connection gate in front of Gloo's pair sockets; pair_gate.hpp says why and how.
#include "pair_gate.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

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
  int listeners = 0;      // listeners recorded in this scope (the next one's peer)
  std::vector<int> late;  // peers whose listener was still waiting at the deadline
};

namespace {

constexpr std::size_t kProof = 64;  // hex of HMAC-SHA256
// A genuine connector sends its proof a round trip after it is accepted, but a round trip is
// whatever the link makes it (seconds on a slow, lossy one, with TCP's retransmissions), so
// silence alone refuses nobody before the deadline, and a refused stranger does not end the
// wait for the genuine peer either. What bounds a listener's cost is the number of
// connections it holds without a proof: past this many, the oldest is refused.
constexpr std::size_t kMaxUnproven = 16;
// How long a listener rests after accept4 found no descriptor or memory for a connection
// waiting on it: the gate tries again then (the connection waits in the backlog), instead
// of spinning on a socket that stays readable until the creation's deadline.
constexpr std::chrono::milliseconds kResting{20};

void (*g_listen_hook)(int) = nullptr;
std::atomic<std::int64_t> g_connect_delay_ms{0};

using State = PairGateScope::State;

thread_local State* t_scope = nullptr;
thread_local int t_paused = 0;

struct Candidate {
  int fd = -1;
  sockaddr_storage addr{};
  socklen_t len = sizeof(sockaddr_storage);
  std::string got;
};

// A Gloo pair listener. Gloo keeps the descriptor number it listened on (`gloo_fd`), but
// from listen() on that number is one end of a local socket pair whose other end
// (`signal`) the gate writes a byte to once the pair is decided: a proven connection to
// hand over, or a failure. The bound TCP socket itself moved to `real`, where the gate's
// thread accepts and checks proofs, so Gloo's event loop never waits for a peer's proof
// and a stranger on one listener holds up no other pair.
struct Listener {
  dev_t dev = 0;  // identity of Gloo's descriptor (numbers are reused once Gloo closes one)
  ino_t ino = 0;
  int real = -1;
  int signal = -1;
  sockaddr_storage self{};  // what getsockname() answers for Gloo's descriptor
  socklen_t self_len = 0;
  int peer = 0;
  std::string mine, theirs;  // the listener's proof and its peer's
  std::shared_ptr<State> scope;
  std::vector<Candidate> cands;  // accepted, proof not yet complete
  bool refused_any = false;
  bool decided = false;
  Candidate proven;  // fd >= 0: the connection Gloo's accept() gets
  int error = 0;     // decided without one: the errno Gloo's accept() gets
  // accept4 found the process out of descriptors or memory with a connection waiting: the
  // listening socket is not watched until then (it stays readable: watching it would spin).
  Clock::time_point resting_until{};
};

// The recorded listeners, by Gloo's descriptor, and the live scopes (owned by
// PairGateScope; the registry finds a scope's shared_ptr, which the thread-local raw
// pointer cannot give). Never destroyed, like the gate's thread that reads it: a group may
// still be created while statics are destroyed at exit.
struct Registry {
  std::mutex mutex;
  std::map<int, Listener> listeners;
  std::map<const State*, std::weak_ptr<State>> scopes;
};
void at_fork_prepare();
void at_fork_parent();
void at_fork_child();
Registry& registry() {
  static Registry* const r = [] {
    auto* made = new Registry;
    ::pthread_atfork(at_fork_prepare, at_fork_parent, at_fork_child);
    return made;
  }();
  return *r;
}
std::atomic<std::size_t> g_count{0};  // registry().listeners.size(), read without the lock
// Guards the gate's thread's creation (GateThread::instance); taken after the registry's
// mutex where both are held.
std::mutex g_gate_thread_mutex;

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

int real_getsockname(int fd, sockaddr* addr, socklen_t* len) {
  return static_cast<int>(::syscall(SYS_getsockname, fd, addr, len));
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Whether Gloo still holds the descriptor recorded for `l` (not closed, or closed and reused).
bool gloo_holds(int gloo_fd, const Listener& l) {
  struct stat st {};
  return ::fstat(gloo_fd, &st) == 0 && st.st_dev == l.dev && st.st_ino == l.ino;
}

// Everything the gate holds for `l` (Gloo's descriptor is Gloo's to close).
void release(Listener& l) {
  close_fd(l.real);
  close_fd(l.signal);
  close_fd(l.proven.fd);
  for (Candidate& c : l.cands) close_fd(c.fd);
  l.cands.clear();
}

// fork(): the child gets a copy of the gate's locks as they were. Had another thread (the
// gate's own, a creation) held one, the child's first getsockname(), accept() or group
// would wait for it forever; so fork waits until both are free, and the child starts with
// them free. The listeners and scopes are the parent's creations: the child forgets them
// and closes its copies of their sockets (a child that never execs would otherwise keep
// the parent's listening sockets open).
void at_fork_prepare() {
  registry().mutex.lock();
  g_gate_thread_mutex.lock();
}
void at_fork_parent() {
  g_gate_thread_mutex.unlock();
  registry().mutex.unlock();
}
void at_fork_child() {
  g_gate_thread_mutex.unlock();
  for (auto& [gloo_fd, l] : registry().listeners) release(l);
  registry().listeners.clear();
  registry().scopes.clear();
  g_count.store(0);
  registry().mutex.unlock();
}

// The pair is decided: Gloo's descriptor turns readable and its accept() gets `l.proven`
// or, when there is none, fails with `error`. The listening socket closes now.
void decide(Listener& l, int error) {
  close_fd(l.real);
  for (Candidate& c : l.cands) close_fd(c.fd);
  l.cands.clear();
  l.decided = true;
  l.error = error;
  const char byte = 1;
  (void)!::send(l.signal, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void refuse(Listener& l, Candidate& c, const std::string& why) {
  {
    std::lock_guard lock(l.scope->m);
    l.scope->refused.push_back("unauthenticated peer at " + address_text(c.addr) +
                               " (on the listener for peer " + std::to_string(l.peer) +
                               " of this group): " + why);
  }
  close_fd(c.fd);
  l.refused_any = true;
}

// Listeners whose scope has ended and whose descriptor Gloo closed without accepting (the
// connecting side of a pair, or a pair given up) are released. Registry lock held.
void sweep_locked() {
  for (auto it = registry().listeners.begin(); it != registry().listeners.end();) {
    Listener& l = it->second;
    const bool scope_live = registry().scopes.contains(l.scope.get());
    if (!scope_live && !gloo_holds(it->first, l)) {
      release(l);
      it = registry().listeners.erase(it);
    } else {
      ++it;
    }
  }
  g_count.store(registry().listeners.size());
}

// The gate's thread: accepts on every undecided listener, sends the listener's proof, reads
// the connectors' proofs, refuses the wrong and (past kMaxUnproven) the oldest silent ones,
// hands the first proven connection over, and at a scope's deadline decides its listeners
// still waiting (their pairs fail; the rank names the late peers or the refused ones).
class GateThread {
 public:
  // Never destroyed (see Registry); the thread is detached.
  static GateThread& instance() {
    static GateThread* g = nullptr;
    std::lock_guard lock(g_gate_thread_mutex);
    if (!g || g->pid_ != ::getpid()) g = new GateThread;  // a forked child has no thread of ours
    return *g;
  }
  // Something to watch changed (a listener recorded, a scope with its deadline made).
  void wake() const {
    const std::uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof(one));
  }

 private:
  GateThread() : pid_(::getpid()), wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    std::thread([this] { run(); }).detach();
  }

  // One watched descriptor: a listener's listening socket (listening) or a candidate.
  struct Watch {
    int gloo_fd;
    int fd;
    bool listening;
  };

  [[noreturn]] void run() {
    std::vector<pollfd> fds;
    std::vector<Watch> watches;
    for (;;) {
      fds.assign(1, pollfd{wake_, POLLIN, 0});
      watches.clear();
      std::optional<Clock::time_point> next;
      const auto earliest = [&](Clock::time_point t) {
        if (!next || t < *next) next = t;
      };
      {
        std::lock_guard lock(registry().mutex);
        const auto now = Clock::now();
        for (auto& [gloo_fd, l] : registry().listeners) {
          if (l.decided) continue;
          earliest(l.scope->deadline);
          if (l.resting_until > now) {
            earliest(l.resting_until);
          } else {
            fds.push_back({l.real, POLLIN, 0});
            watches.push_back({gloo_fd, l.real, true});
          }
          for (const Candidate& c : l.cands) {
            fds.push_back({c.fd, POLLIN, 0});
            watches.push_back({gloo_fd, c.fd, false});
          }
        }
      }
      const int n = ::poll(fds.data(), fds.size(), next ? wait_ms(*next) : -1);
      if (n < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      std::uint64_t drained = 0;
      (void)!::read(wake_, &drained, sizeof(drained));
      std::lock_guard lock(registry().mutex);
      for (std::size_t i = 1; n > 0 && i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        const Watch& w = watches[i - 1];
        auto it = registry().listeners.find(w.gloo_fd);
        if (it == registry().listeners.end() || it->second.decided) continue;
        Listener& l = it->second;
        if (w.listening) {
          if (l.real == w.fd) accept_all(l);
        } else {
          auto c = std::find_if(l.cands.begin(), l.cands.end(),
                                [&](const Candidate& x) { return x.fd == w.fd; });
          if (c != l.cands.end()) read_proof(l, *c);
        }
      }
      end_due();
    }
  }

  static void accept_all(Listener& l) {
    for (;;) {
      Candidate c;
      c.fd = ::accept4(l.real, reinterpret_cast<sockaddr*>(&c.addr), &c.len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (c.fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          l.resting_until = Clock::now() + kResting;
        break;
      }
      // A fresh socket's buffer takes the 64 bytes at once; one that does not is refused.
      if (::send(c.fd, l.mine.data(), kProof, MSG_NOSIGNAL | MSG_DONTWAIT) !=
          static_cast<ssize_t>(kProof)) {
        refuse(l, c, "the listener's proof could not be sent to it");
        continue;
      }
      l.cands.push_back(std::move(c));
      if (l.cands.size() > kMaxUnproven) {
        refuse(l, l.cands.front(),
               "one of more than " + std::to_string(kMaxUnproven) +
                   " connections that had sent no proof of the job's token");
        l.cands.erase(l.cands.begin());
      }
    }
  }

  static void read_proof(Listener& l, Candidate& c) {
    char buf[kProof];
    const ssize_t r = ::recv(c.fd, buf, kProof - c.got.size(), MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) {
      refuse(l, c,
             r == 0 ? "it closed the connection without proving the job's token"
                    : std::string("it failed before proving the job's token: ") +
                          std::strerror(errno));
    } else {
      c.got.append(buf, static_cast<std::size_t>(r));
      if (c.got.size() < kProof) return;  // compared whole: a prefix must reveal nothing
      if (CRYPTO_memcmp(c.got.data(), l.theirs.data(), kProof) != 0) {
        refuse(l, c, "it did not prove the job's token");
      } else {
        l.proven = c;  // the descriptor changes hands: the candidate no longer owns it
        c.fd = -1;
      }
    }
    std::erase_if(l.cands, [](const Candidate& x) { return x.fd < 0; });
    if (l.proven.fd >= 0) decide(l, 0);
  }

  // Decides the listeners whose scope's deadline has passed. Registry lock held.
  static void end_due() {
    const auto now = Clock::now();
    for (auto it = registry().listeners.begin(); it != registry().listeners.end();) {
      Listener& l = it->second;
      if (l.decided || l.scope->deadline > now) {
        ++it;
        continue;
      }
      if (!gloo_holds(it->first, l)) {  // Gloo connected out (or gave the pair up)
        release(l);
        it = registry().listeners.erase(it);
        continue;
      }
      {
        std::lock_guard slock(l.scope->m);
        l.scope->late.push_back(l.peer);
      }
      decide(l, l.refused_any ? ECONNABORTED : ETIMEDOUT);
      ++it;
    }
    g_count.store(registry().listeners.size());
  }

  pid_t pid_;
  int wake_;
};

// Records a socket that just started listening inside a scope and moves it behind the gate
// (see Listener). Returns false (errno set) when the socket cannot be gated; listen() then
// fails rather than listen ungated.
bool record_listener(int fd, State& scope) {
  sockaddr_storage self{};
  socklen_t len = sizeof(self);
  if (real_getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len) != 0) return false;
  const int port = port_of(self);
  if (port < 0) return true;  // not an IP socket: not one of Gloo's pairs
  Listener l;
  l.self = self;
  l.self_len = len;
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
  }
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, ends) != 0) return false;
  l.signal = ends[1];
  l.real = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  const int flags = l.real >= 0 ? ::fcntl(l.real, F_GETFL) : -1;
  struct stat st {};
  if (flags < 0 || ::fcntl(l.real, F_SETFL, flags | O_NONBLOCK) != 0 || ::dup2(ends[0], fd) < 0 ||
      ::fstat(fd, &st) != 0) {
    const int e = errno;
    if (l.real >= 0) (void)!::dup2(l.real, fd);  // fd the listening socket again, if it can
    ::close(ends[0]);
    release(l);
    errno = e;
    return false;
  }
  ::close(ends[0]);
  l.dev = st.st_dev;
  l.ino = st.st_ino;
  {
    std::lock_guard lock(registry().mutex);
    {
      std::lock_guard slock(scope.m);
      // Gloo makes a pair for every peer but itself, in rank order.
      const int k = scope.listeners++;
      if (scope.peers.empty()) l.peer = k < scope.rank ? k : k + 1;
      else l.peer = scope.peers[static_cast<std::size_t>(k) % scope.peers.size()];
    }
    // An entry under this number is stale: Gloo closed that descriptor (the number is
    // reused), so the gate lets go of what it held for it.
    if (auto old = registry().listeners.find(fd); old != registry().listeners.end()) {
      release(old->second);
      registry().listeners.erase(old);
    }
    registry().listeners.emplace(fd, std::move(l));
    sweep_locked();
  }
  GateThread::instance().wake();
  if (g_listen_hook) {
    PairGatePause pause;
    g_listen_hook(port);
  }
  return true;
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

void copy_address(const sockaddr_storage& from, socklen_t from_len, sockaddr* to, socklen_t* len) {
  if (!to || !len) return;
  std::memcpy(to, &from, std::min(*len, from_len));
  *len = from_len;
}

// Gloo's accept() on a listener's descriptor: the proven connection, or the failure it was
// decided with. nullopt when fd is no recorded listener (the plain call then).
std::optional<int> take_decided(int fd, sockaddr* addr, socklen_t* len) {
  if (g_count.load() == 0) return std::nullopt;
  std::lock_guard lock(registry().mutex);
  auto it = registry().listeners.find(fd);
  if (it == registry().listeners.end() || !gloo_holds(fd, it->second)) return std::nullopt;
  Listener& l = it->second;
  if (!l.decided) {  // Gloo's descriptor turns readable only once decided
    errno = EAGAIN;
    return -1;
  }
  const int proven = std::exchange(l.proven.fd, -1);
  const int error = l.error;
  if (proven >= 0) copy_address(l.proven.addr, l.proven.len, addr, len);
  release(l);
  registry().listeners.erase(it);
  g_count.store(registry().listeners.size());
  GateThread::instance().wake();  // its poll() holds what was closed until it returns
  if (proven < 0) errno = error;
  return proven;
}

// getsockname() on a listener's descriptor answers for the listening socket behind it.
bool listener_address(int fd, sockaddr* addr, socklen_t* len) {
  if (g_count.load() == 0) return false;
  std::lock_guard lock(registry().mutex);
  auto it = registry().listeners.find(fd);
  if (it == registry().listeners.end() || !gloo_holds(fd, it->second)) return false;
  copy_address(it->second.self, it->second.self_len, addr, len);
  return true;
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
  static const bool available = resolves_here("accept") && resolves_here("connect") &&
                                resolves_here("listen") && resolves_here("getsockname");
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
  GateThread::instance().wake();
  outer_ = t_scope;
  t_scope = state_.get();
}

PairGateScope::~PairGateScope() {
  if (!state_) return;
  if (t_scope == state_.get()) t_scope = outer_;
  std::lock_guard lock(registry().mutex);
  registry().scopes.erase(state_.get());
  // A listener still waiting now belongs to a creation given up: its pair fails at once.
  // Those Gloo closed itself (the connecting side of each pair) are released by the sweep.
  for (auto& [gloo_fd, l] : registry().listeners)
    if (l.scope == state_ && !l.decided && gloo_holds(gloo_fd, l)) decide(l, ECONNABORTED);
  sweep_locked();
  GateThread::instance().wake();  // its poll() holds what was closed until it returns
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

std::unique_lock<std::mutex> lock_pair_gate_for_testing() {
  return std::unique_lock(registry().mutex);
}

PairGatePause::PairGatePause() { ++t_paused; }
PairGatePause::~PairGatePause() { --t_paused; }

}  // namespace commgrid::gloo_backend

// ---- the interposed C library calls ----------------------------------------------------
// Outside a scope (and for every descriptor that is not a recorded Gloo listener) each is
// the system call itself.

extern "C" int listen(int fd, int backlog) noexcept {
  using namespace commgrid::gloo_backend;
  // Gloo's backlog is 1; the gate's thread drains the queue, and a few strangers waiting in
  // it must not push the genuine peer's connection out.
  const bool gated = t_scope != nullptr && t_paused == 0;
  const int rv =
      real_listen(fd, gated ? std::max(backlog, static_cast<int>(kMaxUnproven)) : backlog);
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
  if (std::optional<int> rv = take_decided(fd, addr, len)) return *rv;
  return ::accept4(fd, addr, len, 0);
}

extern "C" int getsockname(int fd, sockaddr* addr, socklen_t* len) noexcept {
  using namespace commgrid::gloo_backend;
  if (listener_address(fd, addr, len)) return 0;
  return real_getsockname(fd, addr, len);
}
