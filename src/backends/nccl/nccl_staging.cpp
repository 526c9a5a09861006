// Host memory on an NCCL communicator: the staging caches and pools, and Staging, which
// moves an operation's host buffers through pinned and device blocks.
#include "nccl_staging.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include "nccl_cuda.hpp"
#include "nccl_memory.hpp"
#include "nccl_state.hpp"

namespace commgrid::nccl_backend {

// Never destroyed: a host function queued on a stream may still give a block back while the
// process exits.
nccl_host::BlockCache& pinned_cache() {
  static auto* cache = new nccl_host::BlockCache;
  return *cache;
}

nccl_host::BlockCache& device_cache(int device) {
  static auto* mutex = new std::mutex;
  static auto* caches = new std::map<int, nccl_host::BlockCache*>;
  std::lock_guard lock(*mutex);
  nccl_host::BlockCache*& c = (*caches)[device];
  if (c == nullptr) c = new nccl_host::BlockCache;
  return *c;
}

namespace {

struct GiveBack {
  nccl_host::BlockCache* cache;
  void* block;
  std::size_t cls;
};

// A host function queued after the last use of a device block: the block is free once the
// stream reached it. It makes no CUDA call (CUDA forbids that in host functions).
void CUDART_CB give_back(void* arg) {
  const auto* g = static_cast<GiveBack*>(arg);
  g->cache->give(g->block, g->cls);
  delete g;
}

}  // namespace

bool has_memory_pools(int device) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return v != 0;
}

nccl_host::BlockCache::Make make_pinned(const std::string& op, const std::string& group) {
  return [op, group](std::size_t bytes) {
    void* p = nullptr;
    check_cuda(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), op, group, "cudaHostAlloc");
    return p;
  };
}

nccl_host::BlockCache::Make make_device(const std::string& op, const std::string& group) {
  return [op, group](std::size_t bytes) {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), op, group, "cudaMalloc");
    return p;
  };
}

// A memory pool of `device` of its own: what is freed stays in it, and an allocation never
// waits for another stream's pending free.
cudaMemPool_t make_pool(int device, const std::string& group) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  check_cuda(cudaMemPoolCreate(&pool, &props), "create", group, "cudaMemPoolCreate");
  int no = 0;
  std::uint64_t keep = UINT64_MAX;
  cudaError_t e = cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &no);
  if (e == cudaSuccess) e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  if (e != cudaSuccess) {
    (void)cudaMemPoolDestroy(pool);
    check_cuda(e, "create", group, "cudaMemPoolSetAttribute");
  }
  return pool;
}

// Device memory for work queued on `stream`, usable by that work at once: from `pool`, or
// (nullptr: a device without pools) from the device's cache (then `cls` is the block's).
nccl_host::BlockCache::Block device_alloc(std::size_t bytes, cudaStream_t stream,
                                          cudaMemPool_t pool, int device, const std::string& op,
                                          const std::string& group) {
  if (pool != nullptr) {
    void* p = nullptr;
    check_cuda(cudaMallocFromPoolAsync(&p, bytes, pool, stream), op, group,
               "cudaMallocFromPoolAsync");
    return {p, 0};
  }
  return device_cache(device).take_or_make(nccl_host::size_class(bytes), make_device(op, group));
}

// Frees a device block after the work queued on `stream` so far. On failure the block is
// lost rather than freed early.
void device_free(nccl_host::BlockCache::Block b, cudaStream_t stream, bool pooled,
                 int device) noexcept {
  if (pooled) {
    (void)cudaFreeAsync(b.ptr, stream);
  } else {
    auto* g = new (std::nothrow) GiveBack{&device_cache(device), b.ptr, b.cls};
    if (g == nullptr || cudaLaunchHostFunc(stream, &give_back, g) != cudaSuccess) {
      delete g;
      device_cache(device).lose(b.cls);
    }
  }
  (void)cudaGetLastError();
}

// ---- Staging ----------------------------------------------------------------------------

Staging& Staging::operator=(Staging&& o) noexcept {
  release();
  slots_ = std::move(o.slots_);
  scratch_bytes_ = o.scratch_bytes_;
  scratch_offset_ = o.scratch_offset_;
  pinned_ = std::exchange(o.pinned_, {});
  pinned_in_flight_ = o.pinned_in_flight_;
  device_ = std::exchange(o.device_, {});
  stream_ = o.stream_;
  pool_ = o.pool_;
  device_id_ = o.device_id_;
  return *this;
}

