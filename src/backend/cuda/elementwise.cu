// Elementwise and row kernels of the CUDA backend: dtype conversions, embedding
// gather, LayerNorm, GELU, adds, row gathers, argmax, the fused qkv split +
// NeoX rotary, and the write of new K/V into their cache slots. bf16 storage,
// fp32 arithmetic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace kestrel::cuda::kernels {
namespace {

__device__ __forceinline__ float ld_bf16(const uint16_t* p, int64_t i) {
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
}
__device__ __forceinline__ void st_bf16(uint16_t* p, int64_t i, float v) {
  reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
}

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
__global__ void layer_norm_kernel(const uint16_t* x, const uint16_t* w, const uint16_t* b,
                                  int64_t hidden, float eps, uint16_t* out) {
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

__global__ void gelu_kernel(uint16_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = ld_bf16(x, i);
    st_bf16(x, i, 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f)));
  }
}

__global__ void add_kernel(const uint16_t* a, const uint16_t* b, const uint16_t* c, uint16_t* out,
                           int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float v = ld_bf16(a, i) + ld_bf16(b, i);
    if (c) v += ld_bf16(c, i);
    st_bf16(out, i, v);
  }
}

__global__ void gather_rows_kernel(const char* x, const int32_t* idx, int64_t n_rows,
                                   int64_t row_bytes, char* out) {
  const int64_t r = blockIdx.x;
  const int32_t src = idx[r];
  const bool ok = src >= 0 && src < n_rows;
  for (int64_t i = threadIdx.x; i < row_bytes; i += blockDim.x)
    out[r * row_bytes + i] = ok ? x[src * row_bytes + i] : 0;
}

__global__ void argmax_kernel(const float* logits, int64_t vocab, int32_t* out) {
  __shared__ float best_v[32];
  __shared__ int32_t best_i[32];
  const float* row = logits + blockIdx.x * vocab;
  float bv = -FLT_MAX;
  int32_t bi = 0x7fffffff;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = row[i];
    if (v > bv) bv = v, bi = static_cast<int32_t>(i);  // increasing i: first max kept
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

// grid (T, n_kv_heads * (group + 2)); thread i of a head rotates the pair (i, i + d/2).
__global__ void qkv_rotary_kernel(const uint16_t* qkv, const float* cos, const float* sin,
                                  int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                  uint16_t* q, uint16_t* k, uint16_t* v) {
  const int64_t t = blockIdx.x;
  const int64_t group = n_heads / n_kv_heads, half = head_dim / 2;
  const int64_t g = blockIdx.y / (group + 2), slot = blockIdx.y % (group + 2);
  const uint16_t* src = qkv + t * (n_heads + 2 * n_kv_heads) * head_dim + blockIdx.y * head_dim;
  const float* c = cos + t * half;
  const float* s = sin + t * half;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float x1 = ld_bf16(src, i), x2 = ld_bf16(src, i + half);
    if (slot == group + 1) {
      uint16_t* dst = v + (t * n_kv_heads + g) * head_dim;
      dst[i] = src[i];
      dst[i + half] = src[i + half];
      continue;
    }
    uint16_t* dst = slot < group ? q + (t * n_heads + g * group + slot) * head_dim
                                 : k + (t * n_kv_heads + g) * head_dim;
    st_bf16(dst, i, x1 * c[i] - x2 * s[i]);
    st_bf16(dst, i + half, x2 * c[i] + x1 * s[i]);
  }
}

__global__ void kv_write_kernel(const uint16_t* k, const uint16_t* v, const int64_t* slots,
                                int64_t row, int64_t n_slots, uint16_t* k_cache,
                                uint16_t* v_cache) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= n_slots) return;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    k_cache[slot * row + i] = k[t * row + i];
    v_cache[slot * row + i] = v[t * row + i];
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
  embedding_kernel<<<static_cast<unsigned>(n_tokens), 256, 0, s>>>(ids, table, vocab, hidden, out);
}

void layer_norm(const uint16_t* x, const uint16_t* w, const uint16_t* b, int64_t n_tokens,
                int64_t hidden, float eps, uint16_t* out, cudaStream_t s) {
  if (n_tokens == 0) return;
  const int threads = hidden >= 1024 ? 512 : hidden >= 256 ? 256 : 64;
  layer_norm_kernel<<<static_cast<unsigned>(n_tokens), threads, 0, s>>>(x, w, b, hidden, eps, out);
}

void gelu(uint16_t* x, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  gelu_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, n);
}

void add(const uint16_t* a, const uint16_t* b, const uint16_t* c, uint16_t* out, int64_t n,
         cudaStream_t s) {
  if (n == 0) return;
  add_kernel<<<grid_for(n, 256), 256, 0, s>>>(a, b, c, out, n);
}

void gather_rows(const void* x, const int32_t* idx, int64_t n, int64_t n_rows, int64_t row_bytes,
                 void* out, cudaStream_t s) {
  if (n == 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(n), 256, 0, s>>>(
      static_cast<const char*>(x), idx, n_rows, row_bytes, static_cast<char*>(out));
}

void argmax_rows(const float* logits, int64_t n, int64_t vocab, int32_t* out, cudaStream_t s) {
  if (n == 0) return;
  argmax_kernel<<<static_cast<unsigned>(n), 1024, 0, s>>>(logits, vocab, out);
}

void qkv_rotary(const uint16_t* qkv, const float* cos, const float* sin, int64_t n_tokens,
                int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, uint16_t* q, uint16_t* k,
                uint16_t* v, cudaStream_t s) {
  if (n_tokens == 0) return;
  const int64_t group = n_heads / n_kv_heads;
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>(n_kv_heads * (group + 2)));
  const int threads = head_dim / 2 >= 64 ? 64 : 32;
  qkv_rotary_kernel<<<grid, threads, 0, s>>>(qkv, cos, sin, n_heads, n_kv_heads, head_dim, q, k, v);
}

void kv_write(const uint16_t* k, const uint16_t* v, const int64_t* slots, int64_t n_tokens,
              int64_t row, int64_t n_slots, uint16_t* k_cache, uint16_t* v_cache, cudaStream_t s) {
  if (n_tokens == 0) return;
  kv_write_kernel<<<static_cast<unsigned>(n_tokens), 128, 0, s>>>(k, v, slots, row, n_slots,
                                                                  k_cache, v_cache);
}

}  // namespace kestrel::cuda::kernels
