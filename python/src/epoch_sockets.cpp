#include "epoch_sockets.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "commgrid/resilience_keys.hpp"

namespace commgrid::python {
namespace {

constexpr std::size_t kMaxFds = 4096;

// Read by the signal handler: lock-free atomics and a plain array written only while
// nothing is armed and no handler is acting (arm_epoch_sockets).
std::atomic<std::int64_t> g_armed{-1};
std::atomic<int> g_active{0};
std::atomic<std::size_t> g_count{0};
std::atomic<std::int64_t> g_ended{0};
std::array<int, kMaxFds> g_fds{};
static_assert(std::atomic<std::int64_t>::is_always_lock_free);
static_assert(std::atomic<int>::is_always_lock_free);

// Shuts every armed socket down (async-signal-safe).
void shut_down_armed() {
  const std::size_t n = g_count.load();
  for (std::size_t i = 0; i < n; ++i) (void)::shutdown(g_fds[i], SHUT_RDWR);
}

// Nothing armed from now on, and no handler acting on what was: a handler that loaded the
// old epoch before the store is still shutting sockets down; one that starts now sees -1.
// Handlers run for microseconds.
void quiesce() {
  g_armed.store(-1);
  while (g_active.load() != 0) std::this_thread::yield();
}

void on_signal(int /*sig*/, siginfo_t* info, void* /*context*/) {
  const int saved = errno;
  g_active.fetch_add(1);
  const std::int64_t armed = g_armed.load();
  if (armed >= 0 && info != nullptr && info->si_code == SI_QUEUE &&
      static_cast<std::int64_t>(info->si_value.sival_int) == armed) {
    shut_down_armed();
    g_ended.fetch_add(1);
  }
  g_active.fetch_sub(1);
  errno = saved;
}

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = &on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (::sigaction(kEpochFailureSignal, &sa, nullptr) != 0)
      throw std::runtime_error(std::string("sigaction(SIGURG) failed: ") + std::strerror(errno));
  });
}

}  // namespace

void arm_epoch_sockets(std::int64_t epoch, const std::vector<int>& fds) {
  if (epoch < 0) throw std::invalid_argument("epoch: must be >= 0, got " + std::to_string(epoch));
  if (fds.size() > kMaxFds)
    throw std::invalid_argument("fds: at most " + std::to_string(kMaxFds) + " sockets, got " +
                                std::to_string(fds.size()));
  install_once();
  disarm_epoch_sockets();
  std::copy(fds.begin(), fds.end(), g_fds.begin());
  g_count.store(fds.size());
  g_armed.store(epoch);
}

void disarm_epoch_sockets() {
  quiesce();
  g_count.store(0);
}

std::size_t end_epoch_sockets() {
  quiesce();
  shut_down_armed();
  return g_count.exchange(0);
}

std::int64_t epoch_sockets_ended() { return g_ended.load(); }

}  // namespace commgrid::python
