// The collectives of an NCCL communicator: each posts one NCCL call (or a group of them)
// on the communicator's stream, its host buffers staged.
#include <nccl.h>

#include <numeric>

#include "commgrid/nccl.hpp"
#include "engine_int.hpp"
#include "nccl_staging.hpp"
#include "nccl_state.hpp"
#include "nccl_types.hpp"
#include "nccl_work.hpp"

namespace commgrid {

using namespace nccl_backend;

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

}  // namespace commgrid
