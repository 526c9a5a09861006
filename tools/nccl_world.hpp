// The NCCL world of `verify --backend nccl` and `bench ... --backend nccl`: one GPU per
// rank, over whichever bootstrap world the runner started (Gloo or MPI).
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "commgrid/communicator.hpp"

namespace commgrid::cli {

/// RunnerOptions::device_world for NCCL: make_nccl_world over the bootstrap world, with
/// `timeout` for every call (the device is the rank's local rank, as NcclOptions says).
std::function<std::unique_ptr<Communicator>(Communicator& boot)> nccl_device_world(
    std::chrono::milliseconds timeout);

}  // namespace commgrid::cli
