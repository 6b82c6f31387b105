// core/dtype.h: names and sizes, and the fp32 <-> BF16/F16 conversions
// against hand-checked bit patterns (round to nearest even, NaN, F16 subnormals and overflow).
#include "titan/core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "titan/core/error.h"

namespace titan {
namespace {

constexpr DType kAll[] = {DType::BOOL, DType::U8,   DType::I8,  DType::I16,     DType::U16,
                          DType::F16,  DType::BF16, DType::I32, DType::U32,     DType::F32,
                          DType::F64,  DType::I64,  DType::U64, DType::F8_E4M3, DType::F8_E5M2};

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint16_t to_bf16(float f) {
  uint16_t h;
  f32_to(DType::BF16, &f, 1, &h);
  return h;
}

uint16_t to_f16(float f) {
  uint16_t h;
  f32_to(DType::F16, &f, 1, &h);
  return h;
}

float from16(DType dt, uint16_t h) {
  float f;
  to_f32(dt, &h, 1, &f);
  return f;
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::BOOL), 1u);
  EXPECT_EQ(dtype_size(DType::U8), 1u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I32), 4u);
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_size(DType::F8_E4M3), 1u);
  EXPECT_STREQ(dtype_name(DType::BF16), "BF16");
  EXPECT_STREQ(dtype_name(DType::F8_E5M2), "F8_E5M2");
  EXPECT_STREQ(dtype_op_name(DType::F32), "float32");
  EXPECT_STREQ(dtype_op_name(DType::BF16), "bfloat16");
  EXPECT_STREQ(dtype_op_name(DType::F16), "float16");
  EXPECT_STREQ(dtype_op_name(DType::I64), "int64");
  EXPECT_STREQ(dtype_op_name(DType::F8_E4M3), "float8_e4m3fn");
}

TEST(DType, ParseRoundTrip) {
  std::set<std::string> names, op_names;
  for (DType d : kAll) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d) << dtype_name(d);
    names.insert(dtype_name(d));
    op_names.insert(dtype_op_name(d));
  }
  EXPECT_EQ(names.size(), std::size(kAll));
  EXPECT_EQ(op_names.size(), std::size(kAll));
  EXPECT_THROW(parse_dtype("bf16"), Error);
  EXPECT_THROW(parse_dtype("bfloat16"), Error);
  DType d = DType::I8;
  EXPECT_FALSE(try_parse_dtype("F33", &d));
  EXPECT_EQ(d, DType::I8);
  EXPECT_TRUE(try_parse_dtype("F16", &d));
  EXPECT_EQ(d, DType::F16);
  EXPECT_NE(dtype_name_list().find("BOOL, U8, I8"), std::string::npos);
}

