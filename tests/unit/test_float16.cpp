// float16 conversions and the typed-buffer helpers, without any backend.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "commgrid/communicator.hpp"

namespace commgrid {
namespace {

TEST(Float16, ExactValuesRoundTrip) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);  // the largest half
  EXPECT_EQ(float_to_fp16(0x1p-14f), 0x0400);  // the smallest normal
  EXPECT_EQ(float_to_fp16(0x1p-24f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  // Every half value widens exactly and narrows back to itself (NaNs aside).
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float f = fp16_to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f)))) << bits;
      continue;
    }
    ASSERT_EQ(float_to_fp16(f), h) << "half bits " << bits << " -> " << f;
  }
}

TEST(Float16, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and the next half (1 + 2^-10): ties go to even (1).
  EXPECT_EQ(float_to_fp16(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(float_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
  // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even): up.
  EXPECT_EQ(float_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
  // Subnormals: 2^-25 is halfway between 0 and the smallest subnormal: to even (0).
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);
  EXPECT_EQ(float_to_fp16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(float_to_fp16(3 * 0x1p-25f), 0x0002);  // 1.5 subnormal steps: to even (2)
}

TEST(Float16, OverflowInfinityAndNan) {
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);  // below the midpoint to infinity
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // the midpoint rounds to infinity
  EXPECT_EQ(float_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(float_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(fp16_to_float(0x7c00)));
}

TEST(TypedBuffers, DataTypeFromElementType) {
  static_assert(datatype_of<float> == DataType::float32);
  static_assert(datatype_of<const double> == DataType::float64);
  static_assert(datatype_of<bfloat16> == DataType::bfloat16);
  static_assert(datatype_of<float16> == DataType::float16);
  static_assert(datatype_of<std::int8_t> == DataType::int8);
  static_assert(datatype_of<std::uint8_t> == DataType::uint8);
  static_assert(!CommElement<char16_t>);
  EXPECT_EQ(element_size(DataType::float16), 2u);
  EXPECT_EQ(element_size(DataType::int8), 1u);
  EXPECT_EQ(datatype_name(DataType::float16), "float16");
  EXPECT_EQ(reduce_op_name(ReduceOp::avg), "avg");
  EXPECT_EQ(static_cast<float>(float16(0.5f)), 0.5f);
  EXPECT_EQ(static_cast<float>(bfloat16(3.0f)), 3.0f);
  const P2POp op = P2POp::recv(std::span<float16>(), 3, 9);
  EXPECT_EQ(op.kind, P2POp::Kind::recv);
  EXPECT_EQ(op.type, DataType::float16);
  EXPECT_EQ(op.peer, 3);
  EXPECT_EQ(op.tag, 9);
}

}  // namespace
}  // namespace commgrid
