#include "deadline_watchdog.hpp"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace commgrid::detail {
namespace {

using Clock = WatchedDeadline::Clock;

// Registrations ordered by (deadline, id); a deadline released in time removes its own
// entry, so the thread wakes at most once per deadline it waits for.
class Watchdog {
 public:
  // Never destroyed: an operation may still be bounded while static objects are destroyed
  // at exit, and the detached thread must never see its mutex go away. (A child forked
  // after the thread started has no watchdog; nothing commgrid runs survives fork.)
  static Watchdog& instance() {
    static Watchdog* const watchdog = new Watchdog;
    return *watchdog;
  }

  std::uint64_t add(Clock::time_point deadline, WatchedDeadline::Action action) {
    std::lock_guard lock(mutex_);
    if (!started_) {
      std::thread([this] { run(); }).detach();
      started_ = true;
    }
    const std::uint64_t id = ++last_id_;
    pending_.emplace(Key{deadline, id}, std::move(action));
    // Wake the thread only when it would otherwise wake too late: a call that registers and
    // releases a deadline later than the one the thread sleeps towards (the usual case: every
    // call has the same timeout) costs no wake-up, only the lock and the insert.
    if (deadline < wakes_at_) wake_.notify_one();
    return id;
  }

  void add(const std::shared_ptr<WatchedCalls::Slot>& slot) {
    std::lock_guard lock(mutex_);
    if (!started_) {
      std::thread([this] { run(); }).detach();
      started_ = true;
    }
    slots_.push_back(slot);
    // Polling starts now if the thread would otherwise sleep past the first look.
    if (Clock::now() + WatchedCalls::kPollPeriod < wakes_at_) wake_.notify_one();
  }

  // Whether the action was taken (the entry was gone).
  bool remove(Clock::time_point deadline, std::uint64_t id) {
    std::lock_guard lock(mutex_);
    return pending_.erase(Key{deadline, id}) == 0;
  }

 private:
  using Key = std::pair<Clock::time_point, std::uint64_t>;

  void run() {
    std::unique_lock lock(mutex_);
    Clock::time_point next_poll = Clock::now();
    for (;;) {
      if (!slots_.empty() && Clock::now() >= next_poll) {
        poll_slots(lock);
        next_poll = Clock::now() + WatchedCalls::kPollPeriod;
        continue;
      }
      const Clock::time_point poll = slots_.empty() ? Clock::time_point::max() : next_poll;
      if (pending_.empty() && poll == Clock::time_point::max()) {
        wakes_at_ = Clock::time_point::max();
        wake_.wait(lock);
        continue;
      }
      const Clock::time_point next = std::min(
          poll, pending_.empty() ? Clock::time_point::max() : pending_.begin()->first.first);
      if (Clock::now() < next) {
        wakes_at_ = next;
        wake_.wait_until(lock, next);
        continue;
      }
      if (pending_.empty() || pending_.begin()->first.first > Clock::now()) continue;
      wakes_at_ = Clock::time_point::min();  // acting: it looks at the map again afterwards
      std::vector<WatchedDeadline::Action> due;
      const auto now = Clock::now();
      while (!pending_.empty() && pending_.begin()->first.first <= now) {
        due.push_back(std::move(pending_.begin()->second));
        pending_.erase(pending_.begin());
      }
      lock.unlock();
      std::vector<std::shared_ptr<void>> kept;
      for (auto& action : due) {
        try {
          kept.push_back(action());
        } catch (...) {
          // An action reports through its own operation; the watchdog must live on.
        }
      }
      kept.clear();
      due.clear();  // what the actions captured (e.g. a group's last reference) ends here
      lock.lock();
    }
  }

  // Each registered WatchedCalls: a call inside for longer than its timeout gets its action
  // (once); slots whose object is gone are dropped.
  void poll_slots(std::unique_lock<std::mutex>& lock) {
    const std::int64_t now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
            .count();
    struct Stuck {
      std::shared_ptr<WatchedCalls::Slot> slot;
      std::string op;
      std::chrono::milliseconds timeout;
    };
    std::vector<Stuck> stuck;
    for (auto it = slots_.begin(); it != slots_.end();) {
      std::shared_ptr<WatchedCalls::Slot> s = it->lock();
      if (!s) {
        it = slots_.erase(it);
        continue;
      }
      const std::int64_t since = s->since.load(std::memory_order_acquire);
      const std::int64_t limit = s->timeout_ns.load(std::memory_order_relaxed);
      if (since != 0 && now - since > limit && !s->fired.exchange(true)) {
        const char* op = s->op.load(std::memory_order_acquire);
        stuck.push_back({std::move(s), op != nullptr ? op : "call",
                         std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::nanoseconds(limit))});
      }
      ++it;
    }
    if (stuck.empty()) return;
    lock.unlock();
    for (Stuck& st : stuck) {
      try {
        st.slot->on_stuck(st.op, st.timeout);
      } catch (...) {
        // The action reports by itself; the watchdog must live on.
      }
    }
    stuck.clear();
    lock.lock();
  }

  std::vector<std::weak_ptr<WatchedCalls::Slot>> slots_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<Key, WatchedDeadline::Action> pending_;
  std::uint64_t last_id_ = 0;
  // When the thread wakes by itself: max while it waits for a first registration, min while
  // it is not waiting (it looks at the map before it waits again).
  Clock::time_point wakes_at_ = Clock::time_point::max();
  bool started_ = false;
};

}  // namespace

WatchedDeadline::WatchedDeadline(Clock::time_point deadline, Action action)
    : deadline_(deadline), id_(Watchdog::instance().add(deadline, std::move(action))) {}

WatchedDeadline::~WatchedDeadline() { release(); }

bool WatchedDeadline::release() noexcept {
  if (id_ == 0) return taken_;
  taken_ = Watchdog::instance().remove(deadline_, id_);
  id_ = 0;
  return taken_;
}

namespace {
std::int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             WatchedCalls::Clock::now().time_since_epoch())
      .count();
}
}  // namespace

WatchedCalls::WatchedCalls(std::chrono::milliseconds timeout, Action on_stuck)
    : slot_(std::make_shared<Slot>()) {
  slot_->on_stuck = std::move(on_stuck);
  set_timeout(timeout);
  Watchdog::instance().add(slot_);
}

// The watchdog holds only a weak reference: dropping ours unregisters.
WatchedCalls::~WatchedCalls() = default;

void WatchedCalls::set_timeout(std::chrono::milliseconds timeout) noexcept {
  slot_->timeout_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count(),
                          std::memory_order_relaxed);
}

WatchedCalls::Call::Call(WatchedCalls& calls, const char* op) noexcept : calls_(calls) {
  calls_.slot_->op.store(op, std::memory_order_relaxed);
  calls_.slot_->since.store(steady_ns(), std::memory_order_release);
}

WatchedCalls::Call::~Call() { calls_.slot_->since.store(0, std::memory_order_release); }

}  // namespace commgrid::detail
