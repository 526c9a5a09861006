#include "deadline.hpp"

#include <gloo/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "commgrid/communicator.hpp"
#include "time_text.hpp"

namespace commgrid::gloo_backend {

using Clock = std::chrono::steady_clock;

namespace {

// Gloo closes a pair only after one more turn of the device's event loop (so that the
// loop no longer calls into it), and the loop sleeps up to 10 ms in epoll_wait when
// nothing happens: about 5 ms a pair, seconds for a large group, and the operation's wait
// ends only when its own pair's turn comes. While alive, an always-readable descriptor on
// the device keeps the loop turning, so that closing a pair takes microseconds.
class LoopTurner final : public ::gloo::transport::tcp::Handler {
 public:
  explicit LoopTurner(const std::shared_ptr<::gloo::transport::Device>& device)
      : device_(std::dynamic_pointer_cast<::gloo::transport::tcp::Device>(device)) {
    if (!device_) return;
    fd_ = ::eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd_ < 0) return;
    try {
      device_->registerDescriptor(fd_, EPOLLIN, this);
      registered_ = true;
    } catch (const std::exception&) {
      // Closing then takes Gloo's own time; it still happens.
    }
  }
  ~LoopTurner() override {
    if (registered_) {
      try {
        device_->unregisterDescriptor(fd_, this);
      } catch (const std::exception&) {
        // Unregistering fails only if the descriptor is gone: nothing calls us any more.
      }
    }
    if (fd_ >= 0) ::close(fd_);
  }
  LoopTurner(const LoopTurner&) = delete;
  LoopTurner& operator=(const LoopTurner&) = delete;
  // Level-triggered and never read: the next epoll_wait returns at once again.
  void handleEvents(int /*events*/) override {}

 private:
  std::shared_ptr<::gloo::transport::tcp::Device> device_;
  int fd_ = -1;
  bool registered_ = false;
};

}  // namespace

// One thread per process, sleeping while no operation is registered and otherwise until the
// earliest deadline. Registrations are ordered by (deadline, id); an operation that ends in
// time removes its own entry, so the thread wakes at most once per deadline it waited for.
class Watchdog {
 public:
  // Never destroyed: an operation may still run while static objects are destroyed at
  // exit, and the detached thread must never see its mutex go away. (A child forked after
  // the thread started has no watchdog, but no Gloo event loop either: Gloo does not
  // survive fork.)
  static Watchdog& instance() {
    static Watchdog* const watchdog = new Watchdog;
    return *watchdog;
  }

  std::uint64_t add(DeadlineGuard& guard) {
    std::lock_guard lock(mutex_);
    if (!started_) {
      std::thread([this] { run(); }).detach();
      started_ = true;
    }
    const std::uint64_t id = ++last_id_;
    const auto it = pending_.emplace(Key{guard.deadline_, id}, &guard).first;
    if (it == pending_.begin()) wake_.notify_one();  // a new earliest deadline
    return id;
  }

  // Whether the watchdog fired for this guard (then it has already removed it).
  bool remove(DeadlineGuard& guard) {
    std::lock_guard lock(mutex_);
    if (!guard.fired_) pending_.erase(Key{guard.deadline_, guard.id_});
    return guard.fired_;
  }

 private:
  using Key = std::pair<Clock::time_point, std::uint64_t>;

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (pending_.empty()) {
        wake_.wait(lock);
        continue;
      }
      const Clock::time_point next = pending_.begin()->first.first;
      if (Clock::now() < next) {
        wake_.wait_until(lock, next);
        continue;
      }
      std::vector<std::shared_ptr<::gloo::Context>> contexts;
      const auto now = Clock::now();
      while (!pending_.empty() && pending_.begin()->first.first <= now) {
        DeadlineGuard* guard = pending_.begin()->second;
        pending_.erase(pending_.begin());
        guard->fired_ = true;
        contexts.push_back(guard->context_);
      }
      // Without the lock: the operations wake and leave while their pairs are closed.
      lock.unlock();
      close_connections(contexts);
      contexts.clear();  // a group already destroyed by its owner ends here
      lock.lock();
    }
  }

  // Gloo's own timeout path, reached through its public API: a wait on a fresh buffer of a
  // context that times out at once makes Gloo fail every pending send and receive of every
  // pair of the context ("Application timeout caused pair closure"), which wakes all of the
  // operation's waits, and close the pairs. Every event loop involved keeps turning until
  // all contexts are signalled: the operations wake first, the loops then settle.
  static void close_connections(const std::vector<std::shared_ptr<::gloo::Context>>& contexts) {
    std::vector<std::unique_ptr<LoopTurner>> turners;
    for (const auto& ctx : contexts) turners.push_back(std::make_unique<LoopTurner>(ctx->getDevice()));
    for (const auto& ctx : contexts) {
      char byte = 0;
      try {
        std::unique_ptr<::gloo::transport::UnboundBuffer> probe = ctx->createUnboundBuffer(&byte, 1);
        probe->waitRecv(std::chrono::milliseconds(0));
      } catch (const std::exception&) {
        // Expected: the wait's own timeout, after the pairs were signalled.
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<Key, DeadlineGuard*> pending_;
  std::uint64_t last_id_ = 0;
  bool started_ = false;
};

DeadlineGuard::DeadlineGuard(std::shared_ptr<::gloo::Context> context, std::string_view op,
                             const std::string& group, std::chrono::milliseconds timeout)
    : DeadlineGuard(std::move(context), op, group, timeout, Clock::now() + timeout) {}

DeadlineGuard::DeadlineGuard(std::shared_ptr<::gloo::Context> context, std::string_view op,
                             const std::string& group, std::chrono::milliseconds timeout,
                             Clock::time_point deadline)
    : context_(std::move(context)), op_(op), group_(group), timeout_(timeout),
      deadline_(deadline) {
  id_ = Watchdog::instance().add(*this);
}

DeadlineGuard::~DeadlineGuard() { release(); }

bool DeadlineGuard::release() {
  if (id_ == 0) return fired_;
  fired_ = Watchdog::instance().remove(*this);
  id_ = 0;
  return fired_;
}

bool DeadlineGuard::passed() const { return Clock::now() >= deadline_; }

std::string DeadlineGuard::timeout_text() const {
  return "gloo " + std::string(op_) + " on " + group_ + ": timed out after " +
         seconds_text(timeout_) +
         " (one deadline for the whole operation); its connections are closed and the group "
         "cannot be used again";
}

void throw_deadline_passed(const std::string& text) { throw TimeoutError(text); }

}  // namespace commgrid::gloo_backend
