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
#include <mutex>
#include <numeric>
#include <thread>

#include "commgrid/nccl.hpp"
#include "nccl_host.hpp"
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

std::string nccl_text(ncclResult_t rc, ncclComm_t comm) {
  std::string s = ncclGetErrorString(rc);
  const char* last = ncclGetLastError(comm);
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

// Waits while NCCL reports ncclInProgress on `comm`; returns the final result, or
// ncclInProgress when the deadline passed first.
ncclResult_t settle(ncclComm_t comm, Clock::time_point deadline) {
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return rc;
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline) return ncclInProgress;
    backoff.pause();
  }
}

nccl_host::UniqueId make_unique_id() {
  ncclUniqueId id;
  const ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc != ncclSuccess) throw BackendError("ncclGetUniqueId: " + nccl_text(rc, nullptr));
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
// deadline; on timeout aborts it and throws TimeoutError naming the group and members.
ncclComm_t init_comm(int nranks, const nccl_host::UniqueId& id, int rank, int device,
                     const std::string& op, const std::string& parent, const std::string& name,
                     Ms timeout, const std::vector<std::int64_t>& members) {
  const DeviceGuard guard(device, op, parent);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)  // names the communicator in NCCL's logs
  config.commName = name.c_str();
#endif
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), id.size());
  ncclComm_t comm = nullptr;
  const Clock::time_point deadline = Clock::now() + timeout;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, nranks, uid, rank, &config);
  if ((rc == ncclSuccess || rc == ncclInProgress) && comm != nullptr) rc = settle(comm, deadline);
  if (rc == ncclSuccess) return comm;
  const std::string target = parent == name ? "" : name;
  if (rc == ncclInProgress) {
    const std::string msg = timeout_message(op, parent, target, timeout, name, members);
    (void)ncclCommAbort(comm);
    throw TimeoutError(msg);
  }
  const std::string msg = "nccl " + op + " on " + parent + (target.empty() ? "" : " for " + target) +
                          ": " + nccl_text(rc, comm) + " (members " + members_text(members) + ")";
  if (comm != nullptr) (void)ncclCommAbort(comm);
  throw BackendError(msg);
}

}  // namespace

// ---- shared state ---------------------------------------------------------------------

struct NcclCommunicator::State {
  std::string name;
  std::vector<std::int64_t> members;  // global ranks by group rank, for messages
  int device = 0;
  int rank = 0;
  int size = 0;
  Ms timeout{0};                  // bounds finalization in the destructor
  Communicator* bootstrap = nullptr;  // carries the unique ids of member-only groups
  cudaStream_t own_stream = nullptr;
  cudaStream_t stream = nullptr;  // where operations go
  void* barrier_buf = nullptr;

  State(ncclComm_t c, int dev, std::string group, Communicator* boot, Ms t)
      : name(std::move(group)), device(dev), timeout(t), bootstrap(boot), comm_(c) {
    try {
      const DeviceGuard guard(device, "create", name);
      ncclResult_t rc = ncclCommUserRank(comm_, &rank);
      if (rc == ncclSuccess) rc = ncclCommCount(comm_, &size);
      if (rc != ncclSuccess)
        throw BackendError("nccl create on " + name + ": " + nccl_text(rc, comm_));
      // A blocking stream: work the caller put on the legacy default stream is ordered
      // before ours without any event, which is what code written for one stream expects.
      check_cuda(cudaStreamCreateWithFlags(&own_stream, cudaStreamDefault), "create", name,
                 "cudaStreamCreateWithFlags");
      stream = own_stream;
    } catch (...) {
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
      throw;
    }
  }

  ~State() {
    const DeviceGuard guard(device);
    ncclComm_t c = nullptr;
    {
      std::lock_guard lock(mutex_);
      c = comm_;
      comm_ = nullptr;
    }
    if (c != nullptr) {
      // Finalize flushes what is still queued; bounded by the timeout, then aborted.
      ncclResult_t rc = ncclCommFinalize(c);
      if (rc == ncclSuccess || rc == ncclInProgress) rc = settle(c, Clock::now() + timeout);
      if (rc == ncclSuccess)
        (void)ncclCommDestroy(c);
      else
        (void)ncclCommAbort(c);
    }
    if (barrier_buf != nullptr) (void)cudaFree(barrier_buf);
    if (own_stream != nullptr) (void)cudaStreamDestroy(own_stream);
    (void)cudaGetLastError();
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  [[nodiscard]] ncclComm_t comm() const {
    std::lock_guard lock(mutex_);
    return comm_;
  }
  [[nodiscard]] bool is_aborted() const noexcept { return aborted_.load(); }
  [[nodiscard]] std::string reason() const {
    std::lock_guard lock(mutex_);
    return reason_;
  }

  void abort(const std::string& why) noexcept {
    ncclComm_t c = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (aborted_.load()) return;
      try {
        reason_ = why;
      } catch (...) {
      }
      aborted_ = true;
      c = comm_;
      comm_ = nullptr;
    }
    if (c != nullptr) {
      const DeviceGuard guard(device);
      (void)ncclCommAbort(c);
    }
  }

