// The Work of an NCCL operation: one look at its CUDA event and NCCL's asynchronous state
// at a time, waited for against the operation's deadline.
#include <cuda_runtime_api.h>

#include "nccl_work.hpp"

namespace commgrid::nccl_backend {

using nccl_host::timeout_message;

namespace {

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

}  // namespace

std::unique_ptr<Work> make_work(std::shared_ptr<State> state, std::string op, Ms timeout,
                                Clock::time_point deadline, Staging staging) {
  return std::make_unique<NcclWork>(std::move(state), std::move(op), timeout, deadline,
                                    std::move(staging));
}

}  // namespace commgrid::nccl_backend
