// The NCCL backend's small tools around CUDA and NCCL calls: error texts and checks, the
// device guard, polling a nonblocking communicator against a deadline, and the owner of a
// communicator that is not yet handed on. Private to the backend's sources.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "commgrid/error.hpp"

namespace commgrid::nccl_backend {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

inline std::string cuda_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// Throws BackendError "nccl <op> on <group>: <call>: <CUDA's text>"; clears CUDA's sticky
// last error so that a later call does not report this one again.
inline void check_cuda(cudaError_t e, const std::string& op, const std::string& group,
                       const char* call) {
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
inline std::string nccl_text(ncclResult_t rc) {
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
inline ncclResult_t async_state_of(ncclComm_t comm) {
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
inline Settled settle_own(ncclComm_t comm, Clock::time_point deadline) {
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

}  // namespace commgrid::nccl_backend