  /// The asynchronous error of the communicator; ncclSuccess when aborted (the caller checks
  /// is_aborted() for that).
  ncclResult_t async_error() const {
    std::lock_guard lock(mutex_);
    if (comm_ == nullptr) return ncclSuccess;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    return rc != ncclSuccess ? rc : state;
  }

  void check_usable(const std::string& op) const {
    if (is_aborted())
      throw BackendError("nccl " + op + " on " + name + ": the communicator was aborted: " +
                         reason());
  }

  /// An NCCL error from `op`: aborts the communicator unless the call merely rejected its
  /// arguments (nothing was enqueued and NCCL holds no error), then throws BackendError.
  [[noreturn]] void fail(const std::string& op, ncclResult_t rc) {
    std::string msg = "nccl " + op + " on " + name + ": " + nccl_text(rc, comm());
    const bool argument = rc == ncclInvalidArgument || rc == ncclInvalidUsage;
    const ncclResult_t now = async_error();
    if (!argument || (now != ncclSuccess && now != ncclInProgress)) {
      abort(msg);
      msg += "; communicator aborted";
    }
    throw BackendError(msg);
  }

  /// Checks what an NCCL call returned. A nonblocking communicator may answer ncclInProgress
  /// while it connects; the call is then polled until it has been enqueued, bounded by the
  /// operation's deadline (TimeoutError after aborting).
  void check_call(const std::string& op, ncclResult_t rc, Clock::time_point deadline,
                  Ms timeout_of_op) {
    if (rc == ncclSuccess) return;
    if (rc == ncclInProgress) {
      const ncclComm_t c = comm();
      rc = c == nullptr ? ncclInvalidUsage : settle(c, deadline);
      if (rc == ncclSuccess) return;
      if (rc == ncclInProgress) {
        const std::string msg = timeout_message(op, name, "", timeout_of_op, name, members);
        abort(msg);
        throw TimeoutError(msg);
      }
    }
    fail(op, rc);
  }

 private:
  mutable std::mutex mutex_;
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
  std::string reason_;
};

