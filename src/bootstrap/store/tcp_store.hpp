// The tcp:// rendezvous store: served by one process (rank 0, at MASTER_ADDR:MASTER_PORT, or
// commgrid launch with --spares), the others connect; every connection proves the job's
// token before any request. Its parts: tcp_wire (frames), tcp_io (sockets and the client's
// bounded I/O), tcp_auth (challenge and proof), tcp_limits (what the server holds),
// tcp_server (the event loop) and tcp_client (the Store).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "commgrid/store.hpp"

namespace commgrid::bootstrap {

/// Serves (options.serve) or connects to the TCP store at host:port for options.job_id.
/// Throws JobConflictError when the port serves another job (or is taken), AuthenticationError
/// when the token is not proven, TimeoutError when no server answers within options.timeout,
/// BackendError naming the server's limit when it refused this rank for the whole timeout.
[[nodiscard]] std::shared_ptr<Store> make_tcp_store(const std::string& host, int port,
                                                    const StoreOptions& options);

/// Largest key and value the TCP store accepts (a larger request is refused with an error).
/// A Gloo world's address blob is about 136 bytes per rank: 64 MiB holds 10^5 ranks' worth.
inline constexpr std::size_t kTcpStoreMaxKey = 4096;
inline constexpr std::size_t kTcpStoreMaxValue = std::size_t{64} << 20;
/// What the TCP store counts for a key on top of its key and value bytes: the hash table's
/// node, bucket and string headers and the allocator's own (about 104 bytes measured with
/// glibc for short keys; 128 keeps the count above what is resident).
inline constexpr std::size_t kTcpStoreKeyOverhead = 128;
/// The most keys and bytes one wait request carries (a census of 10^5 ranks names 10^5 keys
/// of about 50 bytes). The client splits a longer wait into several; the server refuses a
/// larger one, naming the limit, before it reads it.
inline constexpr std::size_t kTcpStoreMaxWaitKeys = std::size_t{1} << 18;
inline constexpr std::size_t kTcpStoreMaxWaitBytes = std::size_t{16} << 20;

}  // namespace commgrid::bootstrap
