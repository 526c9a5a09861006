// The tcp:// rendezvous store: served by one process (rank 0, at MASTER_ADDR:MASTER_PORT),
// the others connect; every connection proves the job's token before any request.
#pragma once

#include <memory>
#include <string>

#include "commgrid/store.hpp"

namespace commgrid::bootstrap {

/// Serves (options.serve) or connects to the TCP store at host:port for options.job_id.
/// Throws JobConflictError when the port serves another job (or is taken), AuthenticationError
/// when the token is not proven, TimeoutError when no server answers within options.timeout.
std::shared_ptr<Store> make_tcp_store(const std::string& host, int port,
                                      const StoreOptions& options);

/// The numeric local address of a connected socket ("127.0.0.1", "10.0.0.5"), or
/// "127.0.0.1" when it cannot be read.
std::string socket_local_address(int fd);

/// Largest key and value the TCP store accepts (a larger request is refused with an error).
inline constexpr size_t kTcpStoreMaxKey = 4096;
inline constexpr size_t kTcpStoreMaxValue = 1 << 20;

}  // namespace commgrid::bootstrap