namespace {

using State = NcclCommunicator::State;

// ---- buffers: device memory in place, host memory staged ----------------------------

bool device_accessible(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// The buffers of one operation. Host buffers get a place in one device block, allocated
// stream-ordered on the operation's stream; inputs are copied in before the operation,
// outputs copied back once it completed (finish()).
class Staging {
 public:
  Staging() = default;
  Staging(Staging&& o) noexcept { *this = std::move(o); }
  Staging& operator=(Staging&& o) noexcept {
    release();
    slots_ = std::move(o.slots_);
    block_ = std::exchange(o.block_, nullptr);
    stream_ = o.stream_;
    pooled_ = o.pooled_;
    return *this;
  }
  ~Staging() { release(); }

  void in(const void* p, std::size_t bytes) { add(p, bytes, true, false); }
  void out(void* p, std::size_t bytes) { add(p, bytes, false, true); }
  void inout(void* p, std::size_t bytes) { add(p, bytes, true, true); }

  void stage(cudaStream_t stream, const std::string& op, const std::string& group) {
    stream_ = stream;
    std::size_t total = 0;
    for (Slot& s : slots_) {
      s.host = !device_accessible(s.user);
      if (!s.host) continue;
      s.offset = total;
      total += (s.bytes + 255) / 256 * 256;
    }
    if (total == 0) return;
    void* block = nullptr;
    cudaError_t e = cudaMallocAsync(&block, total, stream);
    pooled_ = e == cudaSuccess;
    if (!pooled_) {  // no stream-ordered allocator on this device or driver
      (void)cudaGetLastError();
      e = cudaMalloc(&block, total);
    }
    check_cuda(e, op, group, "allocating device memory for host buffers");
    block_ = block;
    for (const Slot& s : slots_)
      if (s.host && s.in)
        check_cuda(cudaMemcpyAsync(at(s), s.user, s.bytes, cudaMemcpyHostToDevice, stream), op,
                   group, "cudaMemcpyAsync to the device");
  }

  /// The pointer to hand NCCL for a registered buffer (itself unless staged).
  template <class T>
  T* dev(T* p) const {
    for (const Slot& s : slots_)
      if (s.user == p && s.host) return static_cast<T*>(at(s));
    return p;
  }

  /// After the operation completed: copies host outputs back.
  void finish(const std::string& op, const std::string& group) {
    for (const Slot& s : slots_)
      if (s.host && s.out)
        check_cuda(cudaMemcpy(const_cast<void*>(s.user), at(s), s.bytes, cudaMemcpyDeviceToHost),
                   op, group, "cudaMemcpy to the host");
    release();
  }

 private:
  struct Slot {
    const void* user = nullptr;
    std::size_t bytes = 0;
    bool in = false, out = false, host = false;
    std::size_t offset = 0;
  };

  void add(const void* p, std::size_t bytes, bool in, bool out) {
    if (p == nullptr || bytes == 0) return;
    for (Slot& s : slots_) {
      if (s.user == p) {  // in place: one staged copy serves both
        s.bytes = std::max(s.bytes, bytes);
        s.in = s.in || in;
        s.out = s.out || out;
        return;
      }
    }
    slots_.push_back({p, bytes, in, out, false, 0});
  }

  void* at(const Slot& s) const { return static_cast<char*>(block_) + s.offset; }

  // Freed stream-ordered: after an abort, the aborted kernels end before the memory goes.
  void release() noexcept {
    if (block_ == nullptr) return;
    if (pooled_)
      (void)cudaFreeAsync(block_, stream_);
    else
      (void)cudaFree(block_);
    (void)cudaGetLastError();
    block_ = nullptr;
  }

  std::vector<Slot> slots_;
  void* block_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool pooled_ = false;
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
      const cudaError_t e = cudaEventQuery(event_);
      if (e == cudaSuccess) {
        complete();
        return;
      }
      if (e != cudaErrorNotReady) {
        (void)cudaGetLastError();
        give_up("nccl " + op_ + " on " + state_->name + ": cudaEventQuery: " + cuda_text(e));
      }
      if (state_->is_aborted())
        give_up("nccl " + op_ + " on " + state_->name +
                    ": the communicator was aborted: " + state_->reason(),
                false);
      const ncclResult_t async = state_->async_error();
      if (async != ncclSuccess && async != ncclInProgress)
        give_up("nccl " + op_ + " on " + state_->name + ": " + nccl_text(async, state_->comm()));
      if (Clock::now() >= deadline_) {
        const std::string msg =
            timeout_message(op_, state_->name, "", timeout_, state_->name, state_->members);
        state_->abort(msg);
        finished_ = true;
        timed_out_ = true;
        error_ = msg;
        throw TimeoutError(msg);
      }
      backoff.pause();
    }
  }

