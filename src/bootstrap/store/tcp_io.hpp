// Sockets for the tcp:// store (and the Redis store's probe): an owning descriptor, name
// resolution, and the client's blocking I/O whose every call is bounded by a deadline.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tcp_wire.hpp"

namespace commgrid::bootstrap {

/// The numeric local address of a connected socket ("127.0.0.1", "10.0.0.5"), or
/// "127.0.0.1" when it cannot be read.
[[nodiscard]] std::string socket_local_address(int fd);

namespace tcp {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

/// A failed read or write (the connection broke, or a frame was malformed).
class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
/// A read or write that did not complete by its deadline.
class IoTimeout : public IoError {
 public:
  using IoError::IoError;
};

/// An owned descriptor, closed when the object ends.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();
  [[nodiscard]] int get() const { return fd_; }

 private:
  int fd_;
};

/// The numeric host of a socket address; "" when it cannot be written.
[[nodiscard]] std::string numeric_host(const sockaddr* a, socklen_t len);

/// The addresses `host`:`port` resolves to (TCP); BackendError naming `where` when none.
[[nodiscard]] std::vector<std::pair<sockaddr_storage, socklen_t>> resolve(const std::string& where,
                                                                          const std::string& host,
                                                                          int port);

/// Waits for `events` on fd until the deadline or `stop`; throws IoTimeout at the deadline,
/// IoError when stopped.
void wait_fd(int fd, short events, Clock::time_point deadline, const std::atomic<bool>* stop);

/// Sends the whole message by the deadline (IoTimeout, or IoError when the peer is gone).
void send_message(int fd, const Message& m, Clock::time_point deadline);

/// Receives one message of at most `max` bytes by the deadline (IoTimeout), or until
/// `stop` turns true (IoError); IoError for a closed connection or a malformed frame.
[[nodiscard]] Message recv_message(int fd, Clock::time_point deadline, std::size_t max,
                                   const std::atomic<bool>* stop = nullptr);

}  // namespace tcp
}  // namespace commgrid::bootstrap
