// Point-to-point on an MPI communicator: send and recv waited for here (a receive that times
// out is cancelled), and the requests of isend, irecv and batch_isend_irecv as one Work.
#include <memory>
#include <string>
#include <vector>

#include "commgrid/mpi.hpp"
#include "engine_int.hpp"
#include "mpi_internal.hpp"

namespace commgrid {

using namespace mpi_backend;

std::unique_ptr<Work> MpiCommunicator::do_send(const P2POp& o) {
  // One request waited for here: the blocking send costs what MPI_Isend + MPI_Wait costs.
  check_usable("send");
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Isend(o.buf, as_int(o.count), mpi_type(o.type), detail::engine_int(o.peer), o.tag,
                  comm_, &req),
        "send");
  wait(req, "send");
  return std::make_unique<Work>();
}

std::unique_ptr<Work> MpiCommunicator::do_recv(const P2POp& o) {
  check_usable("recv");
  const int n = as_int(o.count);
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Datatype t = mpi_type(o.type);
  check(MPI_Irecv(o.buf, n, t, detail::engine_int(o.peer), o.tag, comm_, &req), "recv");
  MPI_Status status;
  try {
    wait(req, "recv", &status);
  } catch (const TimeoutError&) {
    // Unlike a collective, a receive can be cancelled, which releases the buffer and
    // leaves the communicator usable.
    MPI_Cancel(&req);
    MPI_Status cancel_status;
    MPI_Wait(&req, &cancel_status);
    int cancelled = 0;
    MPI_Test_cancelled(&cancel_status, &cancelled);
    broken_ = false;
    if (cancelled != 0)
      throw TimeoutError("mpi recv on " + name() + ": no message from rank " +
                         std::to_string(o.peer) + " with tag " + std::to_string(o.tag) +
                         " within " + std::to_string(timeout().count()) + " ms");
    status = cancel_status;  // the message arrived while we gave up: that is a success
  }
  int received = 0;
  check(MPI_Get_count(&status, t, &received), "recv");
  if (received != n)
    throw BackendError("mpi recv on " + name() + ": received " + std::to_string(received) +
                       " elements of " + std::string(datatype_name(o.type)) + " from rank " +
                       std::to_string(o.peer) + ", expected " + std::to_string(n));
  return std::make_unique<Work>();
}

namespace detail {

/// The Work of isend, irecv and batch_isend_irecv: MPI requests tested against one deadline.
class MpiP2PWork final : public Work {
 public:
  MpiP2PWork(MpiCommunicator& comm, std::string op, std::vector<P2POp> ops,
             std::vector<MPI_Request> requests, Clock::time_point deadline)
      : comm_(comm), op_(std::move(op)), ops_(std::move(ops)), requests_(std::move(requests)),
        deadline_(deadline) {}
  ~MpiP2PWork() override {
    if (waited_) return;
    try {
      wait();
    } catch (...) {
      // A destructor cannot report; wait() is where errors are seen.
    }
  }

  void wait() override {
    waited_ = true;
    for (Backoff backoff;; backoff.pause()) {
      if (test_all()) return;
      if (Clock::now() >= deadline_) time_out();
    }
  }

  [[nodiscard]] bool done() const override { return const_cast<MpiP2PWork*>(this)->test_all(); }

 private:
  // Tests every open request; a completed receive must carry exactly its count.
  bool test_all() {
    bool all = true;
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Status status;
      comm_.check(MPI_Test(&requests_[i], &flag, &status), op_.c_str());
      if (flag == 0) {
        all = false;
        continue;
      }
      const P2POp& o = ops_[i];
      if (o.kind == P2POp::Kind::recv) {
        int received = 0;
        comm_.check(MPI_Get_count(&status, mpi_type(o.type), &received), op_.c_str());
        if (static_cast<std::size_t>(received) != o.count)
          throw BackendError("mpi " + op_ + " on " + comm_.name() + ": received " +
                             std::to_string(received) + " elements of " +
                             std::string(datatype_name(o.type)) + " from " + who(o) +
                             ", expected " + std::to_string(o.count));
      }
    }
    return all;
  }

  [[nodiscard]] std::string who(const P2POp& o) const {
    return "rank " + std::to_string(o.peer) + " (global " +
           std::to_string(comm_.global_rank(o.peer)) + "), tag " + std::to_string(o.tag);
  }

  [[noreturn]] void time_out() {
    std::string pending;
    bool open_send = false;
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      const P2POp& o = ops_[i];
      pending += std::string(pending.empty() ? "" : "; ") +
                 (o.kind == P2POp::Kind::send ? "send to " : "receive from ") + who(o);
      if (o.kind == P2POp::Kind::recv) {
        // A receive can be cancelled, which gives its buffer back.
        MPI_Cancel(&requests_[i]);
        MPI_Wait(&requests_[i], MPI_STATUS_IGNORE);
      } else {
        open_send = true;
      }
    }
    // A send that was never matched stays with MPI, which may still read its buffer.
    if (open_send) comm_.broken_ = true;
    throw TimeoutError("mpi " + op_ + " on " + comm_.name() + ": timed out after " +
                       std::to_string(comm_.timeout().count()) + " ms waiting for " + pending +
                       (open_send ? "; the communicator is unusable from now on" : ""));
  }

  MpiCommunicator& comm_;
  std::string op_;
  std::vector<P2POp> ops_;
  std::vector<MPI_Request> requests_;
  Clock::time_point deadline_;
  bool waited_ = false;
};

}  // namespace detail

std::unique_ptr<Work> MpiCommunicator::do_batch_isend_irecv(std::span<const P2POp> ops,
                                                            std::string_view op_name) {
  const std::string op(op_name);
  check_usable(op.c_str());
  const auto deadline = Clock::now() + timeout();
  std::vector<MPI_Request> requests(ops.size(), MPI_REQUEST_NULL);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2POp& o = ops[i];
    const int n = as_int(o.count);
    const int peer = detail::engine_int(o.peer);
    if (o.kind == P2POp::Kind::send)
      check(MPI_Isend(o.buf, n, mpi_type(o.type), peer, o.tag, comm_, &requests[i]), op.c_str());
    else check(MPI_Irecv(o.buf, n, mpi_type(o.type), peer, o.tag, comm_, &requests[i]), op.c_str());
  }
  return std::make_unique<detail::MpiP2PWork>(*this, op, std::vector<P2POp>(ops.begin(), ops.end()),
                                              std::move(requests), deadline);
}

}  // namespace commgrid
