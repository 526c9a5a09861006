#include "commgrid/communicator.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <type_traits>

#include "commgrid/error.hpp"
#include "reduce_util.hpp"

namespace commgrid {

std::string_view datatype_name(DataType t) noexcept {
  switch (t) {
    case DataType::float32: return "float32";
    case DataType::float64: return "float64";
    case DataType::bfloat16: return "bfloat16";
    case DataType::int32: return "int32";
    case DataType::int64: return "int64";
    case DataType::float16: return "float16";
    case DataType::int8: return "int8";
    case DataType::uint8: return "uint8";
  }
  return "unknown";
}

std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::prod: return "prod";
    case ReduceOp::avg: return "avg";
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

float fp16_to_float(std::uint16_t v) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(v & 0x8000U) << 16;
  const std::uint32_t exp = (v >> 10) & 0x1fU;
  std::uint32_t mant = v & 0x3ffU;
  if (exp == 0x1f)  // infinity or NaN: all-ones exponent, mantissa kept
    return std::bit_cast<float>(sign | 0x7f800000U | (mant << 13));
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112U) << 23) | (mant << 13));
  if (mant == 0) return std::bit_cast<float>(sign);
  // Subnormal half: normalize into a float32 exponent.
  int e = -1;
  do {
    ++e;
    mant <<= 1;
  } while ((mant & 0x400U) == 0);
  return std::bit_cast<float>(sign | (static_cast<std::uint32_t>(112 - e) << 23) |
                              ((mant & 0x3ffU) << 13));
}

std::uint16_t float_to_fp16(float f) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000U);
  const std::uint32_t abs = bits & 0x7fffffffU;
  if (abs > 0x7f800000U) return static_cast<std::uint16_t>(sign | 0x7e00U);  // NaN stays NaN
  if (abs >= 0x477ff000U) return static_cast<std::uint16_t>(sign | 0x7c00U);  // rounds to inf
  if (abs < 0x38800000U) {
    // Below the smallest normal half (2^-14): a subnormal or zero. Shift the full
    // significand right and round to nearest even on the bits shifted out.
    if (abs < 0x33000000U) return sign;  // below half the smallest subnormal: zero
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t mant = (abs & 0x7fffffU) | 0x800000U;
    const std::uint32_t shift = 126U - exp;  // 14 + (127 - exp) - 1 ... into 10 bits
    std::uint32_t half = mant >> shift;
    const std::uint32_t rest = mant & ((1U << shift) - 1U);
    const std::uint32_t midpoint = 1U << (shift - 1U);
    if (rest > midpoint || (rest == midpoint && (half & 1U) != 0)) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even; a
  // carry into the exponent is the right result.
  const std::uint32_t rebased = abs - 0x38000000U;  // exponent 127 -> 15
  const std::uint32_t rounded = rebased + 0xfffU + ((rebased >> 13) & 1U);
  return static_cast<std::uint16_t>(sign | (rounded >> 13));
}

namespace detail {

std::vector<float> widen_half(const void* buf, std::size_t count, DataType type) {
  const auto* p = static_cast<const std::uint16_t*>(buf);
  std::vector<float> wide(count);
  for (std::size_t i = 0; i < count; ++i)
    wide[i] = type == DataType::bfloat16 ? bf16_to_float(p[i]) : fp16_to_float(p[i]);
  return wide;
}

void narrow_half(const float* wide, void* buf, std::size_t count, DataType type) {
  auto* p = static_cast<std::uint16_t*>(buf);
  for (std::size_t i = 0; i < count; ++i)
    p[i] = type == DataType::bfloat16 ? float_to_bf16(wide[i]) : float_to_fp16(wide[i]);
}

void divide_by(void* buf, std::size_t count, DataType type, int n) {
  if (n <= 1 || count == 0) return;
  if (is_half(type)) {
    std::vector<float> wide = widen_half(buf, count, type);
    for (float& v : wide) v /= static_cast<float>(n);
    narrow_half(wide.data(), buf, count, type);
    return;
  }
  dispatch_native(type, [&](auto zero) {
    using T = decltype(zero);
    auto* p = static_cast<T*>(buf);
    if constexpr (std::is_integral_v<T>) {
      for (std::size_t i = 0; i < count; ++i)
        p[i] = static_cast<T>(static_cast<std::int64_t>(p[i]) / n);
    } else {
      for (std::size_t i = 0; i < count; ++i) p[i] = p[i] / static_cast<T>(n);
    }
  });
}

}  // namespace detail

const std::vector<std::int64_t>& Communicator::members() const {
  if (members_.empty()) {
    members_.resize(static_cast<std::size_t>(size()));
    std::iota(members_.begin(), members_.end(), std::int64_t{0});
  }
  return members_;
}

std::int64_t Communicator::global_rank(int group_rank) const {
  if (group_rank < 0 || group_rank >= size())
    throw RankOutOfRangeError("group_rank", std::string(backend()) + " global_rank on " + name() +
                                                ": group rank " + std::to_string(group_rank) +
                                                " is not in [0, " + std::to_string(size()) + ")");
  return members()[static_cast<std::size_t>(group_rank)];
}

int Communicator::group_rank(std::int64_t global) const {
  const auto& m = members();
  const auto it = std::find(m.begin(), m.end(), global);
  if (it == m.end())
    throw RankOutOfRangeError("global_rank", std::string(backend()) + " group_rank on " + name() +
                                                 ": global rank " + std::to_string(global) +
                                                 " is not a member of " + name());
  return static_cast<int>(it - m.begin());
}

void Communicator::check_typed(const char* op, const char* what, std::size_t have,
                               std::size_t need) const {
  if (have != need)
    throw InvalidValueError(what, std::string(backend()) + " " + op + " on " + name() + ": " +
                                      what + " holds " + std::to_string(have) +
                                      " elements, needs " + std::to_string(need) + " (group of " +
                                      std::to_string(size()) + ")");
}

void Communicator::check_counts(const char* op, const char* what, std::size_t have,
                                std::span<const std::size_t> counts) const {
  const std::string subject = std::string(backend()) + " " + op + " on " + name() + ": ";
  if (counts.size() != group_size())
    throw InvalidValueError(std::string(what) + "_counts",
                            subject + what + "_counts has " + std::to_string(counts.size()) +
                                " entries, needs one per rank (" + std::to_string(size()) + ")");
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  if (have != total)
    throw InvalidValueError(what, subject + what + " holds " + std::to_string(have) +
                                      " elements, " + what + "_counts sum to " +
                                      std::to_string(total));
}

}  // namespace commgrid
