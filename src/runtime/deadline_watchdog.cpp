#include "deadline_watchdog.hpp"

#include <condition_variable>
#include <map>
#include <mutex>
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

  // Whether the action was taken (the entry was gone).
  bool remove(Clock::time_point deadline, std::uint64_t id) {
    std::lock_guard lock(mutex_);
    return pending_.erase(Key{deadline, id}) == 0;
  }

 private:
  using Key = std::pair<Clock::time_point, std::uint64_t>;

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (pending_.empty()) {
        wakes_at_ = Clock::time_point::max();
        wake_.wait(lock);
        continue;
      }
      const Clock::time_point next = pending_.begin()->first.first;
      if (Clock::now() < next) {
        wakes_at_ = next;
        wake_.wait_until(lock, next);
        continue;
      }
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

}  // namespace commgrid::detail
