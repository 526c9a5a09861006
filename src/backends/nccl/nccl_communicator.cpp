// The NCCL backend: every Communicator method on an NCCL communicator, with nonblocking
// creation and Work that polls a CUDA event and NCCL's asynchronous error against a timeout.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>

#include "commgrid/nccl.hpp"
#include "engine_int.hpp"
#include "fingerprint.hpp"
#include "nccl_host.hpp"
#include "nccl_memory.hpp"
#include "nccl_types.hpp"

namespace commgrid {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;
using nccl_host::members_text;
using nccl_host::timeout_message;

namespace {

std::string cuda_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// Throws BackendError "nccl <op> on <group>: <call>: <CUDA's text>"; clears CUDA's sticky
// last error so that a later call does not report this one again.
void check_cuda(cudaError_t e, const std::string& op, const std::string& group, const char* call) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  throw BackendError("nccl " + op + " on " + group + ": " + call + ": " + cuda_text(e));
}

// Makes `device` current for one call and restores the caller's device afterwards, so that
// a communicator's calls never change which device the calling thread works on.
class DeviceGuard {
 public:
  DeviceGuard(int device, const std::string& op, const std::string& group) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) check_cuda(cudaSetDevice(device), op, group, "cudaSetDevice");
    device_ = device;
  }
  /// For destructors and noexcept paths: errors are ignored.
  explicit DeviceGuard(int device) noexcept : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
    (void)cudaGetLastError();
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != device_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int device_ = -1;
};

// NCCL's name of `rc` and its last error message. ncclGetLastError ignores its communicator
// argument (NCCL 2.28 returns one process-wide text), so no communicator is passed: the one
// that failed may be gone.
std::string nccl_text(ncclResult_t rc) {
  std::string s = ncclGetErrorString(rc);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') s += " (" + std::string(last) + ")";
  return s;
}

// Polling starts by yielding (small operations end in microseconds) and settles at 1 ms
// sleeps, so that a long wait costs little CPU.
class Backoff {
 public:
  void pause() {
    if (n_ < 200) {
      ++n_;
      std::this_thread::yield();
      return;
    }
    const int us = std::min(1000, 20 * (n_++ - 199));
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }

 private:
  int n_ = 0;
};

// NCCL's asynchronous state of a communicator: ncclInProgress while a nonblocking call or
// creation is under way, then its result.
ncclResult_t async_state_of(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
  return rc != ncclSuccess ? rc : state;
}

struct Settled {
  ncclResult_t rc = ncclSuccess;  // ncclInProgress: the deadline passed first
  bool aborted = false;           // the communicator was aborted while waiting
};

// Waits while `look()` (an asynchronous state; nullopt once the communicator is aborted)
// says ncclInProgress, until the deadline.
template <class Look>
Settled settle(Look&& look, Clock::time_point deadline) {
  Backoff backoff;
  for (;;) {
    const std::optional<ncclResult_t> state = look();
    if (!state) return {ncclInvalidUsage, true};
    if (*state != ncclInProgress) return {*state, false};
    if (Clock::now() >= deadline) return {ncclInProgress, false};
    backoff.pause();
  }
}

// For a communicator that no other thread can reach yet (one being created).
Settled settle_own(ncclComm_t comm, Clock::time_point deadline) {
  return settle([comm]() -> std::optional<ncclResult_t> { return async_state_of(comm); }, deadline);
}

// An NCCL communicator owned until it is handed on (to a State): aborted, on its device,
// unless released. Every creation returns one, so that no way out between NCCL's creation
// and the State that keeps the communicator leaks it.
struct CommAborter {
  int device = -1;
  void operator()(ncclComm* comm) const noexcept {
    const DeviceGuard guard(device);
    (void)ncclCommAbort(comm);
  }
};
using OwnedComm = std::unique_ptr<ncclComm, CommAborter>;

// Runs `f` when the scope is left, unless dismissed.
template <class F>
class OnExit {
 public:
  explicit OnExit(F f) : f_(std::move(f)) {}
  ~OnExit() {
    if (armed_) f_();
  }
  OnExit(const OnExit&) = delete;
  OnExit& operator=(const OnExit&) = delete;
  void dismiss() noexcept { armed_ = false; }

 private:
  F f_;
  bool armed_ = true;
};

nccl_host::UniqueId make_unique_id() {
  ncclUniqueId id;
  const ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc != ncclSuccess) throw BackendError("ncclGetUniqueId: " + nccl_text(rc));
  nccl_host::UniqueId out{};
  static_assert(sizeof(id.internal) == nccl_host::kUniqueIdBytes);
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf.data();
}

// Initializes one NCCL communicator from a unique id, nonblocking, polled until the
// deadline; on timeout aborts it and throws TimeoutError naming the group and members. The
// caller keeps `cfg` (its name) for as long as the returned communicator lives.
OwnedComm init_comm(int nranks, const nccl_host::UniqueId& id, int rank, int device,
                    const std::string& op, const std::string& parent,
                    const nccl_backend::CommConfig& cfg, Ms timeout,
                    const std::vector<std::int64_t>& members) {
  const std::string& name = *cfg.name;
  const DeviceGuard guard(device, op, parent);
  ncclConfig_t config = cfg.config;  // NCCL copies it, but keeps config.commName's pointer
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), id.size());
  const Clock::time_point deadline = Clock::now() + timeout;
  ncclComm_t raw = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&raw, nranks, uid, rank, &config);
  OwnedComm comm(raw, CommAborter{device});  // aborted on every way out but success
  if ((rc == ncclSuccess || rc == ncclInProgress) && comm) rc = settle_own(comm.get(), deadline).rc;
  if (rc == ncclSuccess && comm) return comm;
  const std::string target = parent == name ? "" : name;
  if (rc == ncclInProgress)
    throw TimeoutError(timeout_message(op, parent, target, timeout, name, members));
  throw BackendError("nccl " + op + " on " + parent + (target.empty() ? "" : " for " + target) +
                     ": " + nccl_text(rc) + " (members " + members_text(members) + ")");
}

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

// What each communicator adds to the caches while it lives: enough blocks for a few small
// host-staged operations pending at once (ProcessGroups' fingerprints, verify's checks, the
// per-group strategy's allgather of 344 bytes per rank fits 64 KiB up to 189 ranks).
constexpr nccl_host::Seed kStagingSeed[] = {{4096, 4}, {65536, 1}};

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

}  // namespace

// ---- shared state ---------------------------------------------------------------------

struct NcclCommunicator::State {
  std::string name;
  std::vector<std::int64_t> members;  // global ranks by group rank, for messages
  int device = 0;
  int rank = 0;
  int size = 0;
  Ms timeout{0};                      // bounds finalization in the destructor
  Communicator* bootstrap = nullptr;  // carries the unique ids of member-only groups
  // The bootstrap when the world owns it (make_nccl_world with a shared_ptr, a factory's,
  // a shrink's); every group made from the world holds it too.
  std::shared_ptr<Communicator> owned_bootstrap;
  // The world and the groups made from it, which abort_nccl_epoch aborts together.
  std::shared_ptr<nccl_host::EpochMembers<State>> epoch;
  // Device staging memory in stream order, of this communicator only; nullptr on a device
  // without memory pools (then device_cache(device)).
  cudaMemPool_t pool = nullptr;
  cudaStream_t own_stream = nullptr;
  cudaStream_t stream = nullptr;      // where operations go
  cudaEvent_t caller_done = nullptr;  // orders the own stream after the caller's work
  // The name NCCL was given (config.commName): NCCL keeps a pointer to it, so it lives as long
  // as the communicator (declared before comm_, it is destroyed after comm_).
  std::shared_ptr<const std::string> nccl_name;

