// A loopback TCP port for a test's store or server to bind a moment later.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>

namespace commgrid::test {

/// A loopback port that is free now, chosen at random below the kernel's ephemeral range
/// (ip_local_port_range). A port from that range, freed and handed to a test, races with
/// every socket the kernel numbers meanwhile (each Gloo pair listens on one), and under a
/// parallel ctest another test's listener could take it before the test binds it.
inline int free_port() {
  int low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  const int first = 10000, last = std::max(first + 1000, low - 1);
  std::mt19937 pick(std::random_device{}());
  std::uniform_int_distribution<int> in(first, last);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = in(pick);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    ::close(fd);
    if (free) return port;
  }
  return 0;  // binds then fail, naming port 0
}

}  // namespace commgrid::test
