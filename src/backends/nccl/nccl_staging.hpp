// Host memory on an NCCL communicator: staging memory that never waits for the device (the
// pinned host cache, per-device caches and per-communicator memory pools), and Staging, which
// copies an operation's host buffers to the device and back. Private to the backend.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "commgrid/nccl.hpp"
#include "nccl_host.hpp"

namespace commgrid::nccl_backend {

using State = NcclCommunicator::State;

// ---- memory that does not wait for the device --------------------------------------------
//
// cudaFree and cudaFreeHost synchronize the device: they would wait, without any timeout,
// for every pending operation of every communicator on it (a pipeline receive whose peer is
// late, a group that hangs). So staging memory is never freed to CUDA with them while the
// process runs. Device blocks come from each communicator's own memory pool, allocated and
// freed in stream order (cudaMallocFromPoolAsync, cudaFreeAsync); the pool keeps what was
// freed (release threshold: everything) and never makes one stream's allocation wait for
// another's pending free (no internal dependencies), which the device's default pool,
// shared by every communicator, may do. On devices without memory pools, device blocks
// come from a per-device cache that a host function queued on the stream refills. Pinned
// host blocks come from a process-wide cache. Both caches are seeded when a communicator is
// made; only a miss (a size or a number of pending operations beyond the seed) allocates
// while operations may be pending, and cudaHostAlloc and cudaMalloc may then synchronize.

/// The process-wide cache of pinned host blocks (never destroyed).
nccl_host::BlockCache& pinned_cache();
/// The cache of device blocks of `device`, for devices without memory pools.
nccl_host::BlockCache& device_cache(int device);

// What each communicator adds to the caches while it lives: enough blocks for a few small
// host-staged operations pending at once (ProcessGroups' fingerprints, verify's checks, the
// per-group strategy's allgather of 344 bytes per rank fits 64 KiB up to 189 ranks).
inline constexpr nccl_host::Seed kStagingSeed[] = {{4096, 4}, {65536, 1}};

/// Whether `device` has stream-ordered memory pools.
bool has_memory_pools(int device);
/// Makers of pinned host and device blocks; errors are BackendError naming `op` and `group`.
nccl_host::BlockCache::Make make_pinned(const std::string& op, const std::string& group);
nccl_host::BlockCache::Make make_device(const std::string& op, const std::string& group);

// A memory pool of `device` of its own: what is freed stays in it, and an allocation never
// waits for another stream's pending free.
cudaMemPool_t make_pool(int device, const std::string& group);

// Device memory for work queued on `stream`, usable by that work at once: from `pool`, or
// (nullptr: a device without pools) from the device's cache (then `cls` is the block's).
nccl_host::BlockCache::Block device_alloc(std::size_t bytes, cudaStream_t stream,
                                          cudaMemPool_t pool, int device, const std::string& op,
                                          const std::string& group);

// Frees a device block after the work queued on `stream` so far. On failure the block is
// lost rather than freed early.
void device_free(nccl_host::BlockCache::Block b, cudaStream_t stream, bool pooled,
                 int device) noexcept;

// ---- buffers: device memory in place, host memory staged ----------------------------

// The buffers of one operation. Host buffers get a place in one pinned host block and one
// device block: inputs are copied into the pinned block on the host before the call
// returns (so the caller may reuse them at once, pinned or not), then to the device on the
// operation's stream; outputs come back to the pinned block on the stream, after the
// operation, and reach the caller's memory on the host once the operation's event
// completed. No copy here waits for the device: every copy between host and device is from
// or to pinned memory on the operation's stream, and the device block is allocated and
// freed in the stream's order. Only a pinned block that the cache cannot give (a miss:
// cudaHostAlloc) may synchronize (see "memory that does not wait" above).
class Staging {
 public:
  Staging() = default;
  Staging(Staging&& o) noexcept { *this = std::move(o); }
  Staging& operator=(Staging&& o) noexcept;
  ~Staging() { release(); }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  void in(const void* p, std::size_t bytes, const char* what) { add(p, bytes, true, false, what); }
  void out(void* p, std::size_t bytes, const char* what) { add(p, bytes, false, true, what); }
  void inout(void* p, std::size_t bytes, const char* what) { add(p, bytes, true, true, what); }
  /// Device memory of the operation's own, zeroed (the barrier's one int).
  void scratch(std::size_t bytes) { scratch_bytes_ = bytes; }

  /// Before the operation: finds where each buffer is (ConfigError for another device's
  /// memory), copies host inputs into the pinned block and enqueues their copy to the device.
  void stage(const State& s, cudaStream_t stream, const std::string& op);

  /// The pointer to hand NCCL for a registered buffer (itself unless staged).
  template <class T>
  T* dev(T* p) const {
    for (const Slot& s : slots_)
      if (s.user == p && s.host) return static_cast<T*>(device_at(s));
    return p;
  }
  [[nodiscard]] void* scratch_ptr() const {
    return static_cast<char*>(device_.ptr) + scratch_offset_;
  }

  /// After the operation was enqueued: enqueues the copies of host outputs to the pinned block
  /// and the release of the device block, behind the operation on its stream.
  void unstage(const std::string& op, const std::string& group);

  /// Once the operation's event completed: copies host outputs to the caller's memory (host
  /// to host: never waits for the device) and returns the pinned block to the cache.
  void finish() noexcept;

 private:
  struct Slot {
    const void* user = nullptr;
    std::size_t bytes = 0;
    bool in = false, out = false, host = false;
    std::size_t offset = 0;
    const char* what = "";
  };

  static std::size_t round_up(std::size_t n) { return (n + 255) / 256 * 256; }

  void add(const void* p, std::size_t bytes, bool in, bool out, const char* what);

  [[nodiscard]] void* pinned_at(const Slot& s) const {
    return static_cast<char*>(pinned_.ptr) + s.offset;
  }
  [[nodiscard]] void* device_at(const Slot& s) const {
    return static_cast<char*>(device_.ptr) + s.offset;
  }

  // The operation was not enqueued (its device block is freed behind what was queued), or it
  // did not complete: copies still queued may read or write the pinned block, so it is
  // never reused (a few bytes of control data per failed operation).
  void release() noexcept;

  std::vector<Slot> slots_;
  std::size_t scratch_bytes_ = 0, scratch_offset_ = 0;
  nccl_host::BlockCache::Block pinned_;
  bool pinned_in_flight_ = false;
  nccl_host::BlockCache::Block device_;  // cls: only for a device without pools
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  int device_id_ = 0;
};

}  // namespace commgrid::nccl_backend
