// commgrid's element types and reductions as NCCL's. bfloat16 and float16 are NCCL types of
// their own, reduced natively on the device (no float32 round trip as on the CPU backends).
#pragma once

#include <nccl.h>

#include <memory>
#include <string>

#include "commgrid/communicator.hpp"

// ncclCommShrink (NCCL 2.27 and later) makes the next world from the survivors; without it,
// or with COMMGRID_NCCL_NO_SHRINK defined (to build and test the other path), a new world
// is made over a bootstrap of the survivors. Chosen at compile time (nccl_shrink_method()).
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0) && !defined(COMMGRID_NCCL_NO_SHRINK)
#define COMMGRID_NCCL_HAS_SHRINK 1
#else
#define COMMGRID_NCCL_HAS_SHRINK 0
#endif

namespace commgrid::nccl_backend {

constexpr ncclDataType_t nccl_type(DataType t) noexcept {
  switch (t) {
    case DataType::float32: return ncclFloat32;
    case DataType::float64: return ncclFloat64;
    case DataType::bfloat16: return ncclBfloat16;
    case DataType::int32: return ncclInt32;
    case DataType::int64: return ncclInt64;
    case DataType::float16: return ncclFloat16;
    case DataType::int8: return ncclInt8;
    case DataType::uint8: return ncclUint8;
  }
  return ncclNumTypes;  // unreachable for a valid DataType; NCCL rejects it
}

/// avg is NCCL's ncclAvg: the sum divided by the group size (integer division on integers).
constexpr ncclRedOp_t nccl_op(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::prod: return ncclProd;
    case ReduceOp::avg: return ncclAvg;
  }
  return ncclNumOps;
}

/// A nonblocking NCCL configuration that names the communicator in NCCL's logs.
/// NCCL copies the configuration but keeps config.commName's pointer for the communicator's
/// life (comm->config.commName, which it hands to a profiler plugin), so the name lives
/// here, on the heap: whoever keeps the communicator keeps `name` until it is destroyed or
/// aborted. Copying or moving a CommConfig keeps config.commName valid.
struct CommConfig {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  std::shared_ptr<const std::string> name;
};

/// Also splitShare = 0 (and shrinkShare = 0): a split's (or shrink's) child has resources
/// (and an abort flag) of its own, so that aborting one communicator never aborts another. NCCL's
/// environment variables override both (nccl_host::check_nccl_environment refuses them).
inline CommConfig nonblocking_config(std::string name) {
  CommConfig c;
  c.config.blocking = 0;
  c.config.splitShare = 0;
  c.name = std::make_shared<const std::string>(std::move(name));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  c.config.commName = c.name->c_str();
  c.config.shrinkShare = 0;  // a shrunk world outlives the old one, which is aborted
#endif
  return c;
}

}  // namespace commgrid::nccl_backend