  [[nodiscard]] bool done() const override {
    if (finished_) return true;
    const DeviceGuard guard(state_->device);
    if (cudaEventQuery(event_) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    try {
      complete();
    } catch (const Error&) {
      return true;  // wait() reports it
    }
    return true;
  }

 private:
  void complete() const {
    finished_ = true;
    try {
      staging_.finish(op_, state_->name);
    } catch (const Error& e) {
      error_ = e.what();
      throw;
    }
  }

  [[noreturn]] void give_up(const std::string& msg, bool abort = true) {
    finished_ = true;
    error_ = msg;
    if (abort) state_->abort(msg);
    throw BackendError(abort ? msg + "; communicator aborted" : msg);
  }

  std::shared_ptr<State> state_;
  std::string op_;
  Ms timeout_;
  Clock::time_point deadline_;
  mutable Staging staging_;
  cudaEvent_t event_ = nullptr;
  mutable bool finished_ = false;
  bool timed_out_ = false;
  mutable std::string error_;
};

// Posts one operation: stages host buffers, enqueues (polling a nonblocking communicator
// until it has), records the Work's event. `enqueue(comm, stream)` returns NCCL's result.
template <class Enqueue>
std::unique_ptr<Work> post(const std::shared_ptr<State>& s, Ms timeout, const std::string& op,
                           Staging staging, Enqueue&& enqueue, bool blocking = false) {
  s->check_usable(op);
  const DeviceGuard guard(s->device, op, s->name);
  const Clock::time_point deadline = Clock::now() + timeout;
  staging.stage(s->stream, op, s->name);
  const ncclComm_t comm = s->comm();
  if (comm == nullptr) s->check_usable(op);
  s->check_call(op, enqueue(staging, comm, s->stream), deadline, timeout);
  auto work = std::make_unique<NcclWork>(s, op, timeout, deadline, std::move(staging));
  if (blocking) work->wait();
  return work;
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

// ---- the communicator -------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(std::string name, std::shared_ptr<State> state, Ms timeout)
    : Communicator(std::move(name), timeout), state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() = default;

std::unique_ptr<NcclCommunicator> NcclCommunicator::adopt(std::shared_ptr<State> state,
                                                          Ms timeout,
                                                          std::vector<std::int64_t> members) {
  std::string name = state->name;
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(std::move(name), std::move(state), timeout));
  if (!members.empty()) {
    c->state_->members = members;
    c->set_members(std::move(members));
  }
  return c;
}

int NcclCommunicator::rank() const noexcept { return state_->rank; }
int NcclCommunicator::size() const noexcept { return state_->size; }
void NcclCommunicator::set_timeout(Ms timeout) {
  Communicator::set_timeout(timeout);
  state_->timeout = timeout;
}
int NcclCommunicator::device() const noexcept { return state_->device; }
CUstream_st* NcclCommunicator::stream() const noexcept { return state_->stream; }
void NcclCommunicator::set_stream(CUstream_st* stream) noexcept {
  state_->stream = stream != nullptr ? stream : state_->own_stream;
}
ncclComm* NcclCommunicator::native() const noexcept {
  try {
    return state_->comm();
  } catch (...) {
    return nullptr;
  }
}
bool NcclCommunicator::aborted() const noexcept { return state_->is_aborted(); }
std::string NcclCommunicator::abort_reason() const { return state_->reason(); }
void NcclCommunicator::abort(const std::string& reason) noexcept { state_->abort(reason); }

namespace {

void need_rank(const State& s, const char* op, const char* what, int r) {
  if (r < 0 || r >= s.size)
    throw RankOutOfRangeError(what, "nccl " + std::string(op) + " on " + s.name + ": " + what +
                                        " " + std::to_string(r) + " is not in [0, " +
                                        std::to_string(s.size) + ")");
}

void need_buffer(const State& s, const char* op, const char* what, const void* p,
                  std::size_t count) {
  if (p == nullptr && count > 0)
    throw ConfigError(what, "nccl " + std::string(op) + " on " + s.name + ": null " + what +
                                " buffer for " + std::to_string(count) + " elements");
}

void need_tag(const State& s, const char* op, int tag) {
  if (tag < 0)
    throw ConfigError("tag", "nccl " + std::string(op) + " on " + s.name +
                                 ": tag must be >= 0, got " + std::to_string(tag));
}

void need_counts(const State& s, const char* op, const char* what,
                  std::span<const std::size_t> counts) {
  if (counts.size() != static_cast<std::size_t>(s.size))
    throw InvalidValueError(std::string(what) + "_counts",
                            "nccl " + std::string(op) + " on " + s.name + ": " + what +
                                "_counts has " + std::to_string(counts.size()) +
                                " entries, needs one per rank (" + std::to_string(s.size) + ")");
}

void need_members(const State& s, const char* op, std::span<const int> members,
                   const std::string& name, bool must_contain_self) {
  auto fail = [&](const std::string& why) {
    throw ConfigError("members", "nccl " + std::string(op) + " on " + s.name + " for " + name +
                                     ": " + why);
  };
  if (members.empty()) fail("members is empty");
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= s.size)
      fail("member " + std::to_string(members[i]) + " is not in [0, " + std::to_string(s.size) +
           ")");
    if (i > 0 && members[i] <= members[i - 1]) fail("members must be strictly ascending");
  }
  if (must_contain_self && !std::binary_search(members.begin(), members.end(), s.rank))
    fail("this rank (" + std::to_string(s.rank) +
         ") is not among the members; only members call create_group");
}

std::shared_ptr<State> new_state(ncclComm_t comm, const State& parent, const std::string& name) {
  auto s = std::make_shared<State>(comm, parent.device, name, parent.bootstrap, parent.timeout);
  return s;
}

}  // namespace

// ---- creation -----------------------------------------------------------------------------

std::unique_ptr<Communicator> NcclCommunicator::split(std::optional<std::int64_t> color,
                                                      std::int64_t key, std::string name) {
  State& s = *state_;
  s.check_usable("split");
  if (color && (*color < 0 || *color > INT_MAX))
    throw InvalidValueError("color", "nccl split on " + s.name + " for " + name + ": color " +
                                         std::to_string(*color) + " is not in [0, " +
                                         std::to_string(INT_MAX) + "]");
  if (key < INT_MIN || key > INT_MAX)
    throw InvalidValueError("key", "nccl split on " + s.name + " for " + name + ": key " +
                                       std::to_string(key) + " does not fit an int");
  count_creation();
  const DeviceGuard guard(s.device, "split", s.name);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)  // names the communicator in NCCL's logs
  config.commName = name.c_str();