  State(OwnedComm&& c, int dev, std::string group, Communicator* boot, Ms t,
        std::shared_ptr<const std::string> nccl_name_)
      : name(std::move(group)), device(dev), timeout(t), bootstrap(boot),
        nccl_name(std::move(nccl_name_)), comm_(std::move(c)) {
    try {
      const DeviceGuard guard(device, "create", name);
      const ncclComm_t comm = comm_.peek();
      ncclResult_t rc = ncclCommUserRank(comm, &rank);
      if (rc == ncclSuccess) rc = ncclCommCount(comm, &size);
      if (rc != ncclSuccess) throw BackendError("nccl create on " + name + ": " + nccl_text(rc));
      // A non-blocking stream: with a blocking one, every call on the legacy default stream
      // (a cudaMemcpy anywhere in the process) would wait for our pending operations, and a
      // pending pipeline receive would stall unrelated code without any timeout. Work the
      // caller queued on the legacy stream is still ordered before ours (order_after_caller).
      check_cuda(cudaStreamCreateWithFlags(&own_stream, cudaStreamNonBlocking), "create", name,
                 "cudaStreamCreateWithFlags");
      check_cuda(cudaEventCreateWithFlags(&caller_done, cudaEventDisableTiming), "create", name,
                 "cudaEventCreateWithFlags");
      stream = own_stream;
      // Staging memory made now, while nothing of this communicator is pending: CUDA lists
      // page-locked and device allocation among the calls that may synchronize.
      pinned_cache().attach(kStagingSeed, make_pinned("create", name));
      pinned_attached_ = true;
      if (has_memory_pools(device)) {
        pool = make_pool(device, name);
        warm_pool();
      } else {
        device_cache(device).attach(kStagingSeed, make_device("create", name));
        device_attached_ = true;
      }
    } catch (...) {
      comm_.abort("creation failed");
      release_memory();
      throw;
    }
  }

