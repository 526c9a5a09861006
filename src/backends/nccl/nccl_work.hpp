// Posting one operation on an NCCL communicator (order, stage, enqueue, record) and the Work
// that polls its CUDA event and NCCL's asynchronous error against the timeout. Private to the
// backend.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "commgrid/communicator.hpp"
#include "nccl_cuda.hpp"
#include "nccl_staging.hpp"
#include "nccl_state.hpp"

namespace commgrid::nccl_backend {

/// The Work of an operation just enqueued on `state`'s stream: records its event; wait()
/// polls it until `deadline`, then aborts the communicator (TimeoutError).
std::unique_ptr<Work> make_work(std::shared_ptr<State> state, std::string op, Ms timeout,
                                Clock::time_point deadline, Staging staging);

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
  CUstream_st* const stream = s->stream;
  staging.stage(*s, stream, op);
  s->check_call(op, s->use([&](ncclComm_t comm) { return enqueue(staging, comm, stream); }),
                deadline, timeout);
  staging.unstage(op, s->name);
  return make_work(s, op, timeout, deadline, std::move(staging));
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

inline std::size_t bytes_of(std::size_t count, DataType t) { return count * element_size(t); }

}  // namespace commgrid::nccl_backend
