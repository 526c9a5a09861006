// One process-wide thread that acts when a deadline passes before the operation it bounds
// has ended: what every backend uses to bound a call that cannot time out by itself (a
// blocking MPI creation call, a Gloo operation whose per-wait timeouts could add up). Not
// installed: backends are built in this tree.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace commgrid::detail {

/// While alive, runs `action` on the watchdog thread if `deadline` passes first. The
/// watchdog is one thread per process, started by the first registration and sleeping
/// while none is registered; registering and releasing cost a lock and an ordered insert
/// (no thread per call). Actions whose deadlines pass together run one after another in
/// deadline order; what each returns is kept alive until all of them have run (e.g. a
/// helper that keeps an event loop turning while the others are signalled), then dropped.
/// An action runs without the watchdog's lock and may take as long as it needs; it must not
/// create or release a WatchedDeadline.
class WatchedDeadline {
 public:
  using Clock = std::chrono::steady_clock;
  using Action = std::function<std::shared_ptr<void>()>;

  WatchedDeadline(Clock::time_point deadline, Action action);
  ~WatchedDeadline();
  WatchedDeadline(const WatchedDeadline&) = delete;
  WatchedDeadline& operator=(const WatchedDeadline&) = delete;

  /// Unregisters (once; the destructor does it otherwise) and says whether the watchdog took
  /// the action, i.e. the deadline passed first (the action may still be running).
  bool release() noexcept;
  /// Whether the deadline has passed (whether or not the watchdog has acted yet).
  [[nodiscard]] bool passed() const noexcept { return Clock::now() >= deadline_; }
  [[nodiscard]] Clock::time_point deadline() const noexcept { return deadline_; }

 private:
  Clock::time_point deadline_;
  std::uint64_t id_ = 0;  // 0: released
  bool taken_ = false;
};

/// A bound for calls made again and again on one object (a communicator's blocking MPI
/// collectives), cheaper than a WatchedDeadline per call: registered once, a call costs a
/// clock read and two atomic stores, no lock and no allocation. The watchdog looks at every
/// registered object every kPollPeriod while any is registered and, when a call has been
/// inside longer than the timeout, runs `on_stuck(op, timeout)` on its thread, once per object. So
/// a stuck call is acted on within the timeout plus kPollPeriod.
class WatchedCalls {
 public:
  using Clock = std::chrono::steady_clock;
  /// Runs on the watchdog thread with the stuck call's op and the timeout it exceeded.
  using Action = std::function<void(const std::string& op, std::chrono::milliseconds timeout)>;
  static constexpr std::chrono::milliseconds kPollPeriod{100};

  WatchedCalls(std::chrono::milliseconds timeout, Action on_stuck);
  ~WatchedCalls();
  WatchedCalls(const WatchedCalls&) = delete;
  WatchedCalls& operator=(const WatchedCalls&) = delete;

  /// The bound of later calls.
  void set_timeout(std::chrono::milliseconds timeout) noexcept;

  /// One call, while alive. `op` must be a string literal (it is read by the watchdog).
  class Call {
   public:
    Call(WatchedCalls& calls, const char* op) noexcept;
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    WatchedCalls& calls_;
  };

  /// What the watchdog reads: shared with it, so that an object destroyed while the
  /// watchdog looks at it leaves nothing dangling.
  struct Slot {
    std::atomic<std::int64_t> since{0};  ///< steady-clock ns when the call began; 0: idle
    std::atomic<const char*> op{nullptr};
    std::atomic<std::int64_t> timeout_ns{0};
    std::atomic<bool> fired{false};
    Action on_stuck;
  };

 private:
  std::shared_ptr<Slot> slot_;
};

}  // namespace commgrid::detail
