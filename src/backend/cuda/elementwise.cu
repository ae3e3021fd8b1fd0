// Elementwise and row kernels of the CUDA backend (the CPU's cpu/elementwise.cpp): dtype
// conversions, random fills, embedding gather, GELU, adds, row gathers, argmax and the
// greedy pick, the token bitmask. bf16 storage, fp32 arithmetic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace kestrel::cuda::kernels {
namespace {

__global__ void copy_bytes_kernel(const uint4* src, uint4* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = src[i];
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

constexpr int kRowThreads = 1024;  // argmax and greedy: one block of this many per row

__global__ void __launch_bounds__(kRowThreads)
    argmax_kernel(const float* logits, int64_t vocab, int32_t* out) {
  pdl_enter();
  const float* row = logits + blockIdx.x * vocab;
  float bv = -FLT_MAX;
  int32_t bi = kNoIndex;
  if (vocab % 4 == 0) {
    for (int64_t i = threadIdx.x; i < vocab / 4; i += kRowThreads) {
      const float4 v = reinterpret_cast<const float4*>(row)[i];
      const int32_t i0 = static_cast<int32_t>(4 * i);
      if (v.x > bv) bv = v.x, bi = i0;  // increasing index: the first max is kept
      if (v.y > bv) bv = v.y, bi = i0 + 1;
      if (v.z > bv) bv = v.z, bi = i0 + 2;
      if (v.w > bv) bv = v.w, bi = i0 + 3;
    }
  } else {
    for (int64_t i = threadIdx.x; i < vocab; i += kRowThreads) {
      const float v = row[i];
      if (v > bv) bv = v, bi = static_cast<int32_t>(i);
    }
  }
  const ArgMaxPair best = block_argmax<kRowThreads>(bv, bi);
  if (threadIdx.x == 0) out[blockIdx.x] = best.key == kNoIndex ? 0 : best.key;
}

// One block per row: the argmax as argmax_kernel, then the row's sum of
// exp(x - max) for the top token's log-softmax, -log(sum).
__global__ void __launch_bounds__(kRowThreads)
    greedy_kernel(const float* logits, int64_t vocab, int32_t* ids, float* logprobs) {
  pdl_enter();
  const float* row = logits + blockIdx.x * vocab;
  float bv = -FLT_MAX;
  int32_t bi = kNoIndex;
  for (int64_t i = threadIdx.x; i < vocab; i += kRowThreads) {
    const float v = row[i];
    if (v > bv) bv = v, bi = static_cast<int32_t>(i);
  }
  const ArgMaxPair best = block_argmax<kRowThreads>(bv, bi);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < vocab; i += kRowThreads) sum += __expf(row[i] - best.value);
  sum = block_sum<kRowThreads>(sum);
  if (threadIdx.x == 0) {
    ids[blockIdx.x] = best.key == kNoIndex ? 0 : best.key;
    logprobs[blockIdx.x] = fmaxf(-logf(sum), -87.49823f);  // log(1e-38)
  }
}

// The grid of 256-thread blocks for gelu_kernel and add_kernel: a thread a 16-byte chunk where
// their vector path applies (n % 8 == 0), else a thread an element.
unsigned vec8_grid(int64_t n) {
  return grid_for(n % 8 == 0 ? n / 8 : n, 256);
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

void copy_bytes(const void* src, void* dst, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  copy_bytes_kernel<<<grid_for(n / 16, 256), 256, 0, s>>>(static_cast<const uint4*>(src),
                                                          static_cast<uint4*>(dst), n / 16);
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

void gelu(uint16_t* x, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  pdl_launch(gelu_kernel, vec8_grid(n), 256, 0, s, x, n);
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
  pdl_launch(add_kernel, vec8_grid(n), 256, 0, s, a, b, c, out, n);
}

void gather_rows(const void* x, const int32_t* idx, int64_t n, int64_t n_rows, int64_t row_bytes,
                 void* out, cudaStream_t s) {
  if (n == 0) return;
  pdl_launch(gather_rows_kernel, static_cast<unsigned>(n), 256, 0, s, static_cast<const char*>(x),
             idx, n_rows, row_bytes, static_cast<char*>(out));
}

void argmax_rows(const float* logits, int64_t n, int64_t vocab, int32_t* out, cudaStream_t s) {
  if (n == 0) return;
  pdl_launch(argmax_kernel, static_cast<unsigned>(n), kRowThreads, 0, s, logits, vocab, out);
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
  pdl_launch(greedy_kernel, static_cast<unsigned>(n), kRowThreads, 0, s, logits, vocab, ids,
             logprobs);
}

}  // namespace kestrel::cuda::kernels