  ~State() {
    const DeviceGuard guard(device);
    if (const ncclComm_t c = comm_.release(); c != nullptr) {
      // Finalize flushes what is still queued; bounded by the timeout, then aborted.
      ncclResult_t rc = ncclCommFinalize(c);
      if (rc == ncclSuccess || rc == ncclInProgress) rc = settle_own(c, Clock::now() + timeout).rc;
      if (rc == ncclSuccess) (void)ncclCommDestroy(c);
      else (void)ncclCommAbort(c);
    }
    release_memory();
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  /// The NCCL communicator for a direct call; null once aborted.
  [[nodiscard]] ncclComm_t native() const noexcept { return comm_.peek(); }
  [[nodiscard]] bool is_aborted() const noexcept { return comm_.aborted(); }
  [[nodiscard]] std::string reason() const { return comm_.reason(); }
  /// Thread-safe; returns once the communicator is destroyed (whoever started the abort).
  void abort(const std::string& why) noexcept { comm_.abort(why); }
  /// The same; whether this call destroyed it (false: aborted before).
  bool abort_now(const std::string& why) noexcept { return comm_.abort(why); }
  /// Marks the communicator aborted (every other thread's call and look says so from now on)
  /// but keeps it for a last use through use_stopping() (a shrink); abort() destroys it.
  void stop(const std::string& why) noexcept { comm_.stop(why); }
  template <class F>
  auto use_stopping(F&& fn) {
    return comm_.use_stopping(std::forward<F>(fn));
  }

  /// fn(comm) while no abort can destroy comm; nullopt once aborted.
  template <class F>
  auto use(F&& fn) {
    return comm_.use(std::forward<F>(fn));
  }
  /// NCCL's asynchronous state; nullopt once aborted.
  std::optional<ncclResult_t> async_state() { return comm_.use(&async_state_of); }

  void check_usable(const std::string& op) const {
    if (is_aborted())
      throw BackendError("nccl " + op + " on " + name +
                         ": the communicator was aborted: " + reason());
  }

  /// An NCCL error from `op`: aborts the communicator and throws BackendError. No error is
  /// harmless here: on a nonblocking communicator NCCL records every error a call returns as
  /// the communicator's asynchronous error (argument errors too; NCCL 2.28 group.cc), after
  /// which the communicator only answers with that error. commgrid checks arguments before
  /// they reach NCCL, so an error here is NCCL's or the device's.
  [[noreturn]] void fail(const std::string& op, ncclResult_t rc) {
    const std::string msg = "nccl " + op + " on " + name + ": " + nccl_text(rc);
    abort(msg);
    throw BackendError(msg + "; communicator aborted");
  }

  /// Checks what an NCCL call returned (nullopt: the communicator was aborted before the
  /// call). A nonblocking communicator may answer ncclInProgress while it connects; the call
  /// is then polled until it has been enqueued, bounded by the operation's deadline
  /// (TimeoutError after aborting).
  void check_call(const std::string& op, std::optional<ncclResult_t> rc, Clock::time_point deadline,
                  Ms timeout_of_op) {
    if (!rc) check_usable(op);
    COMMGRID_ENFORCE(rc.has_value(), "nccl " + op + " on " + name + ": no communicator");
    if (*rc == ncclSuccess) return;
    if (*rc == ncclInProgress) {
      const Settled s = settle([this] { return async_state(); }, deadline);
      if (s.aborted) check_usable(op);
      if (s.rc == ncclSuccess) return;
      if (s.rc == ncclInProgress) {
        const std::string msg = timeout_message(op, name, "", timeout_of_op, name, members);
        abort(msg);
        throw TimeoutError(msg);
      }
      rc = s.rc;
    }
    fail(op, *rc);
  }

  /// Orders the next operation on the own stream after the work the calling thread queued on
  /// the legacy default stream, as a blocking stream would, without making later work on the
  /// legacy stream wait for ours. A stream the caller chose (set_stream) is the caller's to
  /// order.
  void order_after_caller(const std::string& op) {
    if (stream != own_stream) return;
    check_cuda(cudaEventRecord(caller_done, cudaStreamLegacy), op, name, "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream, caller_done, 0), op, name, "cudaStreamWaitEvent");
  }

  /// NCCL's asynchronous state without waiting for another thread's call: nullopt once
  /// aborted; {busy} while another thread holds the communicator.
  std::pair<nccl_host::TryUse, std::optional<ncclResult_t>> try_async_state() {
    return comm_.try_use(&async_state_of);
  }

 private:
  // Grows the pool by the seed's bytes now (allocated and freed on the own stream), so that
  // the first operations do not.
  void warm_pool() {
    std::size_t bytes = 0;
    for (const nccl_host::Seed& s : kStagingSeed) bytes += s.cls * s.per_user;
    void* p = nullptr;
    check_cuda(cudaMallocFromPoolAsync(&p, bytes, pool, own_stream), "create", name,
               "cudaMallocFromPoolAsync");
    check_cuda(cudaFreeAsync(p, own_stream), "create", name, "cudaFreeAsync");
  }

  // Nothing here waits: CUDA destroys the stream and the pool once the work queued on them
  // and the blocks still allocated from the pool are done (cudaStreamDestroy,
  // cudaMemPoolDestroy); the cached blocks stay for the next communicator.
  void release_memory() noexcept {
    if (caller_done != nullptr) (void)cudaEventDestroy(caller_done);
    if (own_stream != nullptr) (void)cudaStreamDestroy(own_stream);
    if (pool != nullptr) (void)cudaMemPoolDestroy(pool);
    if (pinned_attached_) pinned_cache().detach();
    if (device_attached_) device_cache(device).detach();
    caller_done = nullptr;
    own_stream = nullptr;
    pool = nullptr;
    pinned_attached_ = device_attached_ = false;
    (void)cudaGetLastError();
  }

  nccl_host::AbortableHandle<ncclComm_t> comm_;
  bool pinned_attached_ = false;
  bool device_attached_ = false;
};

namespace {

using State = NcclCommunicator::State;

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
  Staging& operator=(Staging&& o) noexcept {
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
  ~Staging() { release(); }

  void in(const void* p, std::size_t bytes, const char* what) { add(p, bytes, true, false, what); }
  void out(void* p, std::size_t bytes, const char* what) { add(p, bytes, false, true, what); }
  void inout(void* p, std::size_t bytes, const char* what) { add(p, bytes, true, true, what); }
  /// Device memory of the operation's own, zeroed (the barrier's one int).
  void scratch(std::size_t bytes) { scratch_bytes_ = bytes; }

  /// Before the operation: finds where each buffer is (ConfigError for another device's
  /// memory), copies host inputs into the pinned block and enqueues their copy to the device.
  void stage(const State& s, cudaStream_t stream, const std::string& op) {
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
      check_cuda(cudaMemsetAsync(static_cast<char*>(device_.ptr) + scratch_offset_, 0,
                                 scratch_bytes_, stream),
                 op, s.name, "cudaMemsetAsync");
    for (const Slot& slot : slots_) {
      if (!slot.host || !slot.in) continue;
      pinned_in_flight_ = true;
      check_cuda(cudaMemcpyAsync(device_at(slot), pinned_at(slot), slot.bytes,
                                 cudaMemcpyHostToDevice, stream),
                 op, s.name, "cudaMemcpyAsync to the device");
    }
  }

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
  void unstage(const std::string& op, const std::string& group) {
    if (device_.ptr == nullptr) return;
    for (const Slot& slot : slots_) {
      if (!slot.host || !slot.out) continue;
      pinned_in_flight_ = true;
      check_cuda(cudaMemcpyAsync(pinned_at(slot), device_at(slot), slot.bytes,
                                 cudaMemcpyDeviceToHost, stream_),
                 op, group, "cudaMemcpyAsync to the host");
    }
    device_free(std::exchange(device_, {}), stream_, pool_ != nullptr, device_id_);
  }

  /// Once the operation's event completed: copies host outputs to the caller's memory (host
  /// to host: never waits for the device) and returns the pinned block to the cache.
  void finish() noexcept {
    if (pinned_.ptr == nullptr) return;
    for (const Slot& slot : slots_)
      if (slot.host && slot.out)
        std::memcpy(const_cast<void*>(slot.user), pinned_at(slot), slot.bytes);
    const nccl_host::BlockCache::Block b = std::exchange(pinned_, {});
    pinned_cache().give(b.ptr, b.cls);
  }

 private:
  struct Slot {
    const void* user = nullptr;
    std::size_t bytes = 0;
    bool in = false, out = false, host = false;
    std::size_t offset = 0;
    const char* what = "";
  };

  static std::size_t round_up(std::size_t n) { return (n + 255) / 256 * 256; }

  void add(const void* p, std::size_t bytes, bool in, bool out, const char* what) {
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

  void* pinned_at(const Slot& s) const { return static_cast<char*>(pinned_.ptr) + s.offset; }
  void* device_at(const Slot& s) const { return static_cast<char*>(device_.ptr) + s.offset; }

  // The operation was not enqueued (its device block is freed behind what was queued), or it
  // did not complete: copies still queued may read or write the pinned block, so it is
  // never reused (a few bytes of control data per failed operation).
  void release() noexcept {
    if (device_.ptr != nullptr)
      device_free(std::exchange(device_, {}), stream_, pool_ != nullptr, device_id_);
    if (pinned_.ptr == nullptr) return;
    if (pinned_in_flight_) pinned_cache().lose(pinned_.cls);
    else pinned_cache().give(pinned_.ptr, pinned_.cls);
    pinned_ = {};
  }

  std::vector<Slot> slots_;
  std::size_t scratch_bytes_ = 0, scratch_offset_ = 0;
  nccl_host::BlockCache::Block pinned_;
  bool pinned_in_flight_ = false;
  nccl_host::BlockCache::Block device_;  // cls: only for a device without pools
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  int device_id_ = 0;
};

// ---- Work ------------------------------------------------------------------------------

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<State> state, std::string op, Ms timeout, Clock::time_point deadline,
           Staging staging)
      : state_(std::move(state)), op_(std::move(op)), timeout_(timeout), deadline_(deadline),
        staging_(std::move(staging)) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), op_, state_->name,
               "cudaEventCreateWithFlags");
    const cudaError_t e = cudaEventRecord(event_, state_->stream);
    if (e != cudaSuccess) {
      (void)cudaEventDestroy(event_);
      check_cuda(e, op_, state_->name, "cudaEventRecord");
    }
  }
  ~NcclWork() override {
    if (!finished_) {
      try {
        wait();
      } catch (...) {  // the interface: a Work destroyed without wait() swallows errors
      }
    }
    const DeviceGuard guard(state_->device);
    (void)cudaEventDestroy(event_);
  }

  void wait() override {
    if (finished_) {
      if (timed_out_) throw TimeoutError(error_);
      if (!error_.empty()) throw BackendError(error_);
      return;
    }
    const DeviceGuard guard(state_->device, op_, state_->name);
    Backoff backoff;
    for (;;) {
      switch (look(true)) {
        case nccl_host::WorkVerdict::pending: backoff.pause(); break;
        case nccl_host::WorkVerdict::complete: complete(); return;
        case nccl_host::WorkVerdict::cuda_error:
          give_up(what() + "cudaEventQuery: " + cuda_text(cuda_error_));
        case nccl_host::WorkVerdict::aborted:
          give_up(what() + "the communicator was aborted: " + state_->reason(), false);
        case nccl_host::WorkVerdict::nccl_error: give_up(what() + nccl_text(nccl_error_));
        case nccl_host::WorkVerdict::timed_out: {
          const std::string msg =
              timeout_message(op_, state_->name, "", timeout_, state_->name, state_->members);
          finished_ = true;
          timed_out_ = true;
          error_ = msg;
          state_->abort(msg);
          throw TimeoutError(msg);
        }
      }
    }
  }

  /// Never blocks: one look that waits for no lock (NCCL's state is read only if no other
  /// thread holds the communicator; else the answer is "not yet"). An operation that failed or
  /// was aborted is done too; wait() reports it (and aborts where it must: ncclCommAbort may
  /// block, so done() never calls it).
  [[nodiscard]] bool done() const override {
    if (finished_) return true;
    const DeviceGuard guard(state_->device);
    switch (look(false)) {
      case nccl_host::WorkVerdict::pending: return false;
      case nccl_host::WorkVerdict::complete: complete(); return true;
      default: return true;
    }
  }

 private:
  // One look at the operation: the event first, then what could have ended its kernels early.
  // wait()'s look (`blocking`) waits for another thread's call on the communicator to read
  // NCCL's state; done()'s does not.
  nccl_host::WorkVerdict look(bool blocking) const {
    nccl_host::WorkLook l;
    const cudaError_t e = cudaEventQuery(event_);
    l.event_done = e == cudaSuccess;
    l.event_error = e != cudaSuccess && e != cudaErrorNotReady;
    if (l.event_error) cuda_error_ = e;
    (void)cudaGetLastError();
    l.aborted = state_->is_aborted();
    if (!l.aborted) {
      std::optional<ncclResult_t> async;
      if (blocking) {
        async = state_->async_state();
      } else {
        const auto [tried, state] = state_->try_async_state();
        l.nccl_unknown = tried == nccl_host::TryUse::busy;
        async = tried == nccl_host::TryUse::busy ? std::optional<ncclResult_t>(ncclSuccess) : state;
      }
      if (!async) {
        l.aborted = true;
      } else if (*async != ncclSuccess && *async != ncclInProgress) {
        l.nccl_error = true;
        nccl_error_ = *async;
      }
    }
    l.past_deadline = blocking && Clock::now() >= deadline_;
    return nccl_host::judge(l);
  }

  [[nodiscard]] std::string what() const { return "nccl " + op_ + " on " + state_->name + ": "; }

  void complete() const noexcept {
    finished_ = true;
    staging_.finish();
  }

  [[noreturn]] void give_up(const std::string& msg, bool abort = true) {
    finished_ = true;
    error_ = abort ? msg + "; communicator aborted" : msg;
    if (abort) state_->abort(msg);
    throw BackendError(error_);
  }

  std::shared_ptr<State> state_;
  std::string op_;
  Ms timeout_;
  Clock::time_point deadline_;
  mutable Staging staging_;
  cudaEvent_t event_ = nullptr;
  mutable bool finished_ = false;
  bool timed_out_ = false;
  std::string error_;
  mutable cudaError_t cuda_error_ = cudaSuccess;
  mutable ncclResult_t nccl_error_ = ncclSuccess;
};

