// Ranks as threads over Gloo: a whole job in one process, no launcher. Link commgrid::gloo.
#pragma once

#include <functional>

#include "commgrid/communicator.hpp"
#include "commgrid/gloo.hpp"
#include "commgrid/rank_threads.hpp"

namespace commgrid {

/// Runs `fn(world)` on `size` ranks, each a thread of this process with its own Gloo world
/// over one in-memory store (run_rank_threads_collect with make_gloo_world), and returns
/// when every thread has ended. `options` are every rank's world options; the runner sets
/// their store, rank and size, which must be unset (InvalidValueError naming them). When a
/// rank throws, the store is aborted and that rank's communicators are closed, so the other
/// ranks fail promptly (or by options.timeout) instead of hanging. Throws InvalidValueError
/// ("ranks") for size < 1 or above 2^31 - 1.
[[nodiscard]] LocalRunResult run_local_ranks_collect(
    Rank size, const std::function<void(Communicator& world)>& fn, const GlooOptions& options = {});

/// As run_local_ranks_collect, but throws RankFailedError naming the first real failure.
void run_local_ranks(Rank size, const std::function<void(Communicator& world)>& fn,
                     const GlooOptions& options = {});

}  // namespace commgrid