void Staging::stage(const State& s, cudaStream_t stream, const std::string& op) {
  stream_ = stream;
  pool_ = s.pool;
  device_id_ = s.device;
  std::size_t host_total = 0;
  for (Slot& slot : slots_) {
    int dev = -1;
    const nccl_host::MemoryKind kind = nccl_backend::memory_kind(slot.user, &dev, op, s.name);
    slot.host = !nccl_host::use_in_place(kind, dev, s.device, op, s.name, slot.what);
    if (!slot.host) continue;
    slot.offset = host_total;
    host_total += round_up(slot.bytes);
  }
  scratch_offset_ = host_total;
  const std::size_t total = host_total + round_up(scratch_bytes_);
  if (total == 0) return;
  if (host_total > 0) {
    pinned_ =
        pinned_cache().take_or_make(nccl_host::size_class(host_total), make_pinned(op, s.name));
    for (const Slot& slot : slots_)
      if (slot.host && slot.in) std::memcpy(pinned_at(slot), slot.user, slot.bytes);
  }
  device_ = device_alloc(total, stream, pool_, device_id_, op, s.name);
  if (scratch_bytes_ > 0)
    check_cuda(cudaMemsetAsync(static_cast<char*>(device_.ptr) + scratch_offset_, 0, scratch_bytes_,
                               stream),
               op, s.name, "cudaMemsetAsync");
  for (const Slot& slot : slots_) {
    if (!slot.host || !slot.in) continue;
    pinned_in_flight_ = true;
    check_cuda(cudaMemcpyAsync(device_at(slot), pinned_at(slot), slot.bytes, cudaMemcpyHostToDevice,
                               stream),
               op, s.name, "cudaMemcpyAsync to the device");
  }
}

void Staging::unstage(const std::string& op, const std::string& group) {
  if (device_.ptr == nullptr) return;
  for (const Slot& slot : slots_) {
    if (!slot.host || !slot.out) continue;
    pinned_in_flight_ = true;
    check_cuda(cudaMemcpyAsync(pinned_at(slot), device_at(slot), slot.bytes, cudaMemcpyDeviceToHost,
                               stream_),
               op, group, "cudaMemcpyAsync to the host");
  }
  device_free(std::exchange(device_, {}), stream_, pool_ != nullptr, device_id_);
}

void Staging::finish() noexcept {
  if (pinned_.ptr == nullptr) return;
  for (const Slot& slot : slots_)
    if (slot.host && slot.out)
      std::memcpy(const_cast<void*>(slot.user), pinned_at(slot), slot.bytes);
  const nccl_host::BlockCache::Block b = std::exchange(pinned_, {});
  pinned_cache().give(b.ptr, b.cls);
}

void Staging::add(const void* p, std::size_t bytes, bool in, bool out, const char* what) {
  if (p == nullptr || bytes == 0) return;
  for (Slot& s : slots_) {
    if (s.user == p) {  // in place: one staged copy serves both
      s.bytes = std::max(s.bytes, bytes);
      s.in = s.in || in;
      s.out = s.out || out;
      return;
    }
  }
  slots_.push_back({p, bytes, in, out, false, 0, what});
}

void Staging::release() noexcept {
  if (device_.ptr != nullptr)
    device_free(std::exchange(device_, {}), stream_, pool_ != nullptr, device_id_);
  if (pinned_.ptr == nullptr) return;
  if (pinned_in_flight_) pinned_cache().lose(pinned_.cls);
  else pinned_cache().give(pinned_.ptr, pinned_.cls);
  pinned_ = {};
}

// ---- memory, as the tests see it ---------------------------------------------------------

nccl_host::MemoryKind memory_kind(const void* p, int* device, const std::string& op,
                                  const std::string& group) {
  cudaPointerAttributes a{};
  check_cuda(cudaPointerGetAttributes(&a, p), op, group, "cudaPointerGetAttributes");
  *device = a.device;
  switch (a.type) {
    case cudaMemoryTypeDevice: return nccl_host::MemoryKind::device;
    case cudaMemoryTypeManaged: return nccl_host::MemoryKind::managed;
    case cudaMemoryTypeHost: return nccl_host::MemoryKind::pinned_host;
    case cudaMemoryTypeUnregistered: return nccl_host::MemoryKind::host;
  }
  throw BackendError("nccl " + op + " on " + group +
                     ": cudaPointerGetAttributes: unknown memory type " +
                     std::to_string(static_cast<int>(a.type)));
}

const nccl_host::BlockCache& staging_pinned_cache() { return pinned_cache(); }

}  // namespace commgrid::nccl_backend
