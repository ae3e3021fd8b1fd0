// DType names, sizes and the half-precision conversions.
#include "core/dtype.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace kestrel {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E5M2:
      return "F8_E5M2";
  }
  return "?";
}

bool parse_dtype(std::string_view name, DType* out) {
  static constexpr std::pair<std::string_view, DType> kNames[] = {
      {"F32", DType::kF32},        {"F16", DType::kF16},       {"BF16", DType::kBF16},
      {"I32", DType::kI32},        {"I64", DType::kI64},       {"U8", DType::kU8},
      {"F8_E4M3", DType::kF8E4M3}, {"F8_E5M2", DType::kF8E5M2}};
  for (const auto& [n, d] : kNames) {
    if (n == name) {
      *out = d;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow (rounds to inf)
  if (abs < 0x38800000u) {                        // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (112 - exp) + 1 ... in [14, 24]
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

namespace {

// An FP8 format with `M` mantissa bits and exponent bias `B`; `max_code` is the largest finite
// magnitude's code, `nan_code` the magnitude code of NaN.
template <int M, int B>
float fp8_decode(uint8_t v, uint8_t nan_code, bool has_inf) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int mag = v & 0x7f;
  const int exp = mag >> M, mant = mag & ((1 << M) - 1);
  if (has_inf && exp == (0x7f >> M)) return mant == 0 ? sign * INFINITY : NAN;
  if (!has_inf && mag == nan_code) return NAN;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), 1 - B - M);
  return sign * std::ldexp(static_cast<float>((1 << M) + mant), exp - B - M);
}

template <int M, int B>
uint8_t fp8_encode(float f, uint8_t max_code, uint8_t nan_code) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isnan(f)) return sign | nan_code;
  const float a = std::fabs(f);
  const float max = fp8_decode<M, B>(max_code, nan_code, false);
  if (a >= max) return sign | max_code;  // saturate (also infinities)
  int e;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  // The quantum: 2^(e - 1 - M) for normals, the subnormal step below the smallest normal.
  const int q_exp = std::max(e - 1 - M, 1 - B - M);
  // a / 2^q_exp is exact; nearbyint rounds half to even in the default rounding mode.
  const float units = std::nearbyint(std::ldexp(a, -q_exp));
  const float r = std::ldexp(units, q_exp);
  if (r >= max) return sign | max_code;
  if (r == 0.0f) return sign;
  int re;
  std::frexp(r, &re);
  const int exp = re - 1 + B;  // biased exponent of r
  if (exp <= 0)                // subnormal: the units are the mantissa
    return sign | static_cast<uint8_t>(units);
  const int mant = static_cast<int>(std::ldexp(r, M - (re - 1))) - (1 << M);
  return sign | static_cast<uint8_t>((exp << M) | mant);
}

struct Fp8Tables {
  float e4m3[256], e5m2[256];
  Fp8Tables() {
    for (int i = 0; i < 256; ++i) {
      e4m3[i] = fp8_decode<3, 7>(static_cast<uint8_t>(i), 0x7f, false);
      e5m2[i] = fp8_decode<2, 15>(static_cast<uint8_t>(i), 0x7f, true);
    }
  }
};
const Fp8Tables& fp8_tables() {
  static const Fp8Tables t;
  return t;
}

}  // namespace

float f8e4m3_to_f32(uint8_t v) {
  return fp8_tables().e4m3[v];
}
float f8e5m2_to_f32(uint8_t v) {
  return fp8_tables().e5m2[v];
}
uint8_t f32_to_f8e4m3(float f) {
  return fp8_encode<3, 7>(f, 0x7e, 0x7f);
}
uint8_t f32_to_f8e5m2(float f) {
  return fp8_encode<2, 15>(f, 0x7b, 0x7f);
}

void convert_to_f32(const void* src, DType dtype, size_t n, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kF8E4M3:
    case DType::kF8E5M2: {
      const auto* s = static_cast<const uint8_t*>(src);
      const float* table = dtype == DType::kF8E4M3 ? fp8_tables().e4m3 : fp8_tables().e5m2;
      for (size_t i = 0; i < n; ++i) dst[i] = table[s[i]];
      return;
    }
    default:
      KESTREL_FAIL("cannot convert ", dtype_name(dtype), " to F32");
  }
}

}  // namespace kestrel
