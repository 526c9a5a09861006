// The shared state of an NCCL communicator (NcclCommunicator::State): the NCCL handle, its
// device, stream and staging memory, and its abort state, shared with pending Work; and the
// epoch that aborts a world with the groups made from it. Private to the backend.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "commgrid/nccl.hpp"
#include "nccl_cuda.hpp"
#include "nccl_host.hpp"

namespace commgrid {

struct NcclCommunicator::State {
  std::string name;
  std::vector<std::int64_t> members;  // global ranks by group rank, for messages
  int device = 0;
  int rank = 0;
  int size = 0;
  nccl_backend::Ms timeout{0};        // bounds finalization in the destructor
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

  State(nccl_backend::OwnedComm&& c, int dev, std::string group, Communicator* boot,
        nccl_backend::Ms t, std::shared_ptr<const std::string> nccl_name_);
  ~State();
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
  std::optional<ncclResult_t> async_state() { return comm_.use(&nccl_backend::async_state_of); }

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
  [[noreturn]] void fail(const std::string& op, ncclResult_t rc);

  /// Checks what an NCCL call returned (nullopt: the communicator was aborted before the
  /// call). A nonblocking communicator may answer ncclInProgress while it connects; the call
  /// is then polled until it has been enqueued, bounded by the operation's deadline
  /// (TimeoutError after aborting).
  void check_call(const std::string& op, std::optional<ncclResult_t> rc,
                  nccl_backend::Clock::time_point deadline, nccl_backend::Ms timeout_of_op);

  /// Orders the next operation on the own stream after the work the calling thread queued on
  /// the legacy default stream, as a blocking stream would, without making later work on the
  /// legacy stream wait for ours. A stream the caller chose (set_stream) is the caller's to
  /// order.
  void order_after_caller(const std::string& op);

  /// NCCL's asynchronous state without waiting for another thread's call: nullopt once
  /// aborted; {busy} while another thread holds the communicator.
  std::pair<nccl_host::TryUse, std::optional<ncclResult_t>> try_async_state() {
    return comm_.try_use(&nccl_backend::async_state_of);
  }

 private:
  // Grows the pool by the seed's bytes now (allocated and freed on the own stream), so that
  // the first operations do not.
  void warm_pool();

  // Nothing here waits: CUDA destroys the stream and the pool once the work queued on them
  // and the blocks still allocated from the pool are done (cudaStreamDestroy,
  // cudaMemPoolDestroy); the cached blocks stay for the next communicator.
  void release_memory() noexcept;

  nccl_host::AbortableHandle<ncclComm_t> comm_;
  bool pinned_attached_ = false;
  bool device_attached_ = false;
};

// What the recovery functions and the world need of a communicator (a friend of
// NcclCommunicator).
struct NcclCommunicatorAccess {
  static const std::shared_ptr<NcclCommunicator::State>& state(const NcclCommunicator& c) noexcept {
    return c.state_;
  }
  static std::unique_ptr<NcclCommunicator> adopt(std::shared_ptr<NcclCommunicator::State> state,
                                                 std::chrono::milliseconds timeout,
                                                 std::vector<std::int64_t> members) {
    return NcclCommunicator::adopt(std::move(state), timeout, std::move(members));
  }
};

namespace nccl_backend {

using State = NcclCommunicator::State;
using Epoch = nccl_host::EpochMembers<State>;

// A world's state begins an epoch of its own.
void begin_epoch(const std::shared_ptr<State>& world);

}  // namespace nccl_backend

}  // namespace commgrid