// Posts one operation: orders it after the caller's work, stages host buffers, enqueues
// (polling a nonblocking communicator until it has), queues the copies back, records the
// Work's event. `enqueue(staging, comm, stream)` returns NCCL's result; it runs while no
// abort can destroy `comm`.
template <class Enqueue>
std::unique_ptr<Work> post(const std::shared_ptr<State>& s, Ms timeout, const std::string& op,
                           Staging staging, Enqueue&& enqueue) {
  s->check_usable(op);
  const DeviceGuard guard(s->device, op, s->name);
  const Clock::time_point deadline = Clock::now() + timeout;
  s->order_after_caller(op);
  const cudaStream_t stream = s->stream;
  staging.stage(*s, stream, op);
  s->check_call(op, s->use([&](ncclComm_t comm) { return enqueue(staging, comm, stream); }),
                deadline, timeout);
  staging.unstage(op, s->name);
  return std::make_unique<NcclWork>(s, op, timeout, deadline, std::move(staging));
}

// Runs calls between ncclGroupStart and ncclGroupEnd; the group is always closed, and the
// first failing call's result wins over the group's.
template <class Calls>
ncclResult_t grouped(Calls&& calls) {
  ncclResult_t rc = ncclGroupStart();
  if (rc != ncclSuccess) return rc;
  const ncclResult_t first = calls();
  const ncclResult_t end = ncclGroupEnd();
  return first != ncclSuccess && first != ncclInProgress ? first : end;
}

std::size_t bytes_of(std::size_t count, DataType t) { return count * element_size(t); }

}  // namespace

// ---- memory, as the tests see it ---------------------------------------------------------

