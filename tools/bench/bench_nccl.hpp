// `commgrid bench collectives --backend nccl`: the reference side, NCCL called directly on
// the NCCL world's own communicator and stream, on device buffers.
#pragma once

#include <chrono>
#include <memory>

#include "bench/bench_runtime.hpp"
#include "commgrid/nccl.hpp"

namespace commgrid::bench {

/// Raw NCCL on `world` (ncclAllReduce, ncclAllGather, ncclSend/ncclRecv, grouped where
/// commgrid groups), each call followed by a CUDA event polled until it completes, as
/// commgrid's Work::wait() does (bounded by `timeout`: TimeoutError, the world aborted).
/// Buffers are device memory of the world's device. `world` outlives the result.
[[nodiscard]] std::unique_ptr<DirectCollectives> make_nccl_direct(
    NcclCommunicator& world, std::chrono::milliseconds timeout);

}  // namespace commgrid::bench
