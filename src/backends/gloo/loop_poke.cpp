#include "loop_poke.hpp"

#include <gloo/transport/tcp/device.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>

namespace commgrid::gloo_backend {

namespace {

// Gloo's waiting thread locks and waits moments after its epoll_ctl returns; the loop may
// turn once before that. Readable for this many turns, the eventfd covers such a race
// without keeping the loop spinning.
constexpr int kTurns = 3;

// Which epoll descriptor belongs to which poked loop: learnt from the poker's own
// registration (its eventfd added to the loop's epoll set). Never destroyed: a group may
// close while statics are destroyed at exit.
struct PokeRegistry {
  std::mutex mutex;
  std::map<int, int> eventfd_of_epoll;  // epoll descriptor -> its poker's eventfd
  std::map<int, bool> pokers;           // eventfds of live pokers
};
PokeRegistry& poke_registry() {
  static PokeRegistry* const r = new PokeRegistry;
  return *r;
}
std::atomic<int> g_pokers{0};  // live pokers: the interposed call's fast path reads it

long real_epoll_ctl(int epfd, int op, int fd, epoll_event* ev) {
  return ::syscall(SYS_epoll_ctl, epfd, op, fd, ev);
}

}  // namespace

struct LoopPoker::Handler final : ::gloo::transport::tcp::Handler {
  explicit Handler(std::shared_ptr<::gloo::transport::tcp::Device> d)
      : device(std::move(d)), fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd < 0) return;
    {
      std::lock_guard lock(poke_registry().mutex);
      poke_registry().pokers[fd] = true;
    }
    ++g_pokers;
    try {
      device->registerDescriptor(fd, EPOLLIN, this);
      registered = true;
    } catch (const std::exception&) {
      // The loop keeps Gloo's own pace.
    }
  }
  ~Handler() override {
    {
      std::lock_guard lock(poke_registry().mutex);
      poke_registry().pokers.erase(fd);
      for (auto it = poke_registry().eventfd_of_epoll.begin();
           it != poke_registry().eventfd_of_epoll.end();)
        it = it->second == fd ? poke_registry().eventfd_of_epoll.erase(it) : std::next(it);
    }
    --g_pokers;
    if (registered) {
      try {
        device->unregisterDescriptor(fd, this);  // (its own turn: Gloo's pace, once)
      } catch (const std::exception&) {
        // Unregistering fails only if the descriptor is gone: nothing calls us any more.
      }
    }
    if (fd >= 0) ::close(fd);
  }
  Handler(const Handler&) = delete;
  Handler& operator=(const Handler&) = delete;

  // The loop thread: after kTurns turns the eventfd is read empty (no longer readable).
  void handleEvents(int /*events*/) override {
    if (++turns < kTurns) return;
    turns = 0;
    std::uint64_t v = 0;
    (void)!::read(fd, &v, sizeof v);
  }

  std::shared_ptr<::gloo::transport::tcp::Device> device;
  int fd = -1;
  bool registered = false;
  int turns = 0;  // the loop thread's alone
};

LoopPoker::LoopPoker(const std::shared_ptr<::gloo::transport::Device>& device) {
  if (auto tcp = std::dynamic_pointer_cast<::gloo::transport::tcp::Device>(device))
    handler_ = std::make_unique<Handler>(std::move(tcp));
}

LoopPoker::~LoopPoker() = default;

}  // namespace commgrid::gloo_backend

// ---- the interposed C library call ---------------------------------------------------------
// The system call itself, then: a poker's own registration records its loop's epoll
// descriptor; a descriptor leaving a poked loop wakes that loop.
extern "C" int epoll_ctl(int epfd, int op, int fd, epoll_event* ev) noexcept {
  using namespace commgrid::gloo_backend;
  const long rv = real_epoll_ctl(epfd, op, fd, ev);
  if (rv != 0 || g_pokers.load(std::memory_order_relaxed) == 0) return static_cast<int>(rv);
  // Under the lock: a poker's eventfd is closed only once it has left the registry.
  std::lock_guard lock(poke_registry().mutex);
  if (op == EPOLL_CTL_ADD && poke_registry().pokers.count(fd) != 0) {
    poke_registry().eventfd_of_epoll[epfd] = fd;
  } else if (op == EPOLL_CTL_DEL) {
    const auto it = poke_registry().eventfd_of_epoll.find(epfd);
    if (it != poke_registry().eventfd_of_epoll.end() && it->second != fd) {
      const std::uint64_t one = 1;
      (void)!::write(it->second, &one, sizeof one);
    }
  }
  return 0;
}
