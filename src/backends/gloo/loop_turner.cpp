#include "loop_turner.hpp"

#include <gloo/transport/tcp/device.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

namespace commgrid::gloo_backend {

// An eventfd that is readable from the start and never read: level-triggered, the next
// epoll_wait returns at once again. It leaves the loop from the loop's own thread: a
// descriptor unregistered from another thread waits for one more turn of the loop, which,
// once this descriptor is gone, may sleep 10 ms; from the loop thread it does not wait.
struct LoopTurner::Handler final : ::gloo::transport::tcp::Handler {
  explicit Handler(std::shared_ptr<::gloo::transport::tcp::Device> device)
      : device(std::move(device)), fd(::eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd < 0) return;
    try {
      this->device->registerDescriptor(fd, EPOLLIN, this);
      registered = true;
    } catch (const std::exception&) {
      // The loop then keeps Gloo's own pace; every step still happens.
    }
  }
  ~Handler() override {
    if (registered) {
      stop.store(true);
      std::unique_lock lock(m);
      // The loop turns at once while this descriptor is registered; a loop that does not
      // (its device stopping) is left to Gloo's own unregistering.
      if (!cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return left; })) {
        lock.unlock();
        try {
          device->unregisterDescriptor(fd, this);
        } catch (const std::exception&) {
          // Unregistering fails only if the descriptor is gone: nothing calls us any more.
        }
      }
      // handleEvents' last act is to clear `inside`: after it, it touches nothing of ours.
      while (inside.load(std::memory_order_acquire)) std::this_thread::yield();
    }
    if (fd >= 0) ::close(fd);
  }
  Handler(const Handler&) = delete;
  Handler& operator=(const Handler&) = delete;

  void handleEvents(int /*events*/) override {
    if (!stop.load()) return;
    inside.store(true, std::memory_order_relaxed);
    bool gone = false;
    {
      std::lock_guard lock(m);
      if (!left) {
        try {
          device->unregisterDescriptor(fd, this);  // on the loop thread: no wait
        } catch (const std::exception&) {
          // As in the destructor.
        }
        left = gone = true;
      }
    }
    if (gone) cv.notify_all();
    inside.store(false, std::memory_order_release);
  }

  std::shared_ptr<::gloo::transport::tcp::Device> device;
  int fd = -1;
  bool registered = false;
  std::atomic<bool> stop{false};
  std::atomic<bool> inside{false};
  std::mutex m;
  std::condition_variable cv;
  bool left = false;  // unregistered from the loop thread (guarded by m)
};

LoopTurner::LoopTurner(const std::shared_ptr<::gloo::transport::Device>& device) {
  if (auto tcp = std::dynamic_pointer_cast<::gloo::transport::tcp::Device>(device))
    handler_ = std::make_unique<Handler>(std::move(tcp));
}

LoopTurner::~LoopTurner() = default;

}  // namespace commgrid::gloo_backend
