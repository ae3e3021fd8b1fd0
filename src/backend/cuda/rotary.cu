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

// Where head slot `slot` of K/V head g of token t goes (slots 0..group-1 the group's query
// heads, then k, then v): q, k, v, or with a cache k / v's cache slot; p null when the token's
// cache slot is outside the cache (nothing is written).
__device__ __forceinline__ RowOut head_slot_out(int64_t t, int64_t g, int64_t slot, int64_t group,
                                                int64_t n_heads, int64_t n_kv_heads,
                                                int64_t head_dim, uint16_t* q, uint16_t* k,
                                                uint16_t* v, const KvSlots& cache) {
  if (slot < group) return {q + (t * n_heads + g * group + slot) * head_dim, false};
  if (cache.k_cache == nullptr)
    return {(slot == group ? k : v) + (t * n_kv_heads + g) * head_dim, false};
  const int64_t cs = cache.slots[t];
  if (cs < 0 || cs >= cache.n_slots) return {nullptr, false};
  const int64_t at = (cs * n_kv_heads + g) * head_dim;  // elements
  void* base = slot == group ? cache.k_cache : cache.v_cache;
  return {cache.fp8 ? static_cast<void*>(static_cast<uint8_t*>(base) + at)
                    : static_cast<void*>(static_cast<uint16_t*>(base) + at),
          cache.fp8};
}

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
  const RowOut dst =
      head_slot_out(t, g, slot, group, n_heads, n_kv_heads, head_dim, q, k, v, cache);
  if (dst.p == nullptr) return;
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

// As qkv_rotary_kernel with 8 pairs a thread (16-byte loads and stores) when head_dim % 16 == 0:
// grid (T, ceil(slots * chunks / 128)), block 128; thread j of a token takes head slot
// j / chunks and the pairs (i, i + d/2) for i in [8 (j % chunks), + 8), chunks = d / 16. The
// same fp32 expressions as the scalar kernel, so the same results.
__global__ void qkv_rotary_vec_kernel(const uint16_t* qkv, const float* cos, const float* sin,
                                      int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                      uint16_t* q, uint16_t* k, uint16_t* v, KvSlots cache) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const int64_t group = n_heads / n_kv_heads, half = head_dim / 2, chunks = half / 8;
  const int64_t j = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
  const int64_t hs = j / chunks, i0 = (j % chunks) * 8;
  if (hs >= n_kv_heads * (group + 2)) return;
  const int64_t g = hs / (group + 2), slot = hs % (group + 2);
  const uint16_t* src = qkv + t * (n_heads + 2 * n_kv_heads) * head_dim + hs * head_dim;
  const RowOut dst =
      head_slot_out(t, g, slot, group, n_heads, n_kv_heads, head_dim, q, k, v, cache);
  if (dst.p == nullptr) return;
  const uint4 a = *reinterpret_cast<const uint4*>(src + i0);
  const uint4 b = *reinterpret_cast<const uint4*>(src + half + i0);
  const auto* ha = reinterpret_cast<const __nv_bfloat16*>(&a);
  const auto* hb = reinterpret_cast<const __nv_bfloat16*>(&b);
  float lo[8], hi[8];
  if (cos == nullptr || slot == group + 1) {  // no rotation (V; ALiBi models): a copy
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      lo[e] = __bfloat162float(ha[e]);
      hi[e] = __bfloat162float(hb[e]);
    }
  } else {
    const float4* c4 = reinterpret_cast<const float4*>(cos + t * half + i0);
    const float4* s4 = reinterpret_cast<const float4*>(sin + t * half + i0);
    const float4 c0 = c4[0], c1 = c4[1], s0 = s4[0], s1 = s4[1];
    const float c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
    const float sn[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float x1 = __bfloat162float(ha[e]), x2 = __bfloat162float(hb[e]);
      lo[e] = x1 * c[e] - x2 * sn[e];
      hi[e] = x2 * c[e] + x1 * sn[e];
    }
  }
  if (dst.fp8) {
    uint8_t ol[8], oh[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      ol[e] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(lo[e], __NV_SATFINITE, __NV_E4M3));
      oh[e] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(hi[e], __NV_SATFINITE, __NV_E4M3));
    }
    uint8_t* d8 = static_cast<uint8_t*>(dst.p);
    *reinterpret_cast<uint2*>(d8 + i0) = *reinterpret_cast<const uint2*>(ol);
    *reinterpret_cast<uint2*>(d8 + half + i0) = *reinterpret_cast<const uint2*>(oh);
    return;
  }
  uint4 ol, oh;
  auto* bl = reinterpret_cast<__nv_bfloat16*>(&ol);
  auto* bh = reinterpret_cast<__nv_bfloat16*>(&oh);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    bl[e] = __float2bfloat16(lo[e]);
    bh[e] = __float2bfloat16(hi[e]);
  }
  uint16_t* d16 = static_cast<uint16_t*>(dst.p);
  *reinterpret_cast<uint4*>(d16 + i0) = ol;
  *reinterpret_cast<uint4*>(d16 + half + i0) = oh;
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
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // Every row and cos / sin row starts 16-byte aligned when head_dim % 16 == 0 and the bases are.
  if (head_dim % 16 == 0 && aligned(qkv) && aligned(q) && aligned(k) && aligned(v) &&
      aligned(cos) && aligned(sin) && aligned(cache.k_cache) && aligned(cache.v_cache)) {
    const int64_t threads = slots * (head_dim / 16);
    const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>((threads + 127) / 128));
    pdl_launch(qkv_rotary_vec_kernel, grid, 128, 0, s, qkv, cos, sin, n_heads, n_kv_heads, head_dim,
               q, k, v, cache);
    return;
  }
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