#endif
  ncclComm_t child = nullptr;
  const ncclComm_t parent = s.comm();
  const int c = color ? static_cast<int>(*color) : NCCL_SPLIT_NOCOLOR;
  const Clock::time_point deadline = Clock::now() + timeout();
  ncclResult_t rc = ncclCommSplit(parent, c, static_cast<int>(key), &child, &config);
  // A nonblocking split runs as a job of the parent: the parent reports ncclInProgress until
  // the child exists (or this rank, without a color, has taken part).
  if (rc == ncclSuccess || rc == ncclInProgress) rc = settle(parent, deadline);
  const std::string target = name + (color ? " (color " + std::to_string(*color) + ")" : " (no color)");
  if (rc == ncclInProgress) {
    // Aborting the parent also stops the child's initialization.
    const std::string msg = timeout_message("split", s.name, target, timeout(), s.name, s.members);
    s.abort(msg);
    throw TimeoutError(msg);
  }
  if (rc != ncclSuccess) s.fail("split for " + target, rc);
  if (!color) {
    COMMGRID_ENFORCE(child == nullptr, "ncclCommSplit gave a communicator to a rank without color");
    return nullptr;
  }
  if (child == nullptr)
    throw BackendError("nccl split on " + s.name + " for " + target +
                       ": ncclCommSplit completed without a communicator");
  rc = settle(child, deadline);
  if (rc != ncclSuccess) {
    const std::string msg = rc == ncclInProgress
                                ? timeout_message("split", s.name, target, timeout(), name, s.members)
                                : "nccl split on " + s.name + " for " + target + ": " + nccl_text(rc, child);
    (void)ncclCommAbort(child);
    if (rc == ncclInProgress) throw TimeoutError(msg);
    throw BackendError(msg);
  }
  auto out = adopt(new_state(child, s, name), timeout(), {});
  // NCCL does not say which parent ranks joined; the members tell each other.
  const std::int64_t me = global_rank(rank());
  std::vector<std::int64_t> got(static_cast<std::size_t>(out->size()), -1);
  out->allgather(&me, got.data(), 1, DataType::int64)->wait();
  out->state_->members = got;
  out->set_members(std::move(got));
  return out;
}

std::unique_ptr<Communicator> NcclCommunicator::create_group(std::span<const int> members,
                                                             std::string name) {
  State& s = *state_;
  need_members(s, "create_group", members, name, true);
  s.check_usable("create_group");
  if (s.bootstrap == nullptr)
    throw BackendError("nccl create_group on " + s.name + " for " + name +
                       ": no bootstrap communicator");
  count_creation();
  std::vector<std::int64_t> global;
  std::vector<int> boot_ranks;
  for (int m : members) {
    global.push_back(global_rank(m));
    boot_ranks.push_back(static_cast<int>(global.back()));
  }
  const nccl_host::UniqueId id =
      nccl_host::distribute_unique_id(*s.bootstrap, boot_ranks, name, make_unique_id);
  const int mine = static_cast<int>(std::lower_bound(members.begin(), members.end(), rank()) - members.begin());
  const ncclComm_t comm = init_comm(static_cast<int>(members.size()), id, mine, s.device,
                                    "create_group", s.name, name, timeout(), global);
  return adopt(new_state(comm, s, name), timeout(), std::move(global));
}

std::unique_ptr<Communicator> NcclCommunicator::create_group_collective(std::span<const int> members,
                                                                        std::string name) {
  State& s = *state_;
  need_members(s, "create_group_collective", members, name, false);
  s.check_usable("create_group_collective");
  count_creation();
  // One record per rank: [fingerprint, ok, id..., text...]; only the first member's id and
  // text are read.
  constexpr std::size_t kIdWords = nccl_host::kUniqueIdBytes / 8, kTextWords = 25;
  constexpr std::size_t kWords = 2 + kIdWords + kTextWords;
  std::array<std::int64_t, kWords> mine{};
  mine[0] = static_cast<std::int64_t>(nccl_host::group_fingerprint(members, name));
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
    throw BackendError("nccl create_group_collective on " + s.name + " for " + name + ": rank " +
                       std::to_string(members.front()) + " could not make the NCCL unique id: " +
                       std::string(reinterpret_cast<const char*>(&leader[2 + kIdWords]),
                                   strnlen(reinterpret_cast<const char*>(&leader[2 + kIdWords]),
                                           kTextWords * 8)));
  if (!std::binary_search(members.begin(), members.end(), rank())) return nullptr;
  nccl_host::UniqueId id{};
  std::memcpy(id.data(), &leader[2], id.size());
  std::vector<std::int64_t> global;
  for (int m : members) global.push_back(global_rank(m));
  const int me = static_cast<int>(std::lower_bound(members.begin(), members.end(), rank()) - members.begin());
  const ncclComm_t comm = init_comm(static_cast<int>(members.size()), id, me, s.device,
                                    "create_group_collective", s.name, name, timeout(), global);
  return adopt(new_state(comm, s, name), timeout(), std::move(global));
}

