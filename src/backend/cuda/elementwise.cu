// Elementwise and row kernels of the CUDA backend: dtype conversions, embedding
// gather, LayerNorm, GELU, adds, row gathers, argmax, the fused qkv split +
// NeoX rotary, and the write of new K/V into their cache slots. bf16 storage,
// fp32 arithmetic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace kestrel::cuda::kernels {
namespace {

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

unsigned grid_for(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > (1 << 20)) blocks = 1 << 20;  // grid-stride loops cover the rest
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int n_warps = blockDim.x / 32;
  v = lane < n_warps ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void to_bf16_kernel(const void* src, int kind, __nv_bfloat16* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float v;
    if (kind == 0) {
      v = static_cast<const float*>(src)[i];
    } else if (kind == 1) {
      v = __half2float(static_cast<const __half*>(src)[i]);
    } else {
      dst[i] = static_cast<const __nv_bfloat16*>(src)[i];
      continue;
    }
    dst[i] = __float2bfloat16(v);
  }
}

__global__ void bf16_to_f32_kernel(const __nv_bfloat16* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}

__global__ void f16_to_f32_kernel(const __half* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = __half2float(src[i]);
}

__global__ void random_uniform_kernel(void* dst, bool bf16_out, int64_t n, uint64_t seed, float amp,
                                      float constant) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float v = constant;
    if (amp > 0.0f) {
      uint64_t z = seed + (static_cast<uint64_t>(i) + 1) * 0x9e3779b97f4a7c15ull;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      v = amp * (2.0f * (static_cast<float>(z >> 40) * (1.0f / 16777216.0f)) - 1.0f);
    }
    if (bf16_out) {
      static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16(v);
    } else {
      static_cast<float*>(dst)[i] = v;
    }
  }
}

// One block per token; 16-byte copies when the row allows.
__global__ void embedding_kernel(const int32_t* ids, const uint16_t* table, int64_t vocab,
                                 int64_t hidden, uint16_t* out) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool ok = id >= 0 && id < vocab;
  uint16_t* o = out + t * hidden;
  const uint16_t* r = table + (ok ? id : 0) * hidden;
  if (hidden % 8 == 0) {
    const int64_t n = hidden / 8;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      reinterpret_cast<uint4*>(o)[i] =
          ok ? reinterpret_cast<const uint4*>(r)[i] : uint4{0, 0, 0, 0};
  } else {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = ok ? r[i] : 0;
  }
}

// One block per row; mean, then variance of (x - mean), then the write.
// Generic version (any hidden).
__global__ void layer_norm_kernel(const uint16_t* x, const uint16_t* w, const uint16_t* b,
                                  int64_t hidden, float eps, uint16_t* out) {
  pdl_enter();
  __shared__ float scratch[32];
  const uint16_t* xr = x + blockIdx.x * hidden;
  uint16_t* yr = out + blockIdx.x * hidden;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) s += ld_bf16(xr, i);
  const float mean = block_sum(s, scratch) / static_cast<float>(hidden);
  float v = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float c = ld_bf16(xr, i) - mean;
    v += c * c;
  }
  const float var = block_sum(v, scratch) / static_cast<float>(hidden);
  const float inv = rsqrtf(var + eps);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    st_bf16(yr, i, (ld_bf16(xr, i) - mean) * inv * ld_bf16(w, i) + ld_bf16(b, i));
}

// hidden % 8 == 0 and hidden <= 8 * kLnChunks * blockDim.x: the row is read
// once, 16 bytes a thread at a time, and kept in registers.
constexpr int kLnChunks = 4;
__global__ void layer_norm_vec_kernel(const uint16_t* x, const uint16_t* w, const uint16_t* b,
                                      int64_t hidden, float eps, uint16_t* out) {
  pdl_enter();
  __shared__ float scratch[32];
  const int n_chunks = static_cast<int>(hidden / 8);
  const uint4* xr = reinterpret_cast<const uint4*>(x + blockIdx.x * hidden);
  float vals[kLnChunks][8];
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kLnChunks; ++c) {
    const int idx = threadIdx.x + c * blockDim.x;
    uint4 u = idx < n_chunks ? xr[idx] : uint4{0, 0, 0, 0};
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      vals[c][2 * j] = f.x, vals[c][2 * j + 1] = f.y;
      s += f.x + f.y;
    }
  }
  const float mean = block_sum(s, scratch) / static_cast<float>(hidden);
  float v = 0.0f;
