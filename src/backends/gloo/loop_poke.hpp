// One turn of a Gloo device's event loop, at once, each time Gloo waits for one.
//
// Debian's Gloo (tcp transport) unregisters a descriptor from its device's loop (a pair's
// listener when the pair connects from this side, every pair when a group closes) and then
// waits for the loop's next turn, so that the loop no longer calls into it. The loop sleeps
// up to 10 ms in epoll_wait when nothing happens: about 10 ms a pair to connect or close a
// group. A LoopPoker on a device wakes its loop right after each such unregistering: the
// library interposes epoll_ctl (as the connection gate does listen, connect and accept,
// pair_gate.hpp) and, after every EPOLL_CTL_DEL on a poked loop's epoll descriptor, makes
// the poker's eventfd readable for the next few turns. Where the interposition does not
// take effect (a plugin opened with dlopen) Gloo keeps its own pace: nothing changes but time.
#pragma once

#include <memory>

namespace gloo::transport {
class Device;
}

namespace commgrid::gloo_backend {

class LoopPoker {
 public:
  /// Pokes `device`'s loop (a tcp device; anything else is left alone) while alive; it must
  /// not outlive the device.
  explicit LoopPoker(const std::shared_ptr<::gloo::transport::Device>& device);
  ~LoopPoker();
  LoopPoker(const LoopPoker&) = delete;
  LoopPoker& operator=(const LoopPoker&) = delete;

  struct Handler;

 private:
  std::unique_ptr<Handler> handler_;
};

}  // namespace commgrid::gloo_backend