// ---- collectives --------------------------------------------------------------------------

std::unique_ptr<Work> NcclCommunicator::barrier() {
  State& s = *state_;
  s.check_usable("barrier");
  const DeviceGuard guard(s.device, "barrier", s.name);
  if (s.barrier_buf == nullptr)
    check_cuda(cudaMalloc(&s.barrier_buf, 16), "barrier", s.name, "cudaMalloc");
  void* buf = s.barrier_buf;
  return post(state_, timeout(), "barrier", Staging{}, [&](Staging&, ncclComm_t c, cudaStream_t st) {
    return ncclAllReduce(buf, buf, 1, ncclInt32, ncclSum, c, st);
  });
}

std::unique_ptr<Work> NcclCommunicator::broadcast(void* buf, std::size_t count, DataType type,
                                                  int root) {
  need_rank(*state_, "broadcast", "root", root);
  need_buffer(*state_, "broadcast", "buf", buf, count);
  Staging st;
  st.inout(buf, bytes_of(count, type));
  return post(state_, timeout(), "broadcast", std::move(st), [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
    void* d = b.dev(buf);
    return ncclBroadcast(d, d, count, nccl_backend::nccl_type(type), root, c, stream);
  });
}

std::unique_ptr<Work> NcclCommunicator::allreduce(const void* send, void* recv, std::size_t count,
                                                  DataType type, ReduceOp op) {
  need_buffer(*state_, "allreduce", "send", send, count);
  need_buffer(*state_, "allreduce", "recv", recv, count);
  Staging st;
  st.in(send, bytes_of(count, type));
  st.out(recv, bytes_of(count, type));
  return post(state_, timeout(), "allreduce", std::move(st), [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
    return ncclAllReduce(b.dev(send), b.dev(recv), count, nccl_backend::nccl_type(type),
                         nccl_backend::nccl_op(op), c, stream);
  });
}

std::unique_ptr<Work> NcclCommunicator::allgather(const void* send, void* recv, std::size_t count,
                                                  DataType type) {
  need_buffer(*state_, "allgather", "send", send, count);
  need_buffer(*state_, "allgather", "recv", recv, count);
  const auto n = static_cast<std::size_t>(size());
  Staging st;
  st.in(send, bytes_of(count, type));
  st.out(recv, bytes_of(count * n, type));
  return post(state_, timeout(), "allgather", std::move(st), [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
    return ncclAllGather(b.dev(send), b.dev(recv), count, nccl_backend::nccl_type(type), c, stream);
  });
}

std::unique_ptr<Work> NcclCommunicator::reduce_scatter(const void* send, void* recv,
                                                       std::size_t count, DataType type,
                                                       ReduceOp op) {
  need_buffer(*state_, "reduce_scatter", "send", send, count);
  need_buffer(*state_, "reduce_scatter", "recv", recv, count);
  const auto n = static_cast<std::size_t>(size());
  Staging st;
  st.in(send, bytes_of(count * n, type));
  st.out(recv, bytes_of(count, type));
  return post(state_, timeout(), "reduce_scatter", std::move(st), [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
    return ncclReduceScatter(b.dev(send), b.dev(recv), count, nccl_backend::nccl_type(type),
                             nccl_backend::nccl_op(op), c, stream);
  });
}

