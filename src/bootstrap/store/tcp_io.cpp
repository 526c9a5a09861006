// Sockets and the client's bounded I/O (tcp_io.hpp).
#include "tcp_io.hpp"

#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "commgrid/error.hpp"

namespace commgrid::bootstrap {
namespace tcp {
namespace {

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<Ms>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 200));
}

void send_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    wait_fd(fd, POLLOUT, deadline, nullptr);
    // MSG_NOSIGNAL: a closed peer is an error here, never SIGPIPE.
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) throw IoError(std::string("send: ") + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

void recv_exact(int fd, char* out, size_t size, Clock::time_point deadline,
                const std::atomic<bool>* stop) {
  size_t done = 0;
  while (done < size) {
    wait_fd(fd, POLLIN, deadline, stop);
    const ssize_t n = ::recv(fd, out + done, size - done, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n == 0) throw IoError("connection closed");
    if (n < 0) throw IoError(std::string("recv: ") + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

}  // namespace

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

std::string numeric_host(const sockaddr* a, socklen_t len) {
  char host[NI_MAXHOST];
  if (getnameinfo(a, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return host;
}

std::vector<std::pair<sockaddr_storage, socklen_t>> resolve(const std::string& where,
                                                            const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0)
    throw BackendError("tcp store " + where + ": cannot resolve host '" + host +
                       "': " + gai_strerror(rc));
  std::vector<std::pair<sockaddr_storage, socklen_t>> out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    sockaddr_storage s{};
    std::memcpy(&s, a->ai_addr, a->ai_addrlen);
    out.emplace_back(s, a->ai_addrlen);
  }
  freeaddrinfo(found);
  return out;
}

void wait_fd(int fd, short events, Clock::time_point deadline, const std::atomic<bool>* stop) {
  for (;;) {
    if (stop != nullptr && stop->load()) throw IoError("aborted");
    if (Clock::now() >= deadline) throw IoTimeout("timed out");
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r < 0 && errno != EINTR) throw IoError(std::strerror(errno));
    if (r > 0) return;
  }
}

void send_message(int fd, const Message& m, Clock::time_point deadline) {
  send_all(fd, encode(m), deadline);
}

Message recv_message(int fd, Clock::time_point deadline, size_t max,
                     const std::atomic<bool>* stop) {
  char head[4];
  recv_exact(fd, head, 4, deadline, stop);
  const uint32_t size = get_u32(head);
  if (size == 0 || size > max)
    throw IoError("malformed frame of " + std::to_string(size) + " bytes");
  std::string body(size, '\0');
  recv_exact(fd, body.data(), size, deadline, stop);
  auto m = decode(body);
  if (!m) throw IoError("malformed frame");
  return std::move(*m);
}

}  // namespace tcp

std::string socket_local_address(int fd) {
  sockaddr_storage s{};
  socklen_t len = sizeof(s);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0) return "127.0.0.1";
  std::string h = tcp::numeric_host(reinterpret_cast<sockaddr*>(&s), len);
  return h.empty() ? "127.0.0.1" : h;
}

}  // namespace commgrid::bootstrap
