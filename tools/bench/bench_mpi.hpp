// `commgrid bench collectives --backend mpi`: the reference side, MPI called directly on
// the communicator that commgrid's MPI world wraps.
#pragma once

#include <memory>

#include "bench/bench_runtime.hpp"
#include "commgrid/mpi.hpp"

namespace commgrid::bench {

/// Raw MPI on `world`'s native communicator. nonblocking: MPI_Iallreduce / MPI_Iallgather +
/// MPI_Wait (the algorithm commgrid's MPI backend starts); otherwise the blocking calls.
/// `world` outlives the result.
[[nodiscard]] std::unique_ptr<DirectCollectives> make_mpi_direct(MpiCommunicator& world,
                                                                 bool nonblocking);

}  // namespace commgrid::bench
