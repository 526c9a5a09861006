// Point-to-point on an NCCL communicator: batch_isend_irecv as one NCCL group of sends and
// receives (send, recv, isend and irecv reach it through the Communicator contract).
#include <nccl.h>

#include "commgrid/nccl.hpp"
#include "engine_int.hpp"
#include "nccl_staging.hpp"
#include "nccl_state.hpp"
#include "nccl_types.hpp"
#include "nccl_work.hpp"

namespace commgrid {

using namespace nccl_backend;

// ---- point to point -------------------------------------------------------------------

std::unique_ptr<Work> NcclCommunicator::do_batch_isend_irecv(std::span<const P2POp> ops,
                                                             std::string_view op_name) {
  Staging st;
  for (const P2POp& op : ops) {
    if (op.kind == P2POp::Kind::send) st.in(op.buf, bytes_of(op.count, op.type), "buf");
    else st.out(op.buf, bytes_of(op.count, op.type), "buf");
  }
  return post(
      state_, timeout(), std::string(op_name), std::move(st),
      [&](Staging& b, ncclComm_t c, cudaStream_t stream) {
        return grouped([&] {
          for (const P2POp& op : ops) {
            if (op.count == 0) continue;
            const auto t = nccl_backend::nccl_type(op.type);
            const ncclResult_t r =
                op.kind == P2POp::Kind::send
                    ? ncclSend(b.dev(op.buf), op.count, t, detail::engine_int(op.peer), c, stream)
                    : ncclRecv(b.dev(op.buf), op.count, t, detail::engine_int(op.peer), c, stream);
            if (r != ncclSuccess && r != ncclInProgress) return r;
          }
          return ncclSuccess;
        });
      });
}

}  // namespace commgrid