#pragma unroll
  for (int c = 0; c < kLnChunks; ++c) {
    if (threadIdx.x + c * blockDim.x >= n_chunks) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) v += (vals[c][j] - mean) * (vals[c][j] - mean);
  }
  const float inv = rsqrtf(block_sum(v, scratch) / static_cast<float>(hidden) + eps);
#pragma unroll
  for (int c = 0; c < kLnChunks; ++c) {
    const int idx = threadIdx.x + c * blockDim.x;
    if (idx >= n_chunks) continue;
    uint4 uw = reinterpret_cast<const uint4*>(w)[idx], ub = reinterpret_cast<const uint4*>(b)[idx];
    const __nv_bfloat162* hw = reinterpret_cast<const __nv_bfloat162*>(&uw);
    const __nv_bfloat162* hb = reinterpret_cast<const __nv_bfloat162*>(&ub);
    uint4 uo;
    __nv_bfloat162* ho = reinterpret_cast<__nv_bfloat162*>(&uo);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 fw = __bfloat1622float2(hw[j]), fb = __bfloat1622float2(hb[j]);
      ho[j] = __floats2bfloat162_rn((vals[c][2 * j] - mean) * inv * fw.x + fb.x,
                                    (vals[c][2 * j + 1] - mean) * inv * fw.y + fb.y);
    }
    reinterpret_cast<uint4*>(out + blockIdx.x * hidden)[idx] = uo;
  }
}

__device__ __forceinline__ float gelu_f(float v) {
  return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));
}

// 8 bf16 per thread (16-byte loads) when n % 8 == 0, else one.
__global__ void gelu_kernel(uint16_t* x, int64_t n) {
  pdl_enter();
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  if (n % 8 == 0) {
    uint4* v = reinterpret_cast<uint4*>(x);
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n / 8; i += stride) {
      uint4 u = v[i];
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(h[j]);
        h[j] = __floats2bfloat162_rn(gelu_f(f.x), gelu_f(f.y));
      }
      v[i] = u;
    }
    return;
  }
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += stride)
    st_bf16(x, i, gelu_f(ld_bf16(x, i)));
}

__global__ void add_bias_kernel(void* out, bool f32_out, const uint16_t* bias, int64_t n,
                                int64_t cols) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float b = ld_bf16(bias, i % cols);
    if (f32_out) {
      static_cast<float*>(out)[i] += b;
    } else {
      uint16_t* o = static_cast<uint16_t*>(out);
      st_bf16(o, i, ld_bf16(o, i) + b);
    }
  }
}

__global__ void add_kernel(const uint16_t* a, const uint16_t* b, const uint16_t* c, uint16_t* out,
                           int64_t n) {
  pdl_enter();
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  if (n % 8 == 0) {
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n / 8; i += stride) {
      uint4 ua = reinterpret_cast<const uint4*>(a)[i], ub = reinterpret_cast<const uint4*>(b)[i];
      uint4 uc = c ? reinterpret_cast<const uint4*>(c)[i] : uint4{0, 0, 0, 0};
      __nv_bfloat162* ha = reinterpret_cast<__nv_bfloat162*>(&ua);
      const __nv_bfloat162* hb = reinterpret_cast<const __nv_bfloat162*>(&ub);
      const __nv_bfloat162* hc = reinterpret_cast<const __nv_bfloat162*>(&uc);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 fa = __bfloat1622float2(ha[j]), fb = __bfloat1622float2(hb[j]);
        const float2 fc = __bfloat1622float2(hc[j]);  // zeros when c is null
        ha[j] = __floats2bfloat162_rn(fa.x + fb.x + fc.x, fa.y + fb.y + fc.y);
      }
      reinterpret_cast<uint4*>(out)[i] = ua;
    }
    return;
  }
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
    float v = ld_bf16(a, i) + ld_bf16(b, i);
    if (c) v += ld_bf16(c, i);
    st_bf16(out, i, v);
  }
}

