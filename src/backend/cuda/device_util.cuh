// Small device helpers shared by the CUDA backend's elementwise, norm and rotary kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace kestrel::cuda::kernels {

__device__ __forceinline__ float ld_bf16(const uint16_t* p, int64_t i) {
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
}
__device__ __forceinline__ void st_bf16(uint16_t* p, int64_t i, float v) {
  reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
}

// A row being written: BF16, or (fp8) E4M3 codes under a scale of 1, rounded to nearest even
// and saturating, from the fp32 value (the CPU's kv_write on the same value).
struct RowOut {
  void* p;
  bool fp8;
  __device__ __forceinline__ void put(int64_t i, float v) const {
    if (fp8)
      static_cast<uint8_t*>(p)[i] =
          static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
    else
      st_bf16(static_cast<uint16_t*>(p), i, v);
  }
};

inline unsigned grid_for(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > (1 << 20)) blocks = 1 << 20;  // grid-stride loops cover the rest
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

}  // namespace kestrel::cuda::kernels
