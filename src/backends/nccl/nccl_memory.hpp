// The NCCL backend's view of memory that the tests check directly: what a buffer is, and the
// process-wide cache of pinned staging blocks.
#pragma once

#include <string>

#include "nccl_host.hpp"

namespace commgrid::nccl_backend {

/// What CUDA says `p` is (cudaPointerGetAttributes; since CUDA 11 it answers for any
/// pointer, unregistered host memory included), and for device memory its device in
/// `*device`. Any error is BackendError "nccl <op> on <group>: cudaPointerGetAttributes:
/// <CUDA's text>": a buffer CUDA cannot place is never guessed to be host memory (whose
/// staging would memcpy from a device pointer).
nccl_host::MemoryKind memory_kind(const void* p, int* device, const std::string& op,
                                  const std::string& group);

/// The pinned host blocks that stage host buffers, shared by every communicator of the
/// process (tests read how many were made and when).
const nccl_host::BlockCache& staging_pinned_cache();

}  // namespace commgrid::nccl_backend
