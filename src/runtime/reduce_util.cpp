// The reduction kernels CPU backends share (see reduce_util.hpp).
#include "reduce_util.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace commgrid::detail {

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

void divide_by(void* buf, std::size_t count, DataType type, Rank n) {
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

void reduce_blocks(const void* blocks, void* out, std::size_t count, DataType type, ReduceOp op,
                   Rank n) {
  const auto ranks = static_cast<std::size_t>(n);
  const ReduceOp eop = engine_op(op);
  if (is_half(type)) {
    const auto* halves = static_cast<const std::uint16_t*>(blocks);
    std::vector<float> acc = widen_half(halves, count, type);
    for (std::size_t r = 1; r < ranks; ++r) {
      const std::vector<float> next = widen_half(halves + r * count, count, type);
      reduce_block(acc.data(), acc.data(), next.data(), count, eop);
    }
    if (op == ReduceOp::avg)
      for (float& v : acc) v /= static_cast<float>(n);
    narrow_half(acc.data(), out, count, type);
    return;
  }
  dispatch_native(type, [&](auto zero) {
    using T = decltype(zero);
    const auto* in = static_cast<const T*>(blocks);
    auto* o = static_cast<T*>(out);
    std::copy(in, in + count, o);
    for (std::size_t r = 1; r < ranks; ++r) reduce_block(o, o, in + r * count, count, eop);
  });
  if (op == ReduceOp::avg) divide_by(out, count, type, n);
}

}  // namespace commgrid::detail