nccl_host::MemoryKind nccl_backend::memory_kind(const void* p, int* device, const std::string& op,
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

const nccl_host::BlockCache& nccl_backend::staging_pinned_cache() { return pinned_cache(); }

// ---- the communicator -------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(std::string name, std::shared_ptr<State> state, Ms timeout)
    : Communicator(std::move(name), timeout), state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() = default;

std::unique_ptr<NcclCommunicator> NcclCommunicator::adopt(std::shared_ptr<State> state, Ms timeout,
                                                          std::vector<std::int64_t> members) {
  std::string name = state->name;
  std::unique_ptr<NcclCommunicator> c(
      new NcclCommunicator(std::move(name), std::move(state), timeout));
  if (!members.empty()) {
    c->state_->members = members;
    c->set_members(std::move(members));
  }
  return c;
}

Rank NcclCommunicator::rank() const noexcept { return state_->rank; }
Rank NcclCommunicator::size() const noexcept { return state_->size; }
void NcclCommunicator::timeout_changed(Ms timeout) { state_->timeout = timeout; }
int NcclCommunicator::device() const noexcept { return state_->device; }
CUstream_st* NcclCommunicator::stream() const noexcept { return state_->stream; }
void NcclCommunicator::set_stream(CUstream_st* stream) noexcept {
  state_->stream = stream != nullptr ? stream : state_->own_stream;
}
ncclComm* NcclCommunicator::native() const noexcept { return state_->native(); }
bool NcclCommunicator::aborted() const noexcept { return state_->is_aborted(); }
std::string NcclCommunicator::abort_reason() const { return state_->reason(); }
void NcclCommunicator::abort(const std::string& reason) noexcept { state_->abort(reason); }

namespace {

// The state of a communicator made from `parent`; it owns `comm` (aborted if this throws)
// and the name NCCL was given.
std::shared_ptr<State> new_state(OwnedComm comm, const State& parent, const std::string& name,
                                 std::shared_ptr<const std::string> nccl_name) {
  auto state = std::make_shared<State>(std::move(comm), parent.device, name, parent.bootstrap,
                                       parent.timeout, std::move(nccl_name));
  state->owned_bootstrap = parent.owned_bootstrap;
  state->epoch = parent.epoch;
  if (state->epoch) state->epoch->add(state);  // aborted at once if the epoch was
  return state;
}

using Epoch = nccl_host::EpochMembers<State>;

// A world's state begins an epoch of its own.
void begin_epoch(const std::shared_ptr<State>& world) {
  world->epoch =
      std::make_shared<Epoch>([](State& s, const std::string& why) { return s.abort_now(why); });
  world->epoch->add(world);
}

// Waits for a child that `call(parent, &slot)` makes from `s` (ncclCommSplit, ncclCommShrink):
// NCCL runs it as a job of the parent and writes the child into `slot` from that job's thread
// when the job ends, failed or not (NCCL 2.28 init.cc, ncclCommInitRankFunc; ncclCommShrink
// goes through the same ncclCommInitChildComm as ncclCommSplit). Until the job is known to
// have ended, every way out of here aborts the parent, which joins the job (ncclCommAbort
// waits for it), so that NCCL never writes into a slot that is gone; and a child NCCL wrote
// is aborted unless it is returned. Returns the child, initialized (nullptr when NCCL gave
// this rank none: a split without color). `target` names the child in messages.
// With `stopping` the parent was stop()ped (a shrink: nobody else may use it, and its pending
// operations report it aborted): it is called and polled through use_stopping().
template <class Call>
OwnedComm make_child(State& s, const std::string& op, const std::string& target,
                     const std::string& child_name, Ms timeout, bool stopping, Call&& call) {
  const Clock::time_point deadline = Clock::now() + timeout;
  ncclComm_t slot = nullptr;
  bool job_ended = false;
  OwnedComm child(nullptr, CommAborter{s.device});
  OnExit unwind([&] {
    if (!job_ended)
      s.abort("nccl " + op + " on " + s.name + " for " + target + " did not complete");
    child.reset(__atomic_load_n(&slot, __ATOMIC_ACQUIRE));
  });
  auto on_parent = [&](ncclComm_t parent) { return call(parent, &slot); };
  const std::optional<ncclResult_t> called =
      stopping ? s.use_stopping(on_parent) : s.use(on_parent);
  if (!called) s.check_usable(op);
  // The parent reports ncclInProgress until the job has ended (for a rank without color too:
  // it takes part in the exchange of colors).
  Settled st{called.value_or(ncclInvalidUsage), false};
  if (st.rc == ncclSuccess || st.rc == ncclInProgress)
    st = settle(
        [&s, stopping] { return stopping ? s.use_stopping(&async_state_of) : s.async_state(); },
        deadline);
  if (st.aborted) s.check_usable(op);
  if (st.rc == ncclInProgress) {
    const std::string msg = timeout_message(op, s.name, target, timeout, s.name, s.members);
    s.abort(msg);
    throw TimeoutError(msg);
  }
  if (st.rc != ncclSuccess) s.fail(op + " for " + target, st.rc);
  job_ended = true;
  unwind.dismiss();
  child.reset(__atomic_load_n(&slot, __ATOMIC_ACQUIRE));
  if (!child) return child;
  st = settle_own(child.get(), deadline);
  if (st.rc != ncclSuccess) {
    if (st.rc == ncclInProgress)
      throw TimeoutError(timeout_message(op, s.name, target, timeout, child_name, s.members));
    throw BackendError("nccl " + op + " on " + s.name + " for " + target + ": " + nccl_text(st.rc));
  }
  return child;
}

}  // namespace

// ---- creation -----------------------------------------------------------------------------

std::unique_ptr<Communicator> NcclCommunicator::do_split(std::optional<std::int64_t> color,
                                                         std::int64_t key, std::string name) {
  State& s = *state_;
  s.check_usable("split");
  nccl_host::check_nccl_environment("nccl split on " + s.name + " for " + name);
  const DeviceGuard guard(s.device, "split", s.name);
  const nccl_backend::CommConfig cfg =
      nccl_backend::nonblocking_config(name);  // outlives the child
  ncclConfig_t config = cfg.config;
  const int c = color ? static_cast<int>(*color) : NCCL_SPLIT_NOCOLOR;
  const std::string target =
      name + (color ? " (color " + std::to_string(*color) + ")" : " (no color)");
  OwnedComm child = make_child(
      s, "split", target, name, timeout(), false, [&](ncclComm_t parent, ncclComm_t* slot) {
        return ncclCommSplit(parent, c, static_cast<int>(key), slot, &config);
      });
  if (!color) {
    COMMGRID_ENFORCE(child == nullptr, "ncclCommSplit gave a communicator to a rank without color");
    return nullptr;
  }
  if (!child)
    throw BackendError("nccl split on " + s.name + " for " + target +
                       ": ncclCommSplit completed without a communicator");
  auto out = adopt(new_state(std::move(child), s, name, cfg.name), timeout(), {});
  // NCCL does not say which parent ranks joined; the members tell each other.
  const std::int64_t me = global_rank(rank());
  std::vector<std::int64_t> got(static_cast<std::size_t>(out->size()), -1);
  out->allgather(&me, got.data(), 1, DataType::int64)->wait();
  out->state_->members = got;
  out->set_members(std::move(got));
  return out;
}

std::unique_ptr<Communicator> NcclCommunicator::do_create_group(std::span<const Rank> members,
                                                                std::string name) {
  State& s = *state_;
  s.check_usable("create_group");
  nccl_host::check_nccl_environment("nccl create_group on " + s.name + " for " + name);
  if (s.bootstrap == nullptr)
    throw BackendError("nccl create_group on " + s.name + " for " + name +
                       ": no bootstrap communicator");
  std::vector<Rank> global;
  for (Rank m : members) global.push_back(global_rank(m));
  const nccl_host::UniqueId id =
      nccl_host::distribute_unique_id(*s.bootstrap, global, name, make_unique_id);
  const int mine =
      static_cast<int>(std::lower_bound(members.begin(), members.end(), rank()) - members.begin());
  const nccl_backend::CommConfig cfg = nccl_backend::nonblocking_config(name);
  OwnedComm comm = init_comm(static_cast<int>(members.size()), id, mine, s.device, "create_group",
                             s.name, cfg, timeout(), global);
  return adopt(new_state(std::move(comm), s, name, cfg.name), timeout(), std::move(global));
}

std::unique_ptr<Communicator> NcclCommunicator::do_create_group_collective(
    std::span<const Rank> members, std::string name) {
  State& s = *state_;
  s.check_usable("create_group_collective");
  nccl_host::check_nccl_environment("nccl create_group_collective on " + s.name + " for " + name);
  // One record per rank: [fingerprint, ok, id..., text...]; only the first member's id and
  // text are read.
  constexpr std::size_t kIdWords = nccl_host::kUniqueIdBytes / 8, kTextWords = 25;
  constexpr std::size_t kWords = 2 + kIdWords + kTextWords;
  std::array<std::int64_t, kWords> mine{};
  mine[0] = static_cast<std::int64_t>(detail::group_fingerprint(members, name));
  mine[1] = 1;
  if (rank() == members.front()) {
    try {
      const nccl_host::UniqueId id = make_unique_id();
      std::memcpy(&mine[2], id.data(), id.size());
    } catch (const Error& e) {
      mine[1] = 0;
      std::strncpy(reinterpret_cast<char*>(&mine[2 + kIdWords]), e.what(), kTextWords * 8 - 1);
    }
  }
  const auto n = static_cast<std::size_t>(size());
  std::vector<std::int64_t> all(kWords * n);
  allgather(mine.data(), all.data(), kWords, DataType::int64)->wait();
  std::string differ;
  for (std::size_t r = 0; r < n; ++r)
    if (all[r * kWords] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (!differ.empty())
    throw BackendError("nccl create_group_collective on " + s.name + " for " + name + ": ranks " +
                       differ + " passed different members or name than rank 0");
  const std::int64_t* leader = &all[static_cast<std::size_t>(members.front()) * kWords];
  if (leader[1] != 1)
    throw BackendError(
        "nccl create_group_collective on " + s.name + " for " + name + ": rank " +
        std::to_string(members.front()) + " could not make the NCCL unique id: " +
        std::string(reinterpret_cast<const char*>(&leader[2 + kIdWords]),
                    strnlen(reinterpret_cast<const char*>(&leader[2 + kIdWords]), kTextWords * 8)));
  if (!std::binary_search(members.begin(), members.end(), rank())) return nullptr;
  nccl_host::UniqueId id{};
  std::memcpy(id.data(), &leader[2], id.size());
  std::vector<Rank> global;
  for (Rank m : members) global.push_back(global_rank(m));
  const int me =
      static_cast<int>(std::lower_bound(members.begin(), members.end(), rank()) - members.begin());
  const nccl_backend::CommConfig cfg = nccl_backend::nonblocking_config(name);
  OwnedComm comm = init_comm(static_cast<int>(members.size()), id, me, s.device,
                             "create_group_collective", s.name, cfg, timeout(), global);
  return adopt(new_state(std::move(comm), s, name, cfg.name), timeout(), std::move(global));
}

// ---- collectives --------------------------------------------------------------------------

std::unique_ptr<Work> NcclCommunicator::do_barrier() {
  // One int allreduced in device memory of the operation's own, allocated, zeroed and freed
  // on the operation's stream.
  Staging st;
  st.scratch(sizeof(std::int32_t));
  return post(state_, timeout(), "barrier", std::move(st),
              [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
                void* buf = b.scratch_ptr();
                return ncclAllReduce(buf, buf, 1, ncclInt32, ncclSum, c, stream);
              });
}

std::unique_ptr<Work> NcclCommunicator::do_broadcast(void* buf, std::size_t count, DataType type,
                                                     Rank root_rank) {
  const int root = detail::engine_int(root_rank);
  Staging st;
  st.inout(buf, bytes_of(count, type), "buf");
  return post(state_, timeout(), "broadcast", std::move(st),
              [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
                void* d = b.dev(buf);
                return ncclBroadcast(d, d, count, nccl_backend::nccl_type(type), root, c, stream);
              });
}

std::unique_ptr<Work> NcclCommunicator::do_allreduce(const void* send, void* recv,
                                                     std::size_t count, DataType type,
                                                     ReduceOp op) {
  Staging st;
  st.in(send, bytes_of(count, type), "send");
  st.out(recv, bytes_of(count, type), "recv");
  return post(state_, timeout(), "allreduce", std::move(st),
              [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
                return ncclAllReduce(b.dev(send), b.dev(recv), count, nccl_backend::nccl_type(type),
                                     nccl_backend::nccl_op(op), c, stream);
              });
}

std::unique_ptr<Work> NcclCommunicator::do_allgather(const void* send, void* recv,
                                                     std::size_t count, DataType type) {
  const auto n = static_cast<std::size_t>(size());
  Staging st;
  st.in(send, bytes_of(count, type), "send");
  st.out(recv, bytes_of(count * n, type), "recv");
  return post(state_, timeout(), "allgather", std::move(st),
              [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
                return ncclAllGather(b.dev(send), b.dev(recv), count, nccl_backend::nccl_type(type),
                                     c, stream);
              });
}

std::unique_ptr<Work> NcclCommunicator::do_reduce_scatter(const void* send, void* recv,
                                                          std::size_t count, DataType type,
                                                          ReduceOp op) {
  const auto n = static_cast<std::size_t>(size());
  Staging st;
  st.in(send, bytes_of(count * n, type), "send");
  st.out(recv, bytes_of(count, type), "recv");
  return post(state_, timeout(), "reduce_scatter", std::move(st),
              [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
                return ncclReduceScatter(b.dev(send), b.dev(recv), count,
                                         nccl_backend::nccl_type(type), nccl_backend::nccl_op(op),
                                         c, stream);
              });
}

std::unique_ptr<Work> NcclCommunicator::do_alltoall(const void* send, void* recv, std::size_t count,
                                                    DataType type) {
  const auto n = static_cast<std::size_t>(size());
  Staging st;
  st.in(send, bytes_of(count * n, type), "send");
  st.out(recv, bytes_of(count * n, type), "recv");
  return post(state_, timeout(), "alltoall", std::move(st),
              [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
                const auto t = nccl_backend::nccl_type(type);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
                return ncclAlltoAll(b.dev(send), b.dev(recv), count, t, c, stream);
#else
    const auto* in = static_cast<const char*>(b.dev(send));
    auto* out = static_cast<char*>(b.dev(recv));
    const std::size_t block = bytes_of(count, type);
    return grouped([&] {
      for (std::size_t j = 0; j < n; ++j) {
        ncclResult_t r = ncclSend(in + j * block, count, t, static_cast<int>(j), c, stream);
        if (r == ncclSuccess || r == ncclInProgress)
          r = ncclRecv(out + j * block, count, t, static_cast<int>(j), c, stream);
        if (r != ncclSuccess && r != ncclInProgress) return r;
      }
      return ncclSuccess;
    });
#endif
              });
}

std::unique_ptr<Work> NcclCommunicator::do_alltoallv(const void* send,
                                                     std::span<const std::size_t> send_counts,
                                                     void* recv,
                                                     std::span<const std::size_t> recv_counts,
                                                     DataType type) {
  const std::size_t send_total =
      std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0});
  const std::size_t recv_total =
      std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
  Staging st;
  st.in(send, bytes_of(send_total, type), "send");
  st.out(recv, bytes_of(recv_total, type), "recv");
  return post(state_, timeout(), "alltoallv", std::move(st),
              [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
                const auto t = nccl_backend::nccl_type(type);
                const auto* in = static_cast<const char*>(b.dev(send));
                auto* out = static_cast<char*>(b.dev(recv));
                return grouped([&] {
                  std::size_t so = 0, ro = 0;
                  for (std::size_t j = 0; j < send_counts.size(); ++j) {
                    ncclResult_t r = ncclSuccess;
                    if (send_counts[j] > 0)
                      r = ncclSend(in + bytes_of(so, type), send_counts[j], t, static_cast<int>(j),
                                   c, stream);
                    if ((r == ncclSuccess || r == ncclInProgress) && recv_counts[j] > 0)
                      r = ncclRecv(out + bytes_of(ro, type), recv_counts[j], t, static_cast<int>(j),
                                   c, stream);
                    if (r != ncclSuccess && r != ncclInProgress) return r;
                    so += send_counts[j];
                    ro += recv_counts[j];
                  }
                  return ncclSuccess;
                });
              });
}

