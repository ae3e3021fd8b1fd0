// The FP8 conversions (core/dtype.h) against the formats' definitions: every code decodes to the
// value its bits say and encodes back to itself, ties round to even, magnitudes past the largest
// finite value saturate, NaN stays NaN; and the safetensors names.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kestrel {
namespace {

TEST(Fp8, E4M3KnownValues) {
  EXPECT_EQ(f8e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(f8e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(f8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0xff)));
  EXPECT_EQ(f8e4m3_to_f32(0x78), 256.0f);  // no infinity: exponent 15 holds finite values
}

TEST(Fp8, E5M2KnownValues) {
  EXPECT_EQ(f8e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(f8e5m2_to_f32(0x04), std::ldexp(1.0f, -14));
  EXPECT_EQ(f8e5m2_to_f32(0x3c), 1.0f);
  EXPECT_EQ(f8e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(f8e5m2_to_f32(0x7c)));
  EXPECT_TRUE(std::isnan(f8e5m2_to_f32(0x7d)));
}

// Every finite code is a fixed point of decode then encode (signed zero included).
TEST(Fp8, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float e4 = f8e4m3_to_f32(code), e5 = f8e5m2_to_f32(code);
    if (!std::isnan(e4)) {
      EXPECT_EQ(f32_to_f8e4m3(e4), code) << c;
    }
    if (std::isfinite(e5)) {
      EXPECT_EQ(f32_to_f8e5m2(e5), code) << c;
    }
  }
}

// Between two neighbours the nearer wins; at the midpoint, the even code (mantissa LSB 0).
TEST(Fp8, RoundsToNearestEven) {
  for (int c = 0; c < 0x7e; ++c) {
    const auto lo = static_cast<uint8_t>(c), hi = static_cast<uint8_t>(c + 1);
    const float a = f8e4m3_to_f32(lo), b = f8e4m3_to_f32(hi), mid = 0.5f * (a + b);
    EXPECT_EQ(f32_to_f8e4m3(mid), (lo & 1) ? hi : lo) << c;
    EXPECT_EQ(f32_to_f8e4m3(std::nextafter(mid, a)), lo) << c;
    EXPECT_EQ(f32_to_f8e4m3(std::nextafter(mid, b)), hi) << c;
    EXPECT_EQ(f32_to_f8e4m3(-mid), static_cast<uint8_t>(0x80 | ((lo & 1) ? hi : lo))) << c;
  }
  EXPECT_EQ(f32_to_f8e4m3(1.0625f), 0x38);  // 1 + 1/16: halfway to 1.125, to even (1.0)
  EXPECT_EQ(f32_to_f8e4m3(1.1875f), 0x3a);  // 1 + 3/16: halfway to 1.25 (even)
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: to 0
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 subnormal steps: to 2 (even)
}

TEST(Fp8, SaturatesAndKeepsNaN) {
  for (float v : {448.0f, 449.0f, 464.0f, 1e6f, INFINITY}) {
    EXPECT_EQ(f32_to_f8e4m3(v), 0x7e) << v;
    EXPECT_EQ(f32_to_f8e4m3(-v), 0xfe) << v;
  }
  EXPECT_EQ(f32_to_f8e5m2(1e9f), 0x7b);
  EXPECT_EQ(f32_to_f8e5m2(-INFINITY), 0xfb);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(f32_to_f8e4m3(NAN))));
  EXPECT_TRUE(std::isnan(f8e5m2_to_f32(f32_to_f8e5m2(NAN))));
  EXPECT_EQ(f32_to_f8e4m3(-0.0f), 0x80);
}

TEST(Fp8, SafetensorsNamesAndConversion) {
  DType d;
  ASSERT_TRUE(parse_dtype("F8_E4M3", &d));
  EXPECT_EQ(d, DType::kF8E4M3);
  ASSERT_TRUE(parse_dtype("F8_E5M2", &d));
  EXPECT_EQ(d, DType::kF8E5M2);
  EXPECT_EQ(dtype_name(DType::kF8E4M3), "F8_E4M3");
  EXPECT_EQ(dtype_size(DType::kF8E5M2), 1u);
  EXPECT_TRUE(is_fp8(DType::kF8E4M3));
  EXPECT_FALSE(is_fp8(DType::kBF16));
  const uint8_t codes[3] = {0x38, 0xc0, 0x7e};
  float out[3];
  convert_to_f32(codes, DType::kF8E4M3, 3, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 448.0f);
}

}  // namespace
}  // namespace kestrel
