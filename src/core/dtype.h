// Element types of tensors and the float16 / bfloat16 / FP8 conversions the CPU
// backend and the loaders use (round-to-nearest-even, as PyTorch does; FP8
// saturating, as quantizers want).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kestrel {

enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8, kF8E4M3, kF8E5M2 };

// FP8 E4M3 as torch.float8_e4m3fn and NVIDIA's e4m3: bias 7, no infinity, 0x7f / 0xff NaN,
// largest finite 448.
inline constexpr float kF8E4M3Max = 448.0f;
// FP8 E5M2 as torch.float8_e5m2: bias 15, infinities, largest finite 57344.
inline constexpr float kF8E5M2Max = 57344.0f;

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // safetensors spelling: "F32", "BF16", ...
// Parses a safetensors dtype name; returns false for one kestrel does not handle.
bool parse_dtype(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

float f8e4m3_to_f32(uint8_t v);
float f8e5m2_to_f32(uint8_t v);
// Round to nearest even; magnitudes past the largest finite value saturate to it (no infinity);
// NaN stays NaN.
uint8_t f32_to_f8e4m3(float f);
uint8_t f32_to_f8e5m2(float f);

// The E4M3 scale of values whose largest magnitude is `amax`: amax / 448, so that it maps to the
// largest code; 1 for all zeros (or a non-finite amax). Every FP8 quantizer of kestrel uses it.
inline float fp8_scale(float amax) {
  return amax > 0.0f && amax <= 3.4028235e38f ? amax / kF8E4M3Max : 1.0f;
}

// Whether `dtype` is one of the FP8 types.
inline bool is_fp8(DType dtype) {
  return dtype == DType::kF8E4M3 || dtype == DType::kF8E5M2;
}

// Converts n elements of src (F32, F16, BF16, F8_E4M3 or F8_E5M2) to float32.
void convert_to_f32(const void* src, DType dtype, size_t n, float* dst);

}  // namespace kestrel
