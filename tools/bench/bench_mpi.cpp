#include "bench/bench_mpi.hpp"

#include <string>
#include <vector>

#include "commgrid/error.hpp"

namespace commgrid::bench {
namespace {

/// MPI called directly on the same communicator that commgrid's world wraps.
class MpiDirect final : public DirectCollectives {
 public:
  /// nonblocking: MPI_Iallreduce + MPI_Wait, the same MPI algorithm that commgrid's MPI
  /// backend starts (it polls MPI_Test for its timeout), so that only commgrid's own cost
  /// differs; otherwise the blocking calls, which Open MPI may serve with another algorithm.
  MpiDirect(MPI_Comm comm, bool nonblocking) : comm_(comm), nonblocking_(nonblocking) {}
  void allreduce(const float* send, float* recv, std::size_t count) override {
    const int n = static_cast<int>(count);
    if (!nonblocking_) {
      check(MPI_Allreduce(send, recv, n, MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce");
      return;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(send, recv, n, MPI_FLOAT, MPI_SUM, comm_, &req), "MPI_Iallreduce");
    check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  void allgather(const float* send, float* recv, std::size_t count) override {
    const int n = static_cast<int>(count);
    if (!nonblocking_) {
      check(MPI_Allgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_), "MPI_Allgather");
      return;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Iallgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_, &req), "MPI_Iallgather");
    check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  void pingpong(float* buf, std::size_t count, int peer, bool initiator) override {
    const int n = static_cast<int>(count);
    for (int leg = 0; leg < 2; ++leg) {
      MPI_Request req = MPI_REQUEST_NULL;
      if ((leg == 0) == initiator)
        check(MPI_Isend(buf, n, MPI_FLOAT, peer, 0, comm_, &req), "MPI_Isend");
      else check(MPI_Irecv(buf, n, MPI_FLOAT, peer, 0, comm_, &req), "MPI_Irecv");
      check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
    }
  }
  void exchange(const float* send, float* recv, std::size_t count, int peer) override {
    const int n = static_cast<int>(count);
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    check(MPI_Isend(send, n, MPI_FLOAT, peer, 0, comm_, &reqs[0]), "MPI_Isend");
    check(MPI_Irecv(recv, n, MPI_FLOAT, peer, 0, comm_, &reqs[1]), "MPI_Irecv");
    check(MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE), "MPI_Waitall");
  }
  void alltoallv(const float* send, const std::vector<std::size_t>& send_counts, float* recv,
                 const std::vector<std::size_t>& recv_counts) override {
    std::vector<int> sc, sd, rc, rd;
    for (std::size_t i = 0, s = 0, r = 0; i < send_counts.size(); ++i) {
      sc.push_back(static_cast<int>(send_counts[i]));
      sd.push_back(static_cast<int>(s));
      rc.push_back(static_cast<int>(recv_counts[i]));
      rd.push_back(static_cast<int>(r));
      s += send_counts[i];
      r += recv_counts[i];
    }
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(),
                         MPI_FLOAT, comm_, &req),
          "MPI_Ialltoallv");
    check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  [[nodiscard]] std::string description() const override {
    return nonblocking_
               ? "MPI_Iallreduce / MPI_Iallgather + MPI_Wait; MPI_Isend/Irecv; MPI_Ialltoallv"
               : "MPI_Allreduce / MPI_Allgather; MPI_Isend/Irecv; MPI_Ialltoallv";
  }

 private:
  static void check(int rc, const char* op) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw BackendError(std::string("bench: direct ") + op + ": " + std::string(text, len));
  }
  MPI_Comm comm_;
  bool nonblocking_;
};

}  // namespace

std::unique_ptr<DirectCollectives> make_mpi_direct(MpiCommunicator& world, bool nonblocking) {
  return std::make_unique<MpiDirect>(world.native(), nonblocking);
}

}  // namespace commgrid::bench