std::unique_ptr<Work> NcclCommunicator::do_allgatherv(const void* send, std::size_t count,
                                                      void* recv,
                                                      std::span<const std::size_t> recv_counts,
                                                      DataType type) {
  const std::size_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
  Staging st;
  st.in(send, bytes_of(count, type), "send");
  st.out(recv, bytes_of(total, type), "recv");
  return post(state_, timeout(), "allgatherv", std::move(st),
              [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
                const auto t = nccl_backend::nccl_type(type);
                const void* in = b.dev(send);
                auto* out = static_cast<char*>(b.dev(recv));
                // One broadcast per rank into its block: NCCL's way to gather blocks of different
                // sizes.
                return grouped([&] {
                  std::size_t off = 0;
                  for (std::size_t i = 0; i < recv_counts.size(); ++i) {
                    if (recv_counts[i] > 0) {
                      void* block = out + bytes_of(off, type);
                      const void* from = static_cast<int>(i) == rank() ? in : block;
                      const ncclResult_t r = ncclBroadcast(from, block, recv_counts[i], t,
                                                           static_cast<int>(i), c, stream);
                      if (r != ncclSuccess && r != ncclInProgress) return r;
                    }
                    off += recv_counts[i];
                  }
                  return ncclSuccess;
                });
              });
}

std::unique_ptr<Work> NcclCommunicator::do_reduce(const void* send, void* recv, std::size_t count,
                                                  DataType type, ReduceOp op, Rank root_rank) {
  const int root = detail::engine_int(root_rank);
  Staging st;
  st.in(send, bytes_of(count, type), "send");
  if (rank() == root) st.out(recv, bytes_of(count, type), "recv");
  return post(state_, timeout(), "reduce", std::move(st),
              [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
                return ncclReduce(b.dev(send), rank() == root ? b.dev(recv) : nullptr, count,
                                  nccl_backend::nccl_type(type), nccl_backend::nccl_op(op), root, c,
                                  stream);
              });
}

