// Helpers that CPU backends share for reductions. Not installed: backends are built in this
// tree, and users reach these through the Communicator only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "commgrid/communicator.hpp"

namespace commgrid::detail {

/// Whether values of the type travel as 16 bits but are reduced in float32.
constexpr bool is_half(DataType t) noexcept {
  return t == DataType::bfloat16 || t == DataType::float16;
}

/// The op a backend runs for `op`: avg runs as sum, then divide_by().
constexpr ReduceOp engine_op(ReduceOp op) noexcept {
  return op == ReduceOp::avg ? ReduceOp::sum : op;
}

/// 16-bit floats widened to float32, and narrowed back (round to nearest even).
std::vector<float> widen_half(const void* buf, std::size_t count, DataType type);
void narrow_half(const float* wide, void* buf, std::size_t count, DataType type);

/// buf[i] /= n for count elements of `type` (avg after a sum). Integers truncate toward
/// zero; 16-bit floats are divided in float32 and rounded once.
void divide_by(void* buf, std::size_t count, DataType type, int n);

/// Calls fn(T{}) with the C++ type that holds one element of a type that is not 16-bit
/// float (float, double, int32, int64, int8, uint8).
template <class F>
void dispatch_native(DataType type, F&& fn) {
  switch (type) {
    case DataType::float32: fn(float{}); return;
    case DataType::float64: fn(double{}); return;
    case DataType::int32: fn(std::int32_t{}); return;
    case DataType::int64: fn(std::int64_t{}); return;
    case DataType::int8: fn(std::int8_t{}); return;
    case DataType::uint8: fn(std::uint8_t{}); return;
    case DataType::bfloat16:
    case DataType::float16: break;
  }
  COMMGRID_ENFORCE(false, "dispatch_native called for a 16-bit float type");
}

}  // namespace commgrid::detail