__global__ void gather_rows_kernel(const char* x, const int32_t* idx, int64_t n_rows,
                                   int64_t row_bytes, char* out) {
  pdl_enter();
  const int64_t r = blockIdx.x;
  const int32_t src = idx[r];
  const bool ok = src >= 0 && src < n_rows;
  if (row_bytes % 16 == 0) {
    const uint4* xs = reinterpret_cast<const uint4*>(x + (ok ? src : 0) * row_bytes);
    uint4* o = reinterpret_cast<uint4*>(out + r * row_bytes);
    for (int64_t i = threadIdx.x; i < row_bytes / 16; i += blockDim.x)
      o[i] = ok ? xs[i] : uint4{0, 0, 0, 0};
    return;
  }
  for (int64_t i = threadIdx.x; i < row_bytes; i += blockDim.x)
    out[r * row_bytes + i] = ok ? x[src * row_bytes + i] : 0;
}

__global__ void argmax_kernel(const float* logits, int64_t vocab, int32_t* out) {
  pdl_enter();
  __shared__ float best_v[32];
  __shared__ int32_t best_i[32];
  const float* row = logits + blockIdx.x * vocab;
  float bv = -FLT_MAX;
  int32_t bi = 0x7fffffff;
  if (vocab % 4 == 0) {
    for (int64_t i = threadIdx.x; i < vocab / 4; i += blockDim.x) {
      const float4 v = reinterpret_cast<const float4*>(row)[i];
      const int32_t i0 = static_cast<int32_t>(4 * i);
      if (v.x > bv) bv = v.x, bi = i0;  // increasing index: the first max is kept
      if (v.y > bv) bv = v.y, bi = i0 + 1;
      if (v.z > bv) bv = v.z, bi = i0 + 2;
      if (v.w > bv) bv = v.w, bi = i0 + 3;
    }
  } else {
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float v = row[i];
      if (v > bv) bv = v, bi = static_cast<int32_t>(i);
    }
  }
  auto better = [](float v, int32_t i, float ov, int32_t oi) {
    return ov > v || (ov == v && oi < i);
  };
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(bv, bi, ov, oi)) bv = ov, bi = oi;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) best_v[warp] = bv, best_i[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    const int n_warps = blockDim.x / 32;
    bv = lane < n_warps ? best_v[lane] : -FLT_MAX;
    bi = lane < n_warps ? best_i[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(bv, bi, ov, oi)) bv = ov, bi = oi;
    }
    if (lane == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
  }
}

// One block per row: the argmax as argmax_kernel, then the row's sum of
// exp(x - max) for the top token's log-softmax, -log(sum).
__global__ void greedy_kernel(const float* logits, int64_t vocab, int32_t* ids, float* logprobs) {
  pdl_enter();
  __shared__ float best_v[32];
  __shared__ int32_t best_i[32];
  __shared__ float scratch[32];
  const float* row = logits + blockIdx.x * vocab;
  float bv = -FLT_MAX;
  int32_t bi = 0x7fffffff;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = row[i];
    if (v > bv) bv = v, bi = static_cast<int32_t>(i);
  }
  auto better = [](float v, int32_t i, float ov, int32_t oi) {
    return ov > v || (ov == v && oi < i);
  };
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(bv, bi, ov, oi)) bv = ov, bi = oi;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) best_v[warp] = bv, best_i[warp] = bi;
  __syncthreads();
  const int n_warps = blockDim.x / 32;
  bv = lane < n_warps ? best_v[lane] : -FLT_MAX;
  bi = lane < n_warps ? best_i[lane] : 0x7fffffff;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(bv, bi, ov, oi)) bv = ov, bi = oi;
  }
  // Every warp now holds the row's max in bv.
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) sum += __expf(row[i] - bv);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) {
    ids[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
    logprobs[blockIdx.x] = fmaxf(-logf(sum), -87.49823f);  // log(1e-38)
  }
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

void to_bf16(const void* src, int src_kind, uint16_t* dst, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  to_bf16_kernel<<<grid_for(n, 256), 256, 0, s>>>(src, src_kind,
                                                  reinterpret_cast<__nv_bfloat16*>(dst), n);
}

void bf16_to_f32(const uint16_t* src, float* dst, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<grid_for(n, 256), 256, 0, s>>>(reinterpret_cast<const __nv_bfloat16*>(src),
                                                      dst, n);
}

void f16_to_f32(const uint16_t* src, float* dst, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  f16_to_f32_kernel<<<grid_for(n, 256), 256, 0, s>>>(reinterpret_cast<const __half*>(src), dst, n);
}

void random_uniform(void* dst, bool bf16_out, int64_t n, uint64_t seed, float amp, float constant,
                    cudaStream_t s) {
  if (n == 0) return;
  random_uniform_kernel<<<grid_for(n, 256), 256, 0, s>>>(dst, bf16_out, n, seed, amp, constant);
}

void embedding(const int32_t* ids, const uint16_t* table, int64_t n_tokens, int64_t vocab,
               int64_t hidden, uint16_t* out, cudaStream_t s) {
  if (n_tokens == 0) return;
  pdl_launch(embedding_kernel, static_cast<unsigned>(n_tokens), 256, 0, s, ids, table, vocab,
             hidden, out);
}

void layer_norm(const uint16_t* x, const uint16_t* w, const uint16_t* b, int64_t n_tokens,
                int64_t hidden, float eps, uint16_t* out, cudaStream_t s) {
  if (n_tokens == 0) return;
  if (hidden % 8 == 0) {
    const int64_t chunks = hidden / 8;
    int threads = static_cast<int>((chunks + kLnChunks - 1) / kLnChunks);
    threads = (threads + 31) / 32 * 32;
    if (threads < 128 && chunks >= 128) threads = 128;  // more loads in flight
    threads = threads < 32 ? 32 : threads;
    if (threads <= 1024) {
      pdl_launch(layer_norm_vec_kernel, static_cast<unsigned>(n_tokens), threads, 0, s, x, w, b,
                 hidden, eps, out);
      return;
    }
  }
  const int threads = hidden >= 1024 ? 512 : hidden >= 256 ? 256 : 64;
  pdl_launch(layer_norm_kernel, static_cast<unsigned>(n_tokens), threads, 0, s, x, w, b, hidden,
             eps, out);
}

void gelu(uint16_t* x, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  pdl_launch(gelu_kernel, grid_for(n, 256), 256, 0, s, x, n);
}

void add_bias(void* out, bool f32_out, const uint16_t* bias, int64_t rows, int64_t cols,
              cudaStream_t s) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  pdl_launch(add_bias_kernel, grid_for(n, 256), 256, 0, s, out, f32_out, bias, n, cols);
}

