// Device helpers shared by the skinny linears of decode (gemv.cu, fp8.cu): the streamed weight
// load, bf16 bit conversions and the epilogue both apply.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace kestrel::cuda::kernels {

// A weight chunk: read once, so kept out of L1 (x stays there).
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float v) {
  const __nv_bfloat16 h = __float2bfloat16_rn(v);
  return *reinterpret_cast<const uint16_t*>(&h);
}

__device__ __forceinline__ float gelu_erf(float v) {
  return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));
}

// y -> out[i] under the epilogue (bias already in y): GELU, + addend[i] (bf16, or null), then
// out = y or out += y (accumulate), bf16 or f32 out.
__device__ __forceinline__ void store_epilogue(float y, bool gelu, bool accumulate,
                                               const uint16_t* addend, void* out, bool f32_out,
                                               int64_t i) {
  if (gelu) y = gelu_erf(y);
  if (addend) y += bf16_bits_to_f32(addend[i]);
  if (f32_out) {
    float* o = static_cast<float*>(out);
    o[i] = accumulate ? o[i] + y : y;
  } else {
    uint16_t* o = static_cast<uint16_t*>(out);
    o[i] = f32_to_bf16_bits(accumulate ? bf16_bits_to_f32(o[i]) + y : y);
  }
}

}  // namespace kestrel::cuda::kernels