std::unique_ptr<Work> NcclCommunicator::do_gather(const void* send, void* recv, std::size_t count,
                                                  DataType type, Rank root_rank) {
  const int root = detail::engine_int(root_rank);
  const bool is_root = rank() == root;
  const auto n = static_cast<std::size_t>(size());
  Staging st;
  st.in(send, bytes_of(count, type), "send");
  if (is_root) st.out(recv, bytes_of(count * n, type), "recv");
  return post(state_, timeout(), "gather", std::move(st),
              [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
                const auto t = nccl_backend::nccl_type(type);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
                return ncclGather(b.dev(send), is_root ? b.dev(recv) : nullptr, count, t, root, c,
                                  stream);
#else
    return grouped([&] {
      ncclResult_t r = ncclSend(b.dev(send), count, t, root, c, stream);
      for (std::size_t i = 0; is_root && i < n && (r == ncclSuccess || r == ncclInProgress); ++i)
        r = ncclRecv(static_cast<char*>(b.dev(recv)) + i * bytes_of(count, type), count, t,
                     static_cast<int>(i), c, stream);
      return r;
    });
#endif
              });
}

std::unique_ptr<Work> NcclCommunicator::do_scatter(const void* send, void* recv, std::size_t count,
                                                   DataType type, Rank root_rank) {
  const int root = detail::engine_int(root_rank);
  const bool is_root = rank() == root;
  const auto n = static_cast<std::size_t>(size());
  Staging st;
  if (is_root) st.in(send, bytes_of(count * n, type), "send");
  st.out(recv, bytes_of(count, type), "recv");
  return post(state_, timeout(), "scatter", std::move(st),
              [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
                const auto t = nccl_backend::nccl_type(type);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
                return ncclScatter(is_root ? b.dev(send) : nullptr, b.dev(recv), count, t, root, c,
                                   stream);
#else
    return grouped([&] {
      ncclResult_t r = ncclSuccess;
      for (std::size_t i = 0; is_root && i < n && (r == ncclSuccess || r == ncclInProgress); ++i)
        r = ncclSend(static_cast<const char*>(b.dev(send)) + i * bytes_of(count, type), count, t,
                     static_cast<int>(i), c, stream);
      if (r == ncclSuccess || r == ncclInProgress) r = ncclRecv(b.dev(recv), count, t, root, c, stream);
      return r;
    });
#endif
              });
}

// ---- point to point -------------------------------------------------------------------

std::unique_ptr<Work> NcclCommunicator::do_batch_isend_irecv(std::span<const P2POp> ops,
                                                             std::string_view op_name) {
  Staging st;
  for (const P2POp& op : ops) {
    if (op.kind == P2POp::Kind::send) st.in(op.buf, bytes_of(op.count, op.type), "buf");
    else st.out(op.buf, bytes_of(op.count, op.type), "buf");
  }
  return post(
      state_, timeout(), std::string(op_name), std::move(st),
      [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
        return grouped([&] {
          for (const P2POp& op : ops) {
            if (op.count == 0) continue;
            const auto t = nccl_backend::nccl_type(op.type);
            const ncclResult_t r =
                op.kind == P2POp::Kind::send
                    ? ncclSend(b.dev(op.buf), op.count, t, detail::engine_int(op.peer), c, stream)
                    : ncclRecv(b.dev(op.buf), op.count, t, detail::engine_int(op.peer), c, stream);
            if (r != ncclSuccess && r != ncclInProgress) return r;
          }
          return ncclSuccess;
        });
      });
}

// ---- the world ------------------------------------------------------------------------------

int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return "no CUDA device (cudaGetDeviceCount: " + std::string(cudaGetErrorString(e)) + ")";
  }
  if (n == 0) return "no CUDA device (cudaGetDeviceCount found none)";
  return "";
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // Since 2.9 the code is major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

// What the recovery functions need of a communicator (a friend of NcclCommunicator).
struct NcclCommunicatorAccess {
  static const std::shared_ptr<State>& state(const NcclCommunicator& c) noexcept {
    return c.state_;
  }
  static std::unique_ptr<NcclCommunicator> adopt(std::shared_ptr<State> state, Ms timeout,
                                                 std::vector<std::int64_t> members) {
    return NcclCommunicator::adopt(std::move(state), timeout, std::move(members));
  }
};

std::unique_ptr<NcclCommunicator> make_nccl_world(const NcclOptions& options) {
  if (!options.bootstrap)
    throw InvalidValueError("bootstrap", "nccl world: no bootstrap communicator");
  Communicator& bootstrap = *options.bootstrap;
  if (options.device && *options.device < 0)
    throw InvalidValueError(
        "device", "nccl world: device must be >= 0, got " + std::to_string(*options.device));
  const Ms timeout = options.timeout.value_or(bootstrap.timeout());
  if (timeout.count() <= 0)
    throw InvalidValueError(
        "timeout", "nccl world: timeout must be > 0 ms, got " + std::to_string(timeout.count()));
  nccl_host::check_nccl_environment("nccl world");
  // Two exchanges over the bootstrap: host names (for the local rank), then each rank's
  // device or the reason it has none, so that every rank fails alike instead of some waiting
  // for an id that others never join.
  nccl_host::HostInfo mine;
  mine.host = host_name();
  mine.device_count = cuda_device_count();
  const std::vector<nccl_host::HostInfo> hosts = nccl_host::exchange_host_info(bootstrap, mine);
  const nccl_host::LocalRank local = nccl_host::local_rank_of(hosts, bootstrap.rank());
  try {
    mine.device = nccl_host::choose_device(options.device, local, mine.device_count, mine.host,
                                           cuda_unavailable_reason());
    check_cuda(cudaSetDevice(mine.device), "create", "world", "cudaSetDevice");
    std::array<char, 32> bus{};
    check_cuda(cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()), mine.device),
               "create", "world", "cudaDeviceGetPCIBusId");
    mine.bus_id = bus.data();
  } catch (const Error& e) {
    mine.problem = e.what();
    mine.device = -1;
  }
  const std::vector<nccl_host::HostInfo> all = nccl_host::exchange_host_info(bootstrap, mine);
  const std::string problem = nccl_host::world_problem(all);
  if (!problem.empty()) throw BackendError("nccl world: " + problem);

  const nccl_host::UniqueId id =
      nccl_host::broadcast_unique_id(bootstrap, 0, make_unique_id, "create world");
  std::vector<std::int64_t> members(static_cast<std::size_t>(bootstrap.size()));
  std::iota(members.begin(), members.end(), std::int64_t{0});
  const nccl_backend::CommConfig cfg = nccl_backend::nonblocking_config("world");
  OwnedComm comm =
      init_comm(detail::engine_int(bootstrap.size()), id, detail::engine_int(bootstrap.rank()),
                mine.device, "create", "world", cfg, timeout, members);
  auto state =
      std::make_shared<State>(std::move(comm), mine.device, "world", &bootstrap, timeout, cfg.name);
  state->owned_bootstrap = options.bootstrap;
  begin_epoch(state);
  return NcclCommunicatorAccess::adopt(std::move(state), timeout, std::move(members));
}

// ---- recovery ---------------------------------------------------------------------------

std::size_t abort_nccl_epoch(NcclCommunicator& comm, const std::string& reason) noexcept {
  State& s = *NcclCommunicatorAccess::state(comm);
  try {
    if (s.epoch) return s.epoch->abort_all(reason);
  } catch (...) {  // out of memory while listing the members: at least this one goes
  }
  return s.abort_now(reason) ? 1 : 0;
}