std::unique_ptr<Work> NcclCommunicator::alltoall(const void* send, void* recv, std::size_t count,
                                                 DataType type) {
  need_buffer(*state_, "alltoall", "send", send, count);
  need_buffer(*state_, "alltoall", "recv", recv, count);
  if (send == recv && count > 0 && size() > 1)
    throw ConfigError("buffer", "nccl alltoall on " + name() +
                                    ": send and recv must be different buffers");
  const auto n = static_cast<std::size_t>(size());
  Staging st;
  st.in(send, bytes_of(count * n, type));
  st.out(recv, bytes_of(count * n, type));
  return post(state_, timeout(), "alltoall", std::move(st), [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
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

std::unique_ptr<Work> NcclCommunicator::alltoallv(const void* send,
                                                  std::span<const std::size_t> send_counts,
                                                  void* recv,
                                                  std::span<const std::size_t> recv_counts,
                                                  DataType type) {
  const State& s = *state_;
  need_counts(s, "alltoallv", "send", send_counts);
  need_counts(s, "alltoallv", "recv", recv_counts);
  const std::size_t send_total = std::accumulate(send_counts.begin(), send_counts.end(), std::size_t{0});
  const std::size_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
  need_buffer(s, "alltoallv", "send", send, send_total);
  need_buffer(s, "alltoallv", "recv", recv, recv_total);
  if (send == recv && send != nullptr && send_total + recv_total > 0)
    throw ConfigError("buffer", "nccl alltoallv on " + name() +
                                    ": send and recv must be different buffers");
  Staging st;
  st.in(send, bytes_of(send_total, type));
  st.out(recv, bytes_of(recv_total, type));
  return post(state_, timeout(), "alltoallv", std::move(st), [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
    const auto t = nccl_backend::nccl_type(type);
    const auto* in = static_cast<const char*>(b.dev(send));
    auto* out = static_cast<char*>(b.dev(recv));
    return grouped([&] {
      std::size_t so = 0, ro = 0;
      for (std::size_t j = 0; j < send_counts.size(); ++j) {
        ncclResult_t r = ncclSuccess;
        if (send_counts[j] > 0)
          r = ncclSend(in + bytes_of(so, type), send_counts[j], t, static_cast<int>(j), c, stream);
        if ((r == ncclSuccess || r == ncclInProgress) && recv_counts[j] > 0)
          r = ncclRecv(out + bytes_of(ro, type), recv_counts[j], t, static_cast<int>(j), c, stream);
        if (r != ncclSuccess && r != ncclInProgress) return r;
        so += send_counts[j];
        ro += recv_counts[j];
      }
      return ncclSuccess;
    });
  });
}

std::unique_ptr<Work> NcclCommunicator::allgatherv(const void* send, std::size_t count, void* recv,
                                                   std::span<const std::size_t> recv_counts,
                                                   DataType type) {
  const State& s = *state_;
  need_counts(s, "allgatherv", "recv", recv_counts);
  const std::size_t mine = recv_counts[static_cast<std::size_t>(rank())];
  if (count != mine)
    throw InvalidValueError("count", "nccl allgatherv on " + name() + ": count " +
                                         std::to_string(count) + " differs from recv_counts[" +
                                         std::to_string(rank()) + "] = " + std::to_string(mine));
  const std::size_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0});
  need_buffer(s, "allgatherv", "send", send, count);
  need_buffer(s, "allgatherv", "recv", recv, total);
  Staging st;
  st.in(send, bytes_of(count, type));
  st.out(recv, bytes_of(total, type));
  return post(state_, timeout(), "allgatherv", std::move(st), [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
    const auto t = nccl_backend::nccl_type(type);
    const void* in = b.dev(send);
    auto* out = static_cast<char*>(b.dev(recv));
    // One broadcast per rank into its block: NCCL's way to gather blocks of different sizes.
    return grouped([&] {
      std::size_t off = 0;
      for (std::size_t i = 0; i < recv_counts.size(); ++i) {
        if (recv_counts[i] > 0) {
          void* block = out + bytes_of(off, type);
          const void* from = static_cast<int>(i) == rank() ? in : block;
          const ncclResult_t r =
              ncclBroadcast(from, block, recv_counts[i], t, static_cast<int>(i), c, stream);
          if (r != ncclSuccess && r != ncclInProgress) return r;
        }
        off += recv_counts[i];
      }
      return ncclSuccess;
    });
  });
}

std::unique_ptr<Work> NcclCommunicator::reduce(const void* send, void* recv, std::size_t count,
                                               DataType type, ReduceOp op, int root) {
  need_rank(*state_, "reduce", "root", root);
  need_buffer(*state_, "reduce", "send", send, count);
  if (rank() == root) need_buffer(*state_, "reduce", "recv", recv, count);
  Staging st;
  st.in(send, bytes_of(count, type));
  if (rank() == root) st.out(recv, bytes_of(count, type));
  return post(state_, timeout(), "reduce", std::move(st), [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
    return ncclReduce(b.dev(send), rank() == root ? b.dev(recv) : nullptr, count,
                      nccl_backend::nccl_type(type), nccl_backend::nccl_op(op), root, c, stream);
  });
}

std::unique_ptr<Work> NcclCommunicator::gather(const void* send, void* recv, std::size_t count,
                                               DataType type, int root) {
  need_rank(*state_, "gather", "root", root);
  need_buffer(*state_, "gather", "send", send, count);
  const bool is_root = rank() == root;
  if (is_root) need_buffer(*state_, "gather", "recv", recv, count);
  const auto n = static_cast<std::size_t>(size());
  Staging st;
  st.in(send, bytes_of(count, type));
  if (is_root) st.out(recv, bytes_of(count * n, type));
  return post(state_, timeout(), "gather", std::move(st), [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
    const auto t = nccl_backend::nccl_type(type);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    return ncclGather(b.dev(send), is_root ? b.dev(recv) : nullptr, count, t, root, c, stream);
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

std::unique_ptr<Work> NcclCommunicator::scatter(const void* send, void* recv, std::size_t count,
                                                DataType type, int root) {
  need_rank(*state_, "scatter", "root", root);
  need_buffer(*state_, "scatter", "recv", recv, count);
  const bool is_root = rank() == root;
  if (is_root) need_buffer(*state_, "scatter", "send", send, count);
  const auto n = static_cast<std::size_t>(size());
  Staging st;
  if (is_root) st.in(send, bytes_of(count * n, type));
  st.out(recv, bytes_of(count, type));
  return post(state_, timeout(), "scatter", std::move(st), [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
    const auto t = nccl_backend::nccl_type(type);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
    return ncclScatter(is_root ? b.dev(send) : nullptr, b.dev(recv), count, t, root, c, stream);
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

std::unique_ptr<Work> NcclCommunicator::send(const void* buf, std::size_t count, DataType type,
                                             int peer, int tag) {
  auto w = isend(buf, count, type, peer, tag);
  w->wait();
  return w;
}

std::unique_ptr<Work> NcclCommunicator::recv(void* buf, std::size_t count, DataType type, int peer,
                                             int tag) {
  auto w = irecv(buf, count, type, peer, tag);
  w->wait();
  return w;
}

std::unique_ptr<Work> NcclCommunicator::isend(const void* buf, std::size_t count, DataType type,
                                              int peer, int tag) {
  const P2POp op = P2POp::send(buf, count, type, peer, tag);
  return batch_isend_irecv(std::span<const P2POp>(&op, 1));
}

std::unique_ptr<Work> NcclCommunicator::irecv(void* buf, std::size_t count, DataType type,
                                              int peer, int tag) {
  const P2POp op = P2POp::recv(buf, count, type, peer, tag);
  return batch_isend_irecv(std::span<const P2POp>(&op, 1));
}

std::unique_ptr<Work> NcclCommunicator::batch_isend_irecv(std::span<const P2POp> ops) {
  const State& s = *state_;
  Staging st;
  for (const P2POp& op : ops) {
    const char* what = op.kind == P2POp::Kind::send ? "send" : "recv";
    need_rank(s, what, "peer", op.peer);
    need_tag(s, what, op.tag);
    need_buffer(s, what, "buf", op.buf, op.count);
    if (op.kind == P2POp::Kind::send)
      st.in(op.buf, bytes_of(op.count, op.type));
    else
      st.out(op.buf, bytes_of(op.count, op.type));
  }
  const char* name_of_op = ops.size() == 1 ? (ops[0].kind == P2POp::Kind::send ? "send" : "recv")
                                           : "batch_isend_irecv";
  return post(state_, timeout(), name_of_op, std::move(st), [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
    return grouped([&] {
      for (const P2POp& op : ops) {
        if (op.count == 0) continue;
        const auto t = nccl_backend::nccl_type(op.type);
        const ncclResult_t r = op.kind == P2POp::Kind::send
                                   ? ncclSend(b.dev(op.buf), op.count, t, op.peer, c, stream)
                                   : ncclRecv(b.dev(op.buf), op.count, t, op.peer, c, stream);
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
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::unique_ptr<NcclCommunicator> make_nccl_world(Communicator& bootstrap,
                                                  const NcclOptions& options) {
  if (options.device && *options.device < 0)
    throw InvalidValueError("device", "nccl world: device must be >= 0, got " +
                                          std::to_string(*options.device));
  const Ms timeout = options.timeout.value_or(bootstrap.timeout());
  if (timeout.count() <= 0)
    throw InvalidValueError("timeout", "nccl world: timeout must be > 0 ms, got " +
                                           std::to_string(timeout.count()));
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
    check_cuda(cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()), mine.device), "create",
               "world", "cudaDeviceGetPCIBusId");
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
  const ncclComm_t comm = init_comm(bootstrap.size(), id, bootstrap.rank(), mine.device, "create",
                                    "world", "world", timeout, members);
  auto state = std::make_shared<State>(comm, mine.device, "world", &bootstrap, timeout);
  return NcclCommunicator::adopt(std::move(state), timeout, std::move(members));
}

}  // namespace commgrid
