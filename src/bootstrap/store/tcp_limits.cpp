// The tcp:// server's limits (tcp_limits.hpp).
#include "tcp_limits.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "commgrid/launch_env.hpp"

namespace commgrid::bootstrap::tcp {

Limit connection_limit(const StoreOptions& o) {
  if (o.max_connections > 0) return {o.max_connections, "StoreOptions::max_connections"};
  if (auto v = read_launch_env().store_max_connections)
    return {*v, "COMMGRID_STORE_MAX_CONNECTIONS=" + std::to_string(*v)};
  return {SIZE_MAX, ""};  // the descriptor limit alone
}

Limit byte_limit(const StoreOptions& o) {
  if (o.max_bytes > 0) return {o.max_bytes, "StoreOptions::max_bytes"};
  if (auto v = read_launch_env().store_max_bytes)
    return {*v, "COMMGRID_STORE_MAX_BYTES=" + std::to_string(*v)};
  constexpr size_t kCeiling = size_t{16} << 30;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const size_t quarter =
      pages > 0 && page > 0 ? static_cast<size_t>(pages) / 4 * static_cast<size_t>(page) : kCeiling;
  return {std::min(kCeiling, quarter),
          "the default, a quarter of the memory of this machine and at most 16 GiB "
          "(COMMGRID_STORE_MAX_BYTES sets it)"};
}

// The connections this process may hold: the configured limit, or fewer when its descriptor
// limit is lower (less a reserve for its other uses: Gloo's pairs, files, the reserve
// descriptor below). Read at each connection: a program may raise its limit meanwhile.
Limit connection_cap(const Limit& configured) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return configured;
  const size_t soft = static_cast<size_t>(rl.rlim_cur);
  const size_t reserve = std::clamp<size_t>(soft / 8, 16, 256);
  const size_t fd_cap = soft > reserve ? soft - reserve : 1;
  if (configured.value <= fd_cap) return configured;
  return {fd_cap, "the descriptor limit of the serving process (ulimit -n " + std::to_string(soft) +
                      ", of which " + std::to_string(reserve) +
                      " are kept for its other uses): raise it on the machine of rank 0"};
}

size_t pending_limit(size_t cap, Rank world_size) {
  constexpr size_t kMaxPending = 4096, kMinPending = 4;
  const size_t ranks = world_size > 0 ? static_cast<size_t>(world_size) : 0;
  const size_t left = cap > ranks ? cap - ranks : 0;
  return std::clamp<size_t>(left / 4, kMinPending, kMaxPending);
}

void raise_descriptor_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  rl.rlim_cur = rl.rlim_max;
  (void)::setrlimit(RLIMIT_NOFILE, &rl);
}

size_t open_descriptor_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  return static_cast<size_t>(rl.rlim_cur);
}

}  // namespace commgrid::bootstrap::tcp