std::size_t abort_nccl_epoch(Communicator& comm, const std::string& reason) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  if (nccl == nullptr)
    throw ConfigError("backend",
                      "abort_nccl_epoch: " + comm.name() + " is a " + std::string(comm.backend()) +
                          " communicator; only NCCL communicators have an epoch to abort");
  return abort_nccl_epoch(*nccl, reason);
}

NcclShrinkMethod nccl_shrink_method() noexcept {
#if COMMGRID_NCCL_HAS_SHRINK
  return NcclShrinkMethod::comm_shrink;
#else
  return NcclShrinkMethod::new_world;
#endif
}

const char* nccl_shrink_method_name(NcclShrinkMethod method) noexcept {
  return method == NcclShrinkMethod::comm_shrink ? "ncclCommShrink" : "new world";
}

std::unique_ptr<NcclCommunicator> shrink_nccl_world(NcclCommunicator& world,
                                                    std::span<const Rank> exclude,
                                                    const NcclShrinkOptions& options) {
  const std::shared_ptr<State> keep = NcclCommunicatorAccess::state(world);
  State& s = *keep;
  const std::string what = "nccl shrink of " + s.name;
  const Ms timeout = options.timeout.value_or(world.timeout());
  if (timeout.count() <= 0)
    throw InvalidValueError(
        "timeout", what + ": timeout must be > 0 ms, got " + std::to_string(timeout.count()));
  const nccl_host::WorldShrink plan =
      nccl_host::plan_world_shrink(world.size(), world.rank(), exclude, what);
  if (options.bootstrap &&
      (options.bootstrap->size() != plan.size || options.bootstrap->rank() != plan.rank))
    throw InvalidValueError(
        "bootstrap", what + ": the bootstrap is rank " + std::to_string(options.bootstrap->rank()) +
                         " of " + std::to_string(options.bootstrap->size()) +
                         ", and this rank is rank " + std::to_string(plan.rank) + " of " +
                         std::to_string(plan.size) + " in the shrunk world (members " +
                         members_text(plan.survivors) + ")");
  if (nccl_shrink_method() == NcclShrinkMethod::new_world && !options.bootstrap)
    throw ConfigError("bootstrap",
                      what + ": this build makes the smaller world afresh (NCCL " +
                          std::to_string(NCCL_VERSION_CODE) +
                          " headers, or COMMGRID_NCCL_NO_SHRINK: no ncclCommShrink), "
                          "which needs NcclShrinkOptions::bootstrap over the survivors");
  nccl_host::check_nccl_environment(what, true);
  // The old world has dead peers: whatever happens below, it is aborted on the way out
  // (finalizing it would wait for them), and with it its whole epoch, so that a group whose
  // creation another thread finished during the shrink (it joined the epoch after the
  // groups were aborted) is aborted too, and one that finishes later as it joins.
  OnExit abort_old([&] {
    s.abort(what + ": the world was replaced by its shrink");
    try {
      if (s.epoch) (void)s.epoch->abort_all(what + ": the world was replaced by its shrink");
    } catch (...) {  // (a destructor: only an allocation can fail here)
    }
  });
#if COMMGRID_NCCL_HAS_SHRINK
  s.check_usable("shrink");
  if (s.epoch) (void)s.epoch->abort_all(what + ": the epoch's groups are aborted", &s);
  // From here the old world is the shrink's alone: other threads' calls fail and their
  // pending operations (which NCCL_SHRINK_ABORT ends early, their events then complete) report
  // it aborted instead of complete.
  s.stop(what + ": the world is replaced by its shrink");
  const DeviceGuard guard(s.device, "shrink", s.name);
  const nccl_backend::CommConfig cfg = nccl_backend::nonblocking_config("world");
  ncclConfig_t config = cfg.config;
  std::vector<int> excluded = plan.exclude;  // NCCL takes a non-const list
  const int flags = options.abort_in_flight ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
  const std::string target =
      "world without " + members_text(std::vector<std::int64_t>(excluded.begin(), excluded.end()));
  OwnedComm child = make_child(
      s, "shrink", target, "world", timeout, true, [&](ncclComm_t parent, ncclComm_t* slot) {
        return ncclCommShrink(parent, excluded.empty() ? nullptr : excluded.data(),
                              static_cast<int>(excluded.size()), slot, &config, flags);
      });
  if (!child)
    throw BackendError(what + " for " + target +
                       ": ncclCommShrink completed without a communicator");
  auto state = std::make_shared<State>(std::move(child), s.device, "world", options.bootstrap.get(),
                                       timeout, cfg.name);
  state->owned_bootstrap = options.bootstrap;
  begin_epoch(state);
  std::vector<std::int64_t> members(static_cast<std::size_t>(plan.size));
  std::iota(members.begin(), members.end(), std::int64_t{0});
  return NcclCommunicatorAccess::adopt(std::move(state), timeout, std::move(members));
#else
  (void)abort_nccl_epoch(world, what + ": the epoch is aborted; a new world replaces it");
  NcclOptions o;
  o.bootstrap = options.bootstrap;
  o.device = s.device;
  o.timeout = timeout;
  return make_nccl_world(o);
#endif
}

NcclWorldFactory make_nccl_world_factory(NcclWorldFactory bootstrap, NcclOptions options) {
  if (!bootstrap)
    throw InvalidValueError("bootstrap", "make_nccl_world_factory: no bootstrap factory");
  if (options.bootstrap)
    throw InvalidValueError("bootstrap",
                            "make_nccl_world_factory: options.bootstrap is set; each epoch's "
                            "bootstrap comes from the bootstrap factory");
  // The epochs this factory made, by prefix: a call for another prefix ends them.
  struct Made {
    std::mutex mutex;
    std::vector<std::pair<std::string, std::weak_ptr<Epoch>>> epochs;
  };
  auto made = std::make_shared<Made>();
  return [bootstrap = std::move(bootstrap), options = std::move(options), made](
             const std::string& prefix, Rank rank, Rank size) -> std::unique_ptr<Communicator> {
    std::vector<std::shared_ptr<Epoch>> over;
    {
      std::lock_guard lock(made->mutex);
      std::erase_if(made->epochs, [&](const auto& e) {
        if (e.first == prefix) return e.second.expired();
        if (auto alive = e.second.lock()) over.push_back(std::move(alive));
        return true;
      });
    }
    for (const auto& e : over)
      (void)e->abort_all("nccl: the epoch is over; the world of " + prefix + " replaces it");
    std::shared_ptr<Communicator> boot(bootstrap(prefix, rank, size));
    if (!boot)
      throw InvalidValueError("bootstrap", "nccl world factory for " + prefix +
                                               ": the bootstrap factory returned no communicator");
    if (boot->rank() != rank || boot->size() != size)
      throw InvalidValueError(
          "bootstrap", "nccl world factory for " + prefix + ": the bootstrap factory made rank " +
                           std::to_string(boot->rank()) + " of " + std::to_string(boot->size()) +
                           " for rank " + std::to_string(rank) + " of " + std::to_string(size));
    NcclOptions epoch = options;
    epoch.bootstrap = std::move(boot);
    auto world = make_nccl_world(epoch);
    {
      std::lock_guard lock(made->mutex);
      made->epochs.emplace_back(prefix, NcclCommunicatorAccess::state(*world)->epoch);
    }
    return world;
  };
}

}  // namespace commgrid
