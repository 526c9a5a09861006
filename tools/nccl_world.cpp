#include "nccl_world.hpp"

#include "commgrid/nccl.hpp"

namespace commgrid::cli {

std::function<std::unique_ptr<Communicator>(Communicator& boot)> nccl_device_world(
    std::chrono::milliseconds timeout) {
  return [timeout](Communicator& boot) -> std::unique_ptr<Communicator> {
    NcclOptions nccl;
    nccl.bootstrap = std::shared_ptr<Communicator>(std::shared_ptr<void>(), &boot);  // lent
    nccl.timeout = timeout;
    return make_nccl_world(nccl);
  };
}

}  // namespace commgrid::cli
