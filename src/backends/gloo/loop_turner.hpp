// Keeping a Gloo device's event loop turning while a caller waits for it.
//
// Debian's Gloo (tcp transport) finishes several steps only on the device loop's next turn:
// unregistering a descriptor (a pair's listener once its peer has connected; a pair being
// closed) waits until the loop has gone round once more, so that the loop no longer calls
// into it. The loop sleeps up to 10 ms in epoll_wait when nothing happens, so each such
// step costs up to 10 ms: about 10 ms a pair when a group connects, seconds to close a large
// group. While a LoopTurner is alive, an always-readable descriptor on the device keeps
// epoll_wait returning at once, so those steps take microseconds; the loop thread then
// spins, so a turner lives only for the few milliseconds such a step takes.
#pragma once

#include <memory>

namespace gloo::transport {
class Device;
}

namespace commgrid::gloo_backend {

class LoopTurner {
 public:
  /// Starts turning `device`'s loop (a tcp device; anything else is left alone).
  explicit LoopTurner(const std::shared_ptr<::gloo::transport::Device>& device);
  ~LoopTurner();
  LoopTurner(const LoopTurner&) = delete;
  LoopTurner& operator=(const LoopTurner&) = delete;

 private:
  struct Handler;
  std::unique_ptr<Handler> handler_;
};

}  // namespace commgrid::gloo_backend
