// One deadline for a whole Gloo operation. Gloo applies its timeout to every internal wait,
// so a collective whose peers progress slowly step after step could run several timeouts;
// a watchdog ends it when the operation's own deadline passes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "deadline_watchdog.hpp"

namespace gloo {
class Context;
}

namespace commgrid::gloo_backend {

/// While alive, bounds the Gloo operation `op` on `group` (which must outlive the guard)
/// running on `context`: when `deadline` passes first, the process-wide watchdog thread
/// (detail::WatchedDeadline, shared with every backend) fails every pending send and
/// receive of the context and closes its connections (Gloo's own timeout path), which wakes
/// every wait of the operation at once. Registering and removing cost a lock and an ordered
/// insert; the watchdog sleeps while no operation is registered.
/// After it fired, the context's connections are closed for good: the group cannot be used
/// again.
class DeadlineGuard {
 public:
  DeadlineGuard(std::shared_ptr<::gloo::Context> context, std::string_view op,
                const std::string& group, std::chrono::milliseconds timeout);
  DeadlineGuard(std::shared_ptr<::gloo::Context> context, std::string_view op,
                const std::string& group, std::chrono::milliseconds timeout,
                std::chrono::steady_clock::time_point deadline);
  ~DeadlineGuard();
  DeadlineGuard(const DeadlineGuard&) = delete;
  DeadlineGuard& operator=(const DeadlineGuard&) = delete;

  /// Unregisters (once; the destructor does it otherwise) and says whether the watchdog
  /// fired, that is whether the deadline passed before the operation ended.
  bool release();

  /// "gloo allreduce on tp#0: timed out after 1 s (the deadline of the whole operation);
  /// its connections are closed and the group cannot be used again".
  [[nodiscard]] std::string timeout_text() const;

  /// Whether the deadline has passed (the operation ran out of time even if the watchdog
  /// has not acted yet, e.g. Gloo's own per-wait timeout ended it a moment earlier).
  [[nodiscard]] bool passed() const;

 private:
  std::string_view op_;
  const std::string& group_;
  std::chrono::milliseconds timeout_;
  detail::WatchedDeadline watch_;  // last: registered once the members it reads exist
};

/// Runs fn (one Gloo operation on `context`) under one deadline, `timeout` from now. When
/// the deadline passes first, throws TimeoutError(guard.timeout_text()) whatever Gloo threw
/// (or even if the operation completed meanwhile: its connections are closed); otherwise
/// Gloo's own exception passes through unchanged for the caller to translate. An exception
/// after the deadline (Gloo's per-wait timeout racing the watchdog) is the timeout too.
template <typename F>
void with_deadline(const std::shared_ptr<::gloo::Context>& context, std::string_view op,
                   const std::string& group, std::chrono::milliseconds timeout, F&& fn);

/// As above, against a deadline set earlier: the last step of an operation that began
/// before (a group creation's barrier, against the creation's deadline).
template <typename F>
void with_deadline(const std::shared_ptr<::gloo::Context>& context, std::string_view op,
                   const std::string& group, std::chrono::milliseconds timeout,
                   std::chrono::steady_clock::time_point deadline, F&& fn);

/// Throws TimeoutError(text); out of line so that this header needs no error header.
[[noreturn]] void throw_deadline_passed(const std::string& text);

namespace deadline_detail {
template <typename F>
void run_guarded(DeadlineGuard& guard, F&& fn) {
  try {
    std::forward<F>(fn)();
  } catch (...) {
    if (guard.release() || guard.passed()) throw_deadline_passed(guard.timeout_text());
    throw;
  }
  if (guard.release()) throw_deadline_passed(guard.timeout_text());
}
}  // namespace deadline_detail

template <typename F>
void with_deadline(const std::shared_ptr<::gloo::Context>& context, std::string_view op,
                   const std::string& group, std::chrono::milliseconds timeout, F&& fn) {
  DeadlineGuard guard(context, op, group, timeout);
  deadline_detail::run_guarded(guard, std::forward<F>(fn));
}

template <typename F>
void with_deadline(const std::shared_ptr<::gloo::Context>& context, std::string_view op,
                   const std::string& group, std::chrono::milliseconds timeout,
                   std::chrono::steady_clock::time_point deadline, F&& fn) {
  DeadlineGuard guard(context, op, group, timeout, deadline);
  deadline_detail::run_guarded(guard, std::forward<F>(fn));
}

}  // namespace commgrid::gloo_backend
