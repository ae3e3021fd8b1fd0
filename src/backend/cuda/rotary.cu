// The fused qkv split + NeoX rotary and the write of new K/V into their cache slots (the
// CPU's cpu/rotary.cpp), bf16 or FP8 E4M3 pages.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace kestrel::cuda::kernels {
namespace {

// grid (T, ceil(n_kv_heads * (group + 2) / 8)), block (32, 8): threadIdx.y picks
// the head slot, thread x of a head rotates the pairs (i, i + d/2), i = x, x + 32...
__global__ void qkv_rotary_kernel(const uint16_t* qkv, const float* cos, const float* sin,
                                  int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                  uint16_t* q, uint16_t* k, uint16_t* v, KvSlots cache) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const int64_t group = n_heads / n_kv_heads, half = head_dim / 2;
  const int64_t hs = blockIdx.y * int64_t{blockDim.y} + threadIdx.y;
  if (hs >= n_kv_heads * (group + 2)) return;
  const int64_t g = hs / (group + 2), slot = hs % (group + 2);
  const uint16_t* src = qkv + t * (n_heads + 2 * n_kv_heads) * head_dim + hs * head_dim;
  // Where this K/V head's row goes: k, v, or its cache slot (skipped outside the cache).
  RowOut dst{nullptr, false};
  if (slot < group) {
    dst.p = q + (t * n_heads + g * group + slot) * head_dim;
  } else if (cache.k_cache != nullptr) {
    const int64_t cs = cache.slots[t];
    if (cs < 0 || cs >= cache.n_slots) return;
    const int64_t at = (cs * n_kv_heads + g) * head_dim;  // elements
    void* base = slot == group ? cache.k_cache : cache.v_cache;
    dst = {cache.fp8 ? static_cast<void*>(static_cast<uint8_t*>(base) + at)
                     : static_cast<void*>(static_cast<uint16_t*>(base) + at),
           cache.fp8};
  } else {
    dst.p = (slot == group ? k : v) + (t * n_kv_heads + g) * head_dim;
  }
  if (cos == nullptr || slot == group + 1) {  // no rotation (V; ALiBi models): a copy
    for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) dst.put(i, ld_bf16(src, i));
    return;
  }
  const float* c = cos + t * half;
  const float* s = sin + t * half;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float x1 = ld_bf16(src, i), x2 = ld_bf16(src, i + half);
    dst.put(i, x1 * c[i] - x2 * s[i]);
    dst.put(i + half, x2 * c[i] + x1 * s[i]);
  }
}

__global__ void kv_write_kernel(const uint16_t* k, const uint16_t* v, const int64_t* slots,
                                int64_t row, int64_t n_slots, void* k_cache, void* v_cache,
                                bool fp8) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= n_slots) return;
  if (!fp8) {
    for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
      static_cast<uint16_t*>(k_cache)[slot * row + i] = k[t * row + i];
      static_cast<uint16_t*>(v_cache)[slot * row + i] = v[t * row + i];
    }
    return;
  }
  const RowOut kd{static_cast<uint8_t*>(k_cache) + slot * row, true};
  const RowOut vd{static_cast<uint8_t*>(v_cache) + slot * row, true};
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kd.put(i, ld_bf16(k, t * row + i));
    vd.put(i, ld_bf16(v, t * row + i));
  }
}

}  // namespace

void qkv_rotary(const uint16_t* qkv, const float* cos, const float* sin, int64_t n_tokens,
                int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, uint16_t* q, uint16_t* k,
                uint16_t* v, cudaStream_t s, KvSlots cache) {
  if (n_tokens == 0) return;
  const int64_t group = n_heads / n_kv_heads;
  const int64_t slots = n_kv_heads * (group + 2);
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>((slots + 7) / 8));
  pdl_launch(qkv_rotary_kernel, grid, dim3(32, 8), 0, s, qkv, cos, sin, n_heads, n_kv_heads,
             head_dim, q, k, v, cache);
}

void kv_write(const uint16_t* k, const uint16_t* v, const int64_t* slots, int64_t n_tokens,
              int64_t row, int64_t n_slots, void* k_cache, void* v_cache, bool fp8,
              cudaStream_t s) {
  if (n_tokens == 0) return;
  pdl_launch(kv_write_kernel, static_cast<unsigned>(n_tokens), 128, 0, s, k, v, slots, row, n_slots,
             k_cache, v_cache, fp8);
}

}  // namespace kestrel::cuda::kernels
