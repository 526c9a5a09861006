#include "commgrid/communicator.hpp"

#include <bit>

namespace commgrid {

std::string_view datatype_name(DataType t) noexcept {
  switch (t) {
    case DataType::float32: return "float32";
    case DataType::float64: return "float64";
    case DataType::bfloat16: return "bfloat16";
    case DataType::int32: return "int32";
    case DataType::int64: return "int64";
  }
  return "unknown";
}

std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::prod: return "prod";
  }
  return "unknown";
}

float bf16_to_float(std::uint16_t v) noexcept {
  // bfloat16 is the upper half of a float32, so widening is exact.
  return std::bit_cast<float>(static_cast<std::uint32_t>(v) << 16);
}

std::uint16_t float_to_bf16(float f) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(f);
  // NaN: truncating could clear every mantissa bit left and turn it into infinity, so keep
  // the sign and force the quiet bit instead.
  if ((bits & 0x7fffffffU) > 0x7f800000U)
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040U);
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit. A carry into the
  // exponent is the correct result (up to infinity for values above the largest bfloat16).
  const std::uint32_t rounding = 0x7fffU + ((bits >> 16) & 1U);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

}  // namespace commgrid
