// commgrid's element types and reductions as NCCL's. bfloat16 and float16 are NCCL types of
// their own, reduced natively on the device (no float32 round trip as on the CPU backends).
#pragma once

#include <nccl.h>

#include "commgrid/communicator.hpp"

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

}  // namespace commgrid::nccl_backend
