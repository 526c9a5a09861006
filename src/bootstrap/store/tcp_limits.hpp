// What a tcp:// store's server may hold: connections (configured, and bounded by the
// process's descriptor limit) and bytes. Each limit carries where it came from, which a
// refused rank is told.
#pragma once

#include <cstddef>
#include <string>

#include "commgrid/store.hpp"

namespace commgrid::bootstrap::tcp {

/// A limit and where it came from, as a refused rank is told.
struct Limit {
  std::size_t value = 0;
  std::string source;
};

/// The connections the server may hold: StoreOptions::max_connections, else
/// COMMGRID_STORE_MAX_CONNECTIONS, else no limit of its own (SIZE_MAX).
[[nodiscard]] Limit connection_limit(const StoreOptions& options);

/// The bytes the server may hold: StoreOptions::max_bytes, else COMMGRID_STORE_MAX_BYTES,
/// else a quarter of this machine's memory, at most 16 GiB.
[[nodiscard]] Limit byte_limit(const StoreOptions& options);

/// The connections this process may hold: `configured`, or fewer when its descriptor limit
/// is lower (less a reserve for its other uses: Gloo's pairs, files, the reserve
/// descriptor). Read at each connection: a program may raise its limit meanwhile.
[[nodiscard]] Limit connection_cap(const Limit& configured);

/// The connections without proof the server holds at most when it may hold `cap` in all
/// and the job has `world_size` ranks (0: unknown): a quarter of what the ranks leave, at
/// least 4 and at most 4096. Beyond it the one waiting longest for its proof is closed, so
/// that strangers never hold more than a part of the server's descriptors: the rest is the
/// job's ranks' and the process's own (Gloo's pairs).
[[nodiscard]] std::size_t pending_limit(std::size_t cap, Rank world_size);

/// Raises this process's soft descriptor limit to its hard limit (once the server starts:
/// each rank holds a connection). Nothing happens when it cannot be raised.
void raise_descriptor_limit();

/// This process's soft descriptor limit (0 when it cannot be read).
[[nodiscard]] std::size_t open_descriptor_limit();

}  // namespace commgrid::bootstrap::tcp
