// One process-wide thread that acts when a deadline passes before the operation it bounds
// has ended: what every backend uses to bound a call that cannot time out by itself (a
// blocking MPI creation call, a Gloo operation whose per-wait timeouts could add up). Not
// installed: backends are built in this tree.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

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

}  // namespace commgrid::detail