void add(const uint16_t* a, const uint16_t* b, const uint16_t* c, uint16_t* out, int64_t n,
         cudaStream_t s) {
  if (n == 0) return;
  pdl_launch(add_kernel, grid_for(n, 256), 256, 0, s, a, b, c, out, n);
}

void gather_rows(const void* x, const int32_t* idx, int64_t n, int64_t n_rows, int64_t row_bytes,
                 void* out, cudaStream_t s) {
  if (n == 0) return;
  pdl_launch(gather_rows_kernel, static_cast<unsigned>(n), 256, 0, s, static_cast<const char*>(x),
             idx, n_rows, row_bytes, static_cast<char*>(out));
}

void argmax_rows(const float* logits, int64_t n, int64_t vocab, int32_t* out, cudaStream_t s) {
  if (n == 0) return;
  pdl_launch(argmax_kernel, static_cast<unsigned>(n), 1024, 0, s, logits, vocab, out);
}

// One thread per (token, masked row): packed = [rows | bitmask rows of `words`].
__global__ void token_bitmask_kernel(float* logits, int64_t vocab, const int32_t* packed, int64_t n,
                                     int64_t words) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t i = blockIdx.y;
  if (j >= vocab) return;
  const uint32_t word = static_cast<uint32_t>(packed[n + i * words + (j >> 5)]);
  if (((word >> (j & 31)) & 1u) == 0)
    logits[static_cast<int64_t>(packed[i]) * vocab + j] = -INFINITY;
}

void apply_token_bitmask(float* logits, int64_t vocab, const int32_t* packed, int64_t n,
                         int64_t words, cudaStream_t s) {
  if (n == 0) return;
  const dim3 grid(static_cast<unsigned>((vocab + 255) / 256), static_cast<unsigned>(n));
  token_bitmask_kernel<<<grid, 256, 0, s>>>(logits, vocab, packed, n, words);
}

void greedy_rows(const float* logits, int64_t n, int64_t vocab, int32_t* ids, float* logprobs,
                 cudaStream_t s) {
  if (n == 0) return;
  pdl_launch(greedy_kernel, static_cast<unsigned>(n), 1024, 0, s, logits, vocab, ids, logprobs);
}

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
