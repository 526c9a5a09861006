// The NCCL world: the devices and version this process sees, make_nccl_world over a
// bootstrap communicator, and the world factory whose epochs end one another.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <array>
#include <mutex>
#include <numeric>
#include <utility>

#include "commgrid/nccl.hpp"
#include "engine_int.hpp"
#include "nccl_create.hpp"
#include "nccl_cuda.hpp"
#include "nccl_host.hpp"
#include "nccl_state.hpp"
#include "nccl_types.hpp"

namespace commgrid {

using namespace nccl_backend;

namespace {

std::string host_name() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf.data();
}

}  // namespace

int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return "no CUDA device (cudaGetDeviceCount: " + std::string(cudaGetErrorString(e)) + ")";
  }
  if (n == 0) return "no CUDA device (cudaGetDeviceCount found none)";
  return "";
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // Since 2.9 the code is major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

std::unique_ptr<NcclCommunicator> make_nccl_world(const NcclOptions& options) {
  if (!options.bootstrap)
    throw InvalidValueError("bootstrap", "nccl world: no bootstrap communicator");
  Communicator& bootstrap = *options.bootstrap;
  if (options.device && *options.device < 0)
    throw InvalidValueError(
        "device", "nccl world: device must be >= 0, got " + std::to_string(*options.device));
  const Ms timeout = options.timeout.value_or(bootstrap.timeout());
  if (timeout.count() <= 0)
    throw InvalidValueError(
        "timeout", "nccl world: timeout must be > 0 ms, got " + std::to_string(timeout.count()));
  nccl_host::check_nccl_environment("nccl world");
  // Two exchanges over the bootstrap: host names (for the local rank), then each rank's
  // device or the reason it has none, so that every rank fails alike instead of some waiting
  // for an id that others never join.
  nccl_host::HostInfo mine;
  mine.host = host_name();
  mine.device_count = cuda_device_count();
  const std::vector<nccl_host::HostInfo> hosts = nccl_host::exchange_host_info(bootstrap, mine);
  const nccl_host::LocalRank local = nccl_host::local_rank_of(hosts, bootstrap.rank());
  try {
    mine.device = nccl_host::choose_device(options.device, local, mine.device_count, mine.host,
                                           cuda_unavailable_reason());
    check_cuda(cudaSetDevice(mine.device), "create", "world", "cudaSetDevice");
    std::array<char, 32> bus{};
    check_cuda(cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()), mine.device),
               "create", "world", "cudaDeviceGetPCIBusId");
    mine.bus_id = bus.data();
  } catch (const Error& e) {
    mine.problem = e.what();
    mine.device = -1;
  }
  const std::vector<nccl_host::HostInfo> all = nccl_host::exchange_host_info(bootstrap, mine);
  const std::string problem = nccl_host::world_problem(all);
  if (!problem.empty()) throw BackendError("nccl world: " + problem);

  const nccl_host::UniqueId id =
      nccl_host::broadcast_unique_id(bootstrap, 0, make_unique_id, "create world");
  std::vector<std::int64_t> members(static_cast<std::size_t>(bootstrap.size()));
  std::iota(members.begin(), members.end(), std::int64_t{0});
  const nccl_backend::CommConfig cfg = nccl_backend::nonblocking_config("world");
  OwnedComm comm =
      init_comm(detail::engine_int(bootstrap.size()), id, detail::engine_int(bootstrap.rank()),
                mine.device, "create", "world", cfg, timeout, members);
  auto state =
      std::make_shared<State>(std::move(comm), mine.device, "world", &bootstrap, timeout, cfg.name);
  state->owned_bootstrap = options.bootstrap;
  begin_epoch(state);
  return NcclCommunicatorAccess::adopt(std::move(state), timeout, std::move(members));
}

NcclWorldFactory make_nccl_world_factory(NcclWorldFactory bootstrap, NcclOptions options) {
  if (!bootstrap)
    throw InvalidValueError("bootstrap", "make_nccl_world_factory: no bootstrap factory");
  if (options.bootstrap)
    throw InvalidValueError("bootstrap",
                            "make_nccl_world_factory: options.bootstrap is set; each epoch's "
                            "bootstrap comes from the bootstrap factory");
  // The epochs this factory made, by prefix: a call for another prefix ends them.
  struct Made {
    std::mutex mutex;
    std::vector<std::pair<std::string, std::weak_ptr<Epoch>>> epochs;
  };
  auto made = std::make_shared<Made>();
  return [bootstrap = std::move(bootstrap), options = std::move(options), made](
             const std::string& prefix, Rank rank, Rank size) -> std::unique_ptr<Communicator> {
    std::vector<std::shared_ptr<Epoch>> over;
    {
      std::lock_guard lock(made->mutex);
      std::erase_if(made->epochs, [&](const auto& e) {
        if (e.first == prefix) return e.second.expired();
        if (auto alive = e.second.lock()) over.push_back(std::move(alive));
        return true;
      });
    }
    for (const auto& e : over)
      (void)e->abort_all("nccl: the epoch is over; the world of " + prefix + " replaces it");
    std::shared_ptr<Communicator> boot(bootstrap(prefix, rank, size));
    if (!boot)
      throw InvalidValueError("bootstrap", "nccl world factory for " + prefix +
                                               ": the bootstrap factory returned no communicator");
    if (boot->rank() != rank || boot->size() != size)
      throw InvalidValueError(
          "bootstrap", "nccl world factory for " + prefix + ": the bootstrap factory made rank " +
                           std::to_string(boot->rank()) + " of " + std::to_string(boot->size()) +
                           " for rank " + std::to_string(rank) + " of " + std::to_string(size));
    NcclOptions epoch = options;
    epoch.bootstrap = std::move(boot);
    auto world = make_nccl_world(epoch);
    {
      std::lock_guard lock(made->mutex);
      made->epochs.emplace_back(prefix, NcclCommunicatorAccess::state(*world)->epoch);
    }
    return world;
  };
}

}  // namespace commgrid
