// The collectives of an MPI communicator: each one MPI call, blocking under the watchdog or
// nonblocking and polled until done or the timeout; avg is a sum divided here.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "commgrid/mpi.hpp"
#include "deadline_watchdog.hpp"
#include "engine_int.hpp"
#include "mpi_internal.hpp"
#include "reduce_util.hpp"

namespace commgrid {

using namespace mpi_backend;

// ---- collectives -----------------------------------------------------------------------
// Communicator checked every argument; counts fit MPI's ints (max_count()). Each collective
// is one MPI call in two forms: blocking (MpiCollectiveCalls::blocking) or nonblocking, polled
// until done or the timeout (the default).

void MpiCommunicator::set_collective_calls(MpiCollectiveCalls calls) {
  if (calls == MpiCollectiveCalls::nonblocking) {
    blocking_.reset();
    return;
  }
  if (blocking_) return;
  // Past the timeout nothing can end a blocking MPI call: one line naming it, then the job
  // ends (the other ranks are inside the same call, or gone).
  blocking_ = std::make_unique<detail::WatchedCalls>(
      timeout(), [group = name()](const std::string& op, std::chrono::milliseconds timeout) {
        std::fprintf(stderr,
                     "error: mpi %s on %s: did not complete within about %.1f s (blocking "
                     "collectives: a rank of the group did not take part; MPI cannot tell "
                     "which); aborting the job\n",
                     op.c_str(), group.c_str(), static_cast<double>(timeout.count()) / 1000.0);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        std::_Exit(1);
      });
}

MpiCollectiveCalls MpiCommunicator::collective_calls() const noexcept {
  return blocking_ ? MpiCollectiveCalls::blocking : MpiCollectiveCalls::nonblocking;
}

void MpiCommunicator::timeout_changed(std::chrono::milliseconds timeout) {
  if (blocking_) blocking_->set_timeout(timeout);
}

template <class Blocking, class Start>
void MpiCommunicator::collective(const char* op, Blocking&& blocking, Start&& start) {
  check_usable(op);
  if (blocking_) {
    const detail::WatchedCalls::Call call(*blocking_, op);
    check(blocking(), op);
    return;
  }
  MPI_Request req = MPI_REQUEST_NULL;
  check(start(&req), op);
  wait(req, op);
}

std::unique_ptr<Work> MpiCommunicator::do_barrier() {
  collective(
      "barrier", [&] { return MPI_Barrier(comm_); },
      [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_broadcast(void* buf, std::size_t count, DataType type,
                                                    Rank root_rank) {
  const int root = detail::engine_int(root_rank);
  const int n = as_int(count);
  MPI_Datatype t = mpi_type(type);
  collective(
      "broadcast", [&] { return MPI_Bcast(buf, n, t, root, comm_); },
      [&](MPI_Request* r) { return MPI_Ibcast(buf, n, t, root, comm_, r); });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_allreduce(const void* send, void* recv, std::size_t count,
                                                    DataType type, ReduceOp op) {
  const void* in = send == recv ? MPI_IN_PLACE : send;
  const int n = as_int(count);
  MPI_Datatype t = mpi_type(type);
  MPI_Op o = mpi_op(op, type);
  collective(
      "allreduce", [&] { return MPI_Allreduce(in, recv, n, t, o, comm_); },
      [&](MPI_Request* r) { return MPI_Iallreduce(in, recv, n, t, o, comm_, r); });
  if (op == ReduceOp::avg) detail::divide_by(recv, count, type, size_);
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_allgather(const void* send, void* recv, std::size_t count,
                                                    DataType type) {
  const int n = as_int(count);
  MPI_Datatype t = mpi_type(type);
  collective(
      "allgather", [&] { return MPI_Allgather(send, n, t, recv, n, t, comm_); },
      [&](MPI_Request* r) { return MPI_Iallgather(send, n, t, recv, n, t, comm_, r); });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_reduce_scatter(const void* send, void* recv,
                                                         std::size_t count, DataType type,
                                                         ReduceOp op) {
  const int n = as_int(count);
  MPI_Datatype t = mpi_type(type);
  MPI_Op o = mpi_op(op, type);
  collective(
      "reduce_scatter", [&] { return MPI_Reduce_scatter_block(send, recv, n, t, o, comm_); },
      [&](MPI_Request* r) { return MPI_Ireduce_scatter_block(send, recv, n, t, o, comm_, r); });
  if (op == ReduceOp::avg) detail::divide_by(recv, count, type, size_);
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_alltoall(const void* send, void* recv, std::size_t count,
                                                   DataType type) {
  const int n = as_int(count);
  MPI_Datatype t = mpi_type(type);
  collective(
      "alltoall", [&] { return MPI_Alltoall(send, n, t, recv, n, t, comm_); },
      [&](MPI_Request* r) { return MPI_Ialltoall(send, n, t, recv, n, t, comm_, r); });
  return std::make_unique<Work>();
}

void MpiCommunicator::v_layout(std::span<const std::size_t> counts, std::vector<int>& out_counts,
                               std::vector<int>& out_displs) {
  out_counts.resize(counts.size());
  out_displs.resize(counts.size());
  std::size_t offset = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    out_counts[i] = as_int(counts[i]);
    out_displs[i] = as_int(offset);  // the sum is within max_count() too
    offset += counts[i];
  }
}

std::unique_ptr<Work> MpiCommunicator::do_alltoallv(const void* send,
                                                    std::span<const std::size_t> send_counts,
                                                    void* recv,
                                                    std::span<const std::size_t> recv_counts,
                                                    DataType type) {
  std::vector<int> sc, sd, rc, rd;
  v_layout(send_counts, sc, sd);
  v_layout(recv_counts, rc, rd);
  MPI_Datatype t = mpi_type(type);
  collective(
      "alltoallv",
      [&] {
        return MPI_Alltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm_);
      },
      [&](MPI_Request* r) {
        return MPI_Ialltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm_,
                              r);
      });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_allgatherv(const void* send, std::size_t count,
                                                     void* recv,
                                                     std::span<const std::size_t> recv_counts,
                                                     DataType type) {
  std::vector<int> rc, rd;
  v_layout(recv_counts, rc, rd);
  const int n = as_int(count);
  MPI_Datatype t = mpi_type(type);
  collective(
      "allgatherv",
      [&] { return MPI_Allgatherv(send, n, t, recv, rc.data(), rd.data(), t, comm_); },
      [&](MPI_Request* r) {
        return MPI_Iallgatherv(send, n, t, recv, rc.data(), rd.data(), t, comm_, r);
      });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_reduce(const void* send, void* recv, std::size_t count,
                                                 DataType type, ReduceOp op, Rank root_rank) {
  const int root = detail::engine_int(root_rank);
  const bool at_root = rank_ == root;
  const void* in = at_root && send == recv ? MPI_IN_PLACE : send;
  void* out = at_root ? recv : nullptr;
  const int n = as_int(count);
  MPI_Datatype t = mpi_type(type);
  MPI_Op o = mpi_op(op, type);
  collective(
      "reduce", [&] { return MPI_Reduce(in, out, n, t, o, root, comm_); },
      [&](MPI_Request* r) { return MPI_Ireduce(in, out, n, t, o, root, comm_, r); });
  if (at_root && op == ReduceOp::avg) detail::divide_by(recv, count, type, size_);
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_gather(const void* send, void* recv, std::size_t count,
                                                 DataType type, Rank root_rank) {
  const int root = detail::engine_int(root_rank);
  void* out = rank_ == root ? recv : nullptr;
  const int n = as_int(count);
  MPI_Datatype t = mpi_type(type);
  collective(
      "gather", [&] { return MPI_Gather(send, n, t, out, n, t, root, comm_); },
      [&](MPI_Request* r) { return MPI_Igather(send, n, t, out, n, t, root, comm_, r); });
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_scatter(const void* send, void* recv, std::size_t count,
                                                  DataType type, Rank root_rank) {
  const int root = detail::engine_int(root_rank);
  const void* in = rank_ == root ? send : nullptr;
  const int n = as_int(count);
  MPI_Datatype t = mpi_type(type);
  collective(
      "scatter", [&] { return MPI_Scatter(in, n, t, recv, n, t, root, comm_); },
      [&](MPI_Request* r) { return MPI_Iscatter(in, n, t, recv, n, t, root, comm_, r); });
  return std::make_unique<Work>();
}

}  // namespace commgrid
