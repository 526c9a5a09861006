// `commgrid bench collectives --backend gloo`: the reference side, Gloo's own algorithms on
// a plain Gloo context beside the commgrid world, over the same TCP transport. The raw Gloo
// headers stay in bench_gloo.cpp.
#pragma once

#include <chrono>
#include <memory>

#include "bench/bench_runtime.hpp"

namespace commgrid::bench {

/// Where the direct contexts of one process's rank-threads meet (an in-memory store).
class GlooDirectHub;

/// A hub for the rank-threads of one run; every rank's make_gloo_direct takes the same one.
[[nodiscard]] std::shared_ptr<GlooDirectHub> make_gloo_direct_hub();

/// Raw Gloo (gloo::allreduce, gloo::allgather, gloo::alltoallv, unbound buffers) for rank
/// `rank` of `size`; the full-mesh context connects on first use, through `hub`, on
/// loopback. `hub` outlives the result.
[[nodiscard]] std::unique_ptr<DirectCollectives> make_gloo_direct(
    GlooDirectHub& hub, int rank, int size, std::chrono::milliseconds timeout);

}  // namespace commgrid::bench
