// The reduction kernels CPU backends share (Gloo's reductions, MPI's 16-bit float ops), so
// that a reduction gives the same bits on each. Not installed: backends are built in this
// tree, and users reach these through the Communicator only.
#pragma once

#include <cmath>
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
void divide_by(void* buf, std::size_t count, DataType type, Rank n);

/// One element of `Op` (not avg, which runs as engine_op(avg) = sum, then divide_by).
/// Integer sums and products wrap (two's complement) instead of overflowing, which would be
/// undefined behaviour; floating-point max and min keep NaN whichever side it is on, so a
/// NaN gradient is never hidden.
template <ReduceOp Op, class T>
T combine(T a, T b) noexcept {
  static_assert(Op != ReduceOp::avg, "avg is a sum followed by divide_by");
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    if constexpr (Op == ReduceOp::sum)
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    if constexpr (Op == ReduceOp::prod)
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    if constexpr (Op == ReduceOp::max) return a > b ? a : b;
    if constexpr (Op == ReduceOp::min) return a < b ? a : b;
  } else {
    if constexpr (Op == ReduceOp::sum) return a + b;
    if constexpr (Op == ReduceOp::prod) return a * b;
    if constexpr (Op == ReduceOp::max) return std::isnan(a) || a > b ? a : b;
    if constexpr (Op == ReduceOp::min) return std::isnan(a) || a < b ? a : b;
  }
}

/// out[i] = combine(a[i], b[i]) for n elements of a native type (out may be a or b).
/// Throws InternalError for avg (not elementwise).
template <class T>
void reduce_block(T* out, const T* a, const T* b, std::size_t n, ReduceOp op) {
  auto run = [&]<ReduceOp Op>() {
    for (std::size_t i = 0; i < n; ++i) out[i] = combine<Op>(a[i], b[i]);
  };
  switch (op) {
    case ReduceOp::sum: return run.template operator()<ReduceOp::sum>();
    case ReduceOp::prod: return run.template operator()<ReduceOp::prod>();
    case ReduceOp::max: return run.template operator()<ReduceOp::max>();
    case ReduceOp::min: return run.template operator()<ReduceOp::min>();
    case ReduceOp::avg: break;
  }
  COMMGRID_ENFORCE(false, "avg reaches the elementwise reduction");
}

/// Reduces n blocks of `count` elements each (laid out in rank order) into out, in rank
/// order, so that the result is deterministic and the same whatever the group's layout:
/// 16-bit floats in float32, rounded once at the end; avg divides the sum by n.
void reduce_blocks(const void* blocks, void* out, std::size_t count, DataType type, ReduceOp op,
                   Rank n);

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
