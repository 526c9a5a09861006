// Ends a torch collective blocked in a failed epoch at once, on every process that launch
// told, instead of one process after another along the ring.
//
// A torch Gloo collective blocked on a live peer (which is itself blocked on the dead one)
// ends only when that peer's connection closes, and a process closes its torch groups'
// connections only once its own collective failed and it aborted them: the failure travels
// from the dead process's neighbours along the ring, an abort (0.05-0.15 s) per hop.
// `commgrid launch --spares` sees a child die at once; after posting the death it sends
// every other process it runs SIGURG with the failed epoch as the signal's value
// (sigqueue). The handler installed here shuts down (shutdown(2), both directions; the
// descriptors stay open, still owned by torch) the sockets of the epoch's torch groups when
// the value is the epoch they were armed with: every collective blocked in the epoch fails
// at once on this process and on its peers, which see the connections end.
//
// SIGURG's default action is to ignore it, so processes that arm nothing (C++ programs,
// spares) are unaffected; a signal for another epoch is ignored. disarm() returns only once
// no handler is acting on the armed descriptors, so torch may close them afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace commgrid::python {

/// Installs the handler (once per process) and arms `fds`, the sockets of `epoch`'s torch
/// groups, replacing what was armed. At most 4096 descriptors; more is std::invalid_argument.
void arm_epoch_sockets(std::int64_t epoch, const std::vector<int>& fds);

/// Nothing armed from now on; waits out a handler that is acting.
void disarm_epoch_sockets();

/// Shuts the armed sockets down now (this process leaves the epoch: its peers' collectives
/// with it fail at once, without waiting for torch's abort to close them), then disarms.
/// Returns how many there were.
std::size_t end_epoch_sockets();

/// How many times the handler shut the armed sockets down (for tests).
[[nodiscard]] std::int64_t epoch_sockets_ended();

}  // namespace commgrid::python
