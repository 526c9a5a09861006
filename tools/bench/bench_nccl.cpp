#include "bench/bench_nccl.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>
#include <thread>
#include <vector>

#include "commgrid/error.hpp"

namespace commgrid::bench {
namespace {

class NcclDirect final : public DirectCollectives {
 public:
  NcclDirect(NcclCommunicator& world, std::chrono::milliseconds timeout)
      : world_(world), timeout_(timeout) {
    cuda("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~NcclDirect() override { (void)cudaEventDestroy(done_); }
  NcclDirect(const NcclDirect&) = delete;
  NcclDirect& operator=(const NcclDirect&) = delete;

  void allreduce(const float* send, float* recv, std::size_t count) override {
    nccl("ncclAllReduce", ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm(), stream()));
    finish("allreduce");
  }
  void allgather(const float* send, float* recv, std::size_t count) override {
    nccl("ncclAllGather", ncclAllGather(send, recv, count, ncclFloat32, comm(), stream()));
    finish("allgather");
  }
  void pingpong(float* buf, std::size_t count, int peer, bool initiator) override {
    for (int leg = 0; leg < 2; ++leg) {  // each leg blocking, as commgrid's send and recv
      if ((leg == 0) == initiator)
        nccl("ncclSend", ncclSend(buf, count, ncclFloat32, peer, comm(), stream()));
      else nccl("ncclRecv", ncclRecv(buf, count, ncclFloat32, peer, comm(), stream()));
      finish("pingpong");
    }
  }
  void exchange(const float* send, float* recv, std::size_t count, int peer) override {
    nccl("ncclGroupStart", ncclGroupStart());
    nccl("ncclSend", ncclSend(send, count, ncclFloat32, peer, comm(), stream()));
    nccl("ncclRecv", ncclRecv(recv, count, ncclFloat32, peer, comm(), stream()));
    nccl("ncclGroupEnd", ncclGroupEnd());
    finish("exchange");
  }
  void alltoallv(const float* send, const std::vector<std::size_t>& send_counts, float* recv,
                 const std::vector<std::size_t>& recv_counts) override {
    nccl("ncclGroupStart", ncclGroupStart());
    std::size_t so = 0, ro = 0;
    for (std::size_t j = 0; j < send_counts.size(); ++j) {
      const int peer = static_cast<int>(j);
      if (send_counts[j] > 0)
        nccl("ncclSend", ncclSend(send + so, send_counts[j], ncclFloat32, peer, comm(), stream()));
      if (recv_counts[j] > 0)
        nccl("ncclRecv", ncclRecv(recv + ro, recv_counts[j], ncclFloat32, peer, comm(), stream()));
      so += send_counts[j];
      ro += recv_counts[j];
    }
    nccl("ncclGroupEnd", ncclGroupEnd());
    finish("alltoallv");
  }
  [[nodiscard]] std::string description() const override {
    return "ncclAllReduce / ncclAllGather / ncclSend+ncclRecv (grouped for exchange and "
           "alltoallv) on the world's NCCL communicator and stream, a CUDA event polled after "
           "each";
  }
  std::shared_ptr<float> buffer(std::size_t count, float value) override {
    cuda("cudaSetDevice", cudaSetDevice(world_.device()));
    void* p = nullptr;
    cuda("cudaMalloc", cudaMalloc(&p, count * sizeof(float)));
    std::shared_ptr<float> b(static_cast<float*>(p), [](float* q) { (void)cudaFree(q); });
    const std::vector<float> fill(count, value);
    cuda("cudaMemcpy", cudaMemcpy(p, fill.data(), count * sizeof(float), cudaMemcpyHostToDevice));
    return b;
  }

 private:
  ncclComm_t comm() {
    ncclComm_t c = world_.native();
    if (c == nullptr)
      throw BackendError("bench: direct nccl: the world was aborted: " + world_.abort_reason());
    return c;
  }
  [[nodiscard]] cudaStream_t stream() const { return world_.stream(); }

  static void cuda(const char* call, cudaError_t e) {
    if (e == cudaSuccess) return;
    (void)cudaGetLastError();
    throw BackendError(std::string("bench: direct nccl: ") + call + ": " + cudaGetErrorString(e));
  }
  // The world is a nonblocking communicator: a call may answer ncclInProgress until it is
  // enqueued; anything else is an error.
  void nccl(const char* call, ncclResult_t rc) {
    if (rc == ncclSuccess) return;
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (rc == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      ncclResult_t state = ncclSuccess;
      rc = ncclCommGetAsyncError(comm(), &state);
      if (rc == ncclSuccess) rc = state;
      if (rc == ncclInProgress) std::this_thread::yield();
    }
    if (rc == ncclSuccess) return;
    const std::string msg =
        std::string("bench: direct nccl: ") + call + ": " +
        (rc == ncclInProgress ? "not enqueued in time" : ncclGetErrorString(rc));
    world_.abort(msg);
    throw BackendError(msg);
  }
  void finish(const char* op) {
    cuda("cudaEventRecord", cudaEventRecord(done_, stream()));
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      const cudaError_t e = cudaEventQuery(done_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) cuda("cudaEventQuery", e);
      if (std::chrono::steady_clock::now() >= deadline) {
        const std::string msg =
            std::string("bench: direct nccl ") + op + ": did not complete in time";
        world_.abort(msg);
        throw TimeoutError(msg);
      }
      std::this_thread::yield();
    }
  }

  NcclCommunicator& world_;
  std::chrono::milliseconds timeout_;
  cudaEvent_t done_ = nullptr;
};

}  // namespace

std::unique_ptr<DirectCollectives> make_nccl_direct(NcclCommunicator& world,
                                                    std::chrono::milliseconds timeout) {
  return std::make_unique<NcclDirect>(world, timeout);
}

}  // namespace commgrid::bench
