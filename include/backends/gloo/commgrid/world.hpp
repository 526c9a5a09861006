// The Gloo world of a process started by any launcher (commgrid launch, torchrun, srun,
// mpirun, Hydra). Link commgrid::gloo.
#pragma once

#include <memory>

#include "commgrid/communicator.hpp"
#include "commgrid/gloo.hpp"
#include "commgrid/launch_info.hpp"

namespace commgrid {

/// Creates the world of this process from its launcher: read_launch_info, the store from
/// its URL under the job id with the job's token, and a Gloo world. COMMGRID_TIMEOUT
/// overrides options.timeout and COMMGRID_GLOO_HOSTNAME options.hostname. A tcp:// store
/// is served by rank 0 (it listens on MASTER_PORT) and rank 0's Gloo listens on the
/// store's interface.
std::unique_ptr<Communicator> make_world(GlooOptions options = {});

}  // namespace commgrid
