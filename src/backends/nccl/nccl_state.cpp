// The shared state of an NCCL communicator: creation of its stream, event and staging
// memory, bounded finalization, and the checks of what NCCL returns.
#include "nccl_state.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>

#include "nccl_staging.hpp"

namespace commgrid {

using namespace nccl_backend;
using nccl_host::timeout_message;

NcclCommunicator::State::State(OwnedComm&& c, int dev, std::string group, Communicator* boot, Ms t,
                               std::shared_ptr<const std::string> nccl_name_)
    : name(std::move(group)), device(dev), timeout(t), bootstrap(boot),
      nccl_name(std::move(nccl_name_)), comm_(std::move(c)) {
  try {
    const DeviceGuard guard(device, "create", name);
    ncclComm* const comm = comm_.peek();
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

NcclCommunicator::State::~State() {
  const DeviceGuard guard(device);
  if (ncclComm* const c = comm_.release(); c != nullptr) {
    // Finalize flushes what is still queued; bounded by the timeout, then aborted.
    ncclResult_t rc = ncclCommFinalize(c);
    if (rc == ncclSuccess || rc == ncclInProgress) rc = settle_own(c, Clock::now() + timeout).rc;
    if (rc == ncclSuccess) (void)ncclCommDestroy(c);
    else (void)ncclCommAbort(c);
  }
  release_memory();
}

void NcclCommunicator::State::fail(const std::string& op, ncclResult_t rc) {
  const std::string msg = "nccl " + op + " on " + name + ": " + nccl_text(rc);
  abort(msg);
  throw BackendError(msg + "; communicator aborted");
}

void NcclCommunicator::State::check_call(const std::string& op, std::optional<ncclResult_t> rc,
                                         Clock::time_point deadline, Ms timeout_of_op) {
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

void NcclCommunicator::State::order_after_caller(const std::string& op) {
  if (stream != own_stream) return;
  check_cuda(cudaEventRecord(caller_done, cudaStreamLegacy), op, name, "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(stream, caller_done, 0), op, name, "cudaStreamWaitEvent");
}

void NcclCommunicator::State::warm_pool() {
  std::size_t bytes = 0;
  for (const nccl_host::Seed& s : kStagingSeed) bytes += s.cls * s.per_user;
  void* p = nullptr;
  check_cuda(cudaMallocFromPoolAsync(&p, bytes, pool, own_stream), "create", name,
             "cudaMallocFromPoolAsync");
  check_cuda(cudaFreeAsync(p, own_stream), "create", name, "cudaFreeAsync");
}

void NcclCommunicator::State::release_memory() noexcept {
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

void nccl_backend::begin_epoch(const std::shared_ptr<State>& world) {
  world->epoch =
      std::make_shared<Epoch>([](State& s, const std::string& why) { return s.abort_now(why); });
  world->epoch->add(world);
}

}  // namespace commgrid
