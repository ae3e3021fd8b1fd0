// Element types of tensors and the float16 / bfloat16 conversions the CPU
// backend and the loaders use (round-to-nearest-even, as PyTorch does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kestrel {

enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8 };

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

// Converts n elements of src (F32, F16 or BF16) to float32.
void convert_to_f32(const void* src, DType dtype, size_t n, float* dst);

}  // namespace kestrel