TEST(DType, Bf16KnownBits) {
  EXPECT_EQ(to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(to_bf16(0.0f), 0x0000);
  EXPECT_EQ(to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  // Ties to even: 1 + 2^-8 is halfway between 0x3F80 (even) and 0x3F81.
  EXPECT_EQ(to_bf16(from_bits(0x3F808000u)), 0x3F80);
  EXPECT_EQ(to_bf16(from_bits(0x3F818000u)), 0x3F82);  // between 0x3F81 (odd) and 0x3F82
  EXPECT_EQ(to_bf16(from_bits(0x3F808001u)), 0x3F81);  // just above the tie
  EXPECT_EQ(to_bf16(from_bits(0x3F807FFFu)), 0x3F80);  // just below
  // The largest float rounds up into the exponent: inf.
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  // NaN stays NaN, quiet, sign kept, even when the payload sits only in the dropped bits.
  EXPECT_EQ(to_bf16(from_bits(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(to_bf16(from_bits(0xFF800001u)), 0xFFC0);
  EXPECT_TRUE(std::isnan(from16(DType::BF16, to_bf16(std::nanf("")))));

  EXPECT_EQ(from16(DType::BF16, 0x3F80), 1.0f);
  EXPECT_EQ(bits(from16(DType::BF16, 0x3F81)), 0x3F810000u);
}

TEST(DType, F16KnownBits) {
  EXPECT_EQ(to_f16(1.0f), 0x3C00);
  EXPECT_EQ(to_f16(-2.0f), 0xC000);
  EXPECT_EQ(to_f16(-0.0f), 0x8000);
  EXPECT_EQ(to_f16(65504.0f), 0x7BFF);  // max half
  EXPECT_EQ(to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(to_f16(65520.0f), 0x7C00);  // the tie above max half goes to inf
  EXPECT_EQ(to_f16(1e6f), 0x7C00);
  EXPECT_EQ(to_f16(-1e6f), 0xFC00);
  EXPECT_EQ(to_f16(-std::numeric_limits<float>::infinity()), 0xFC00);
  // 1 + 2^-11 is halfway between 0x3C00 (even) and 0x3C01.
  EXPECT_EQ(to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  // Subnormals, in units of 2^-24.
  EXPECT_EQ(to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(to_f16(1023 * std::ldexp(1.0f, -24)), 0x03FF);
  EXPECT_EQ(to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(to_f16(std::ldexp(1.0f, -25)), 0x0000);      // tie -> even (0)
  EXPECT_EQ(to_f16(3 * std::ldexp(1.0f, -26)), 0x0001);  // above the tie
  EXPECT_EQ(to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);  // 1.5 units: tie -> even (2)
  EXPECT_EQ(to_f16(-std::ldexp(1.0f, -24)), 0x8001);
  EXPECT_EQ(to_f16(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(to_f16(-std::ldexp(1.0f, -30)), 0x8000);
  // NaN: quiet, sign kept.
  EXPECT_EQ(to_f16(from_bits(0x7F800001u)), 0x7E00);
  EXPECT_EQ(to_f16(from_bits(0xFF800001u)), 0xFE00);
  EXPECT_TRUE(std::isnan(from16(DType::F16, to_f16(std::nanf("")))));

  EXPECT_EQ(from16(DType::F16, 0x3C00), 1.0f);
  EXPECT_EQ(from16(DType::F16, 0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(from16(DType::F16, 0x83FF), -1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(from16(DType::F16, 0x7BFF), 65504.0f);
  EXPECT_EQ(from16(DType::F16, 0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(from16(DType::F16, 0x7C01)));
}

TEST(DType, F32AndF64) {
  const std::vector<float> src = {1.5f, -0.0f, 3e38f};
  std::vector<float> out(3);
  f32_to(DType::F32, src.data(), 3, out.data());
  EXPECT_EQ(out, src);
  to_f32(DType::F32, src.data(), 3, out.data());
  EXPECT_EQ(out, src);
  const double d[] = {1.0, 0.1, -1e-50};
  to_f32(DType::F64, d, 3, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 0.1f);
  EXPECT_EQ(bits(out[2]), 0x80000000u);  // underflows to -0
}

TEST(DType, UnsupportedConversionsThrow) {
  float f = 1.0f;
  uint8_t buf[8] = {};
  EXPECT_THROW(f32_to(DType::I32, &f, 1, buf), Error);
  EXPECT_THROW(f32_to(DType::F64, &f, 1, buf), Error);
  EXPECT_THROW(to_f32(DType::I64, buf, 1, &f), Error);
  EXPECT_THROW(to_f32(DType::F8_E4M3, buf, 1, &f), Error);
}

// Unaligned source and destination, and a run long enough to be a loop.
TEST(DType, UnalignedArrays) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> src(1001);
  for (auto& x : src) x = nd(rng);
  std::vector<uint8_t> packed(2 * src.size() + 1);
  f32_to(DType::BF16, src.data(), static_cast<int64_t>(src.size()), packed.data() + 1);
  std::vector<float> back(src.size());
  to_f32(DType::BF16, packed.data() + 1, static_cast<int64_t>(src.size()), back.data());
  for (size_t i = 0; i < src.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, packed.data() + 1 + 2 * i, 2);
    ASSERT_EQ(h, to_bf16(src[i])) << i;
    ASSERT_EQ(bits(back[i]), static_cast<uint32_t>(h) << 16) << i;
  }
}

TEST(DType, RoundToBf16) {
  EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
  EXPECT_EQ(round_to_bf16(from_bits(0x3F808000u)), 1.0f);
  EXPECT_EQ(bits(round_to_bf16(from_bits(0x3F818000u))), 0x3F820000u);
  EXPECT_TRUE(std::isnan(round_to_bf16(from_bits(0x7F800001u))));
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  // The same as the array conversion there and back, and (for every non-NaN input) as the
  // mask-and-add formula check-kernel used before.
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 100000; ++i) {
    const float x = from_bits(any(rng));
    if (std::isnan(x)) continue;
    const uint32_t u = bits(x);
    const uint32_t expect = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
    ASSERT_EQ(bits(round_to_bf16(x)), expect) << u;
    ASSERT_EQ(bits(round_to_bf16(x)), bits(from16(DType::BF16, to_bf16(x)))) << u;
  }
}

}  // namespace
}  // namespace titan
