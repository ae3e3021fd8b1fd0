// The skinny linear of decode: out [M, N] = epilogue(x [M, K] @ w [N, K]^T + bias [N]) for
// M = 1..8 rows, bf16 in, fp32 accumulation, bf16 or f32 out. Memory-bound on w (M * 2 FLOP
// per 2-byte weight), so it streams w once: a warp owns R output rows, each lane reads 16-byte
// chunks of them (R x U loads in flight before the first FMA), x (small, L1/L2-resident) is
// read beside them; a warp shuffle sums the lanes, and lane 0 applies bias, GELU, accumulate.
// Also the epilogue kernel for cuBLASLt results that need one (linear_epilogue).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"
#include "backend/cuda/linear_util.cuh"
#include "backend/cuda/pdl.cuh"

namespace kestrel::cuda::kernels {
namespace {

constexpr int kGemvThreads = 128;  // 4 warps: small blocks keep the last wave short

// SecondTerm in 16-byte chunks (kc = k / 8).
struct Second {
  const uint4* x = nullptr;
  const uint4* w = nullptr;
  const uint16_t* bias = nullptr;
  int64_t kc = 0;
  void* out = nullptr;  // a pair: rows [n1, n) of the launch are w's, into out
  int64_t n1 = 0;
  bool gelu = false;
};

// What a launch computes: one product, two summed (kSum), or two side by side (kPair).
enum Two { kOne, kSum, kPair };

// NormTerm in 16-byte chunks.
struct Norm {
  const uint4* w = nullptr;
  const uint4* b = nullptr;
  float eps = 0.0f;
};

// 8 bf16 of a and b (16 bytes each), multiplied and summed into acc in fp32.
__device__ __forceinline__ void dot8(float& acc, const uint4& a, const uint4& b) {
  const uint32_t* pa = &a.x;
  const uint32_t* pb = &b.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(pa[i] << 16), __uint_as_float(pb[i] << 16), acc);
    acc = fmaf(__uint_as_float(pa[i] & 0xffff0000u), __uint_as_float(pb[i] & 0xffff0000u), acc);
  }
}

// The sum of 8 bf16, in pairs (as layer_norm's).
__device__ __forceinline__ float sum8(const uint4& v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    s += f.x + f.y;
  }
  return s;
}

// The sum of (v - mean)^2 over 8 bf16.
__device__ __forceinline__ float sq8(const uint4& v, float mean) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    s += (f.x - mean) * (f.x - mean) + (f.y - mean) * (f.y - mean);
  }
  return s;
}

// 8 bf16 of x normalized: (x - mean) * inv * w + b, rounded to bf16 (layer_norm's formula).
__device__ __forceinline__ uint4 norm8(const uint4& v, const uint4& w, const uint4& b, float mean,
                                       float inv) {
  const __nv_bfloat162* hv = reinterpret_cast<const __nv_bfloat162*>(&v);
  const __nv_bfloat162* hw = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* hb = reinterpret_cast<const __nv_bfloat162*>(&b);
  uint4 o;
  __nv_bfloat162* ho = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(hv[j]), fw = __bfloat1622float2(hw[j]),
                 fb = __bfloat1622float2(hb[j]);
    ho[j] =
        __floats2bfloat162_rn((f.x - mean) * inv * fw.x + fb.x, (f.y - mean) * inv * fw.y + fb.y);
  }
  return o;
}

// s[m] summed over the block (kThreads / 32 warps; red: a slot a warp and row), in every thread.
template <int M, int kThreads>
__device__ __forceinline__ void block_sums(float (&s)[M], float (*red)[M]) {
  const int lane = threadIdx.x & 31, warp = static_cast<int>(threadIdx.x >> 5);
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s[m] += __shfl_xor_sync(0xffffffffu, s[m], off);
    if (lane == 0) red[warp][m] = s[m];
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < M; ++m) {
    s[m] = 0.0f;
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) s[m] += red[i][m];
  }
  __syncthreads();  // red is reused
}

// LayerNorm of x [M, kc chunks] into xn (shared memory, [M, kc]) by the whole block: x copied,
// the mean, the variance of x - mean, then each chunk normalized in place (each thread touches
// only its own chunks until the last barrier).
template <int M, int kThreads>
__device__ __forceinline__ void layer_norm_rows(const uint4* x, int64_t kc, const Norm& nt,
                                                uint4* xn) {
  __shared__ float red[kThreads / 32][M];
  float s[M];
#pragma unroll
  for (int m = 0; m < M; ++m) s[m] = 0.0f;
  for (int64_t c = threadIdx.x; c < kc; c += kThreads)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const uint4 v = x[m * kc + c];
      xn[m * kc + c] = v;
      s[m] += sum8(v);
    }
  block_sums<M, kThreads>(s, red);
  const float hidden = static_cast<float>(kc * 8);
  float mean[M];
#pragma unroll
  for (int m = 0; m < M; ++m) mean[m] = s[m] / hidden, s[m] = 0.0f;
  for (int64_t c = threadIdx.x; c < kc; c += kThreads)
#pragma unroll
    for (int m = 0; m < M; ++m) s[m] += sq8(xn[m * kc + c], mean[m]);
  block_sums<M, kThreads>(s, red);
  float inv[M];
#pragma unroll
  for (int m = 0; m < M; ++m) inv[m] = rsqrtf(s[m] / hidden + nt.eps);
  for (int64_t c = threadIdx.x; c < kc; c += kThreads) {
    const uint4 w = __ldg(nt.w + c), b = __ldg(nt.b + c);
#pragma unroll
    for (int m = 0; m < M; ++m) xn[m * kc + c] = norm8(xn[m * kc + c], w, b, mean[m], inv[m]);
  }
  __syncthreads();
}

// Rows [row0, row0 + rows) of w [n, kc chunks of 16 bytes], clipped to n, asked of L2: weights
// are written by no kernel of a forward, so this may run before pdl_wait.
__device__ __forceinline__ void prefetch_rows(const uint4* w, int64_t n, int64_t kc, int64_t row0,
                                              int64_t rows) {
  const int64_t end = min(row0 + rows, n);
  if (end <= row0) return;
  const int64_t bytes = (end - row0) * kc * 16;
  const char* p = reinterpret_cast<const char*>(w + row0 * kc);
  for (int64_t off = 0; off < bytes; off += int64_t{1} << 20)  // <= 1 MiB a request
    prefetch_l2(p + off, static_cast<uint32_t>(min(bytes - off, int64_t{1} << 20)));
}

// x [M, kc] and w [n, kc] in 16-byte chunks (kc = K / 8); out [M, n]; bias [n] or null.
template <int M, int R, int U>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(const uint4* __restrict__ x, const uint4* __restrict__ w,
                const uint16_t* __restrict__ bias, int64_t n, int64_t kc, bool gelu,
                bool accumulate, const uint16_t* addend, void* out, bool f32_out, bool prefetch) {
  const int lane = threadIdx.x & 31;
  if (prefetch && threadIdx.x == 0) prefetch_rows(w, n, kc, int64_t{blockIdx.x} * 4 * R, 4 * R);
  pdl_enter();
  const int64_t row0 =
      (int64_t{blockIdx.x} * (kGemvThreads / 32) + static_cast<int>(threadIdx.x >> 5)) * R;
  if (row0 >= n) return;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = w + min(row0 + r, n - 1) * kc;  // tail rows: re-read

  float acc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.0f;

  for (int64_t c = lane; c < kc; c += 32 * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = cc < kc ? ld_stream(wr[r] + cc) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + 32 * u;
      if (cc < kc) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xv = __ldg(x + m * kc + cc);
#pragma unroll
          for (int r = 0; r < R; ++r) dot8(acc[m][r], xv, wv[u][r]);
        }
      }
    }
  }

#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1)
        acc[m][r] += __shfl_xor_sync(0xffffffffu, acc[m][r], off);

  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = row0 + r;
    if (row >= n) break;
    const float b = bias ? bf16_bits_to_f32(bias[row]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m)
      store_epilogue(acc[m][r] + b, gelu, accumulate, addend, out, f32_out, m * n + row);
  }
}

// As gemv_kernel, but the block's 4 warps share its R rows and split k between them (more
// loads in flight per row, fewer rounds of memory latency per lane), summed through shared
// memory at the end.
// kSum: the second product's chunks follow the first's in one index space [0, kc + t.kc), so
// the lanes stream both rows of w back to back (no half-empty round between them). kPair: the
// launch's rows [0, t.n1) are w's, into out; the rest t.w's, into t.out (same x, same k).
// kNorm (a pair only): the block first normalizes x's M rows into shared memory (dynamic, M x
// kc chunks) and multiplies those: the LayerNorm before qkv and fc1 without its own launch.
template <int M, int R, int U, Two kTwo, bool kNorm = false>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_split_kernel(const uint4* __restrict__ x, const uint4* __restrict__ w,
                      const uint16_t* __restrict__ bias, int64_t n, int64_t kc, bool gelu,
                      bool accumulate, const uint16_t* addend, void* out, bool f32_out,
                      bool prefetch, Second t, Norm nt) {
  static_assert(!kNorm || kTwo == kPair, "a norm is folded into a pair's x only");
  constexpr int kWarps = kGemvThreads / 32;
  __shared__ float part[kWarps][M * R];
  extern __shared__ uint4 xn[];  // kNorm: layer_norm(x) [M, kc]
  const int lane = threadIdx.x & 31, warp = static_cast<int>(threadIdx.x >> 5);
  const int64_t row0 = int64_t{blockIdx.x} * R;
  if (prefetch && kTwo != kPair && threadIdx.x == 0) prefetch_rows(w, n, kc, row0, R);
  pdl_enter();
  if constexpr (kNorm) layer_norm_rows<M, kGemvThreads>(x, kc, nt, xn);
  const uint4* wr[R];
  const uint4* wr2[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = min(row0 + r, n - 1);
    wr[r] = kTwo == kPair && row >= t.n1 ? t.w + (row - t.n1) * kc : w + row * kc;
    wr2[r] = kTwo == kSum ? t.w + row * t.kc : wr[r];
  }
  const int64_t total = kTwo == kSum ? kc + t.kc : kc;
  // Chunk cc of row r of w, and of row m of x.
  auto w_at = [&](int r, int64_t cc) {
    if constexpr (kTwo == kSum) return cc < kc ? wr[r] + cc : wr2[r] + (cc - kc);
    return wr[r] + cc;
  };
  auto x_at = [&](int m, int64_t cc) {
    if constexpr (kTwo == kSum) return cc < kc ? x + m * kc + cc : t.x + m * t.kc + (cc - kc);
    return x + m * kc + cc;
  };
  auto x_load = [&](int m, int64_t cc) {
    if constexpr (kNorm) return xn[m * kc + cc];
    return __ldg(x_at(m, cc));
  };

  float acc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.0f;

  for (int64_t c = threadIdx.x; c < total; c += kGemvThreads * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + kGemvThreads * u;
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = cc < total ? ld_stream(w_at(r, cc)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + kGemvThreads * u;
      if (cc < total) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xv = x_load(m, cc);
#pragma unroll
          for (int r = 0; r < R; ++r) dot8(acc[m][r], xv, wv[u][r]);
        }
      }
    }
  }

#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1)
        acc[m][r] += __shfl_xor_sync(0xffffffffu, acc[m][r], off);
      if (lane == 0) part[warp][m * R + r] = acc[m][r];
    }
  __syncthreads();
  const int me = static_cast<int>(threadIdx.x);
  if (me >= M * R) return;
  const int m = me / R, r = me % R;
  const int64_t row = row0 + r;
  if (row >= n) return;
  const bool second = kTwo == kPair && row >= t.n1;  // a pair's second weight's row
  const int64_t r2 = row - t.n1;
  float y = second ? (t.bias ? bf16_bits_to_f32(t.bias[r2]) : 0.0f)
                   : (bias ? bf16_bits_to_f32(bias[row]) : 0.0f);
  if (kTwo == kSum && t.bias) y += bf16_bits_to_f32(t.bias[row]);
#pragma unroll
  for (int i = 0; i < kWarps; ++i) y += part[i][me];
  if (second) {
    store_epilogue(y, t.gelu, false, nullptr, t.out, false, m * (n - t.n1) + r2);
  } else {
    // (A pair's first product: out is [M, n1].)
    store_epilogue(y, gelu, accumulate, addend, out, f32_out, m * (kTwo == kPair ? t.n1 : n) + row);
  }
}

// y [rows, cols] F32 (cuBLASLt's product, no bias) -> out under the epilogue.
// With FP8 scales, y is a product of codes: y * row[i / cols] * col[i % cols] (or col[0]) first.
__global__ void linear_epilogue_kernel(const float* y, const uint16_t* bias, int64_t total,
                                       int64_t cols, bool gelu, bool accumulate, void* out,
                                       bool f32_out, Fp8Scales scales, const uint16_t* addend) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % cols;
    float v = y[i];
    if (scales.row) v *= scales.row[i / cols] * scales.col[scales.per_col ? c : 0];
    const float b = bias ? bf16_bits_to_f32(bias[c]) : 0.0f;
    store_epilogue(v + b, gelu, accumulate, addend, out, f32_out, i);
  }
}

// (R, U) of a split kernel: rows of w a block, chunks per thread per step.
template <int R, int U>
struct Shape {
  static constexpr int kR = R, kU = U;
};

// (R, U) of each variant: rows per warp, chunks per lane per step.
template <int M>
void launch_m(int variant, const uint4* x, const uint4* w, const uint16_t* bias, int64_t n,
              int64_t kc, bool gelu, bool accumulate, const uint16_t* addend, void* out,
              bool f32_out, cudaStream_t s, const Second& two, const Norm& nt) {
  // Only worth it where the kernel may start early (a programmatic dependent).
  const bool prefetch = tuning().gemv_prefetch && pdl_for(s);
  auto go = [&](auto kernel, int r) {
    const int64_t rows_per_block = int64_t{kGemvThreads / 32} * r;
    const unsigned blocks = static_cast<unsigned>((n + rows_per_block - 1) / rows_per_block);
    pdl_launch(kernel, blocks, kGemvThreads, 0, s, x, w, bias, n, kc, gelu, accumulate, addend, out,
               f32_out, prefetch);
  };
  // The split kernels: a block of R rows, the grid n / R blocks (variants 5 and 6 change R,
  // and so how many waves the grid makes, at 8 loads in flight a lane).
  // (Two products: the split kernels only; gemv_two_supported. A pair's n is both weights'.)
  auto split = [&](auto kernel_t, int r) {
    using K = decltype(kernel_t);
    const unsigned blocks = static_cast<unsigned>((n + r - 1) / r);
    auto* kernel = two.out  ? gemv_split_kernel<M, K::kR, K::kU, kPair>
                   : two.kc ? gemv_split_kernel<M, K::kR, K::kU, kSum>
                            : gemv_split_kernel<M, K::kR, K::kU, kOne>;
    if constexpr (M <= kGemvNormMaxRows) {
      if (nt.w) kernel = gemv_split_kernel<M, K::kR, K::kU, kPair, true>;
    }
    const size_t smem = nt.w ? static_cast<size_t>(M * kc * 16) : 0;
    pdl_launch(kernel, blocks, kGemvThreads, smem, s, x, w, bias, n, kc, gelu, accumulate, addend,
               out, f32_out, prefetch, two, nt);
  };
  if (variant == 4) {
    constexpr int kR = M <= 4 ? 2 : 1;
    return split(Shape < kR, M <= 2 ? 4 : 2 > {}, kR);
  }
  if (variant == 5) {
    if constexpr (M <= 2) return split(Shape<4, 2>{}, 4);
    return split(Shape<2, 2>{}, 2);
  }
  if (variant == 6) {
    if constexpr (M <= 2) return split(Shape<1, 8>{}, 1);
    return split(Shape<1, 2>{}, 1);
  }
  switch (variant) {
    case 1:
      go(gemv_kernel<M, 1, 8>, 1);
      break;
    case 3:
      go(gemv_kernel<M, 4, 2>, 4);
      break;
    default:  // 2
      if constexpr (M <= 4) {
        go(gemv_kernel<M, 2, 4>, 2);
      } else {
        go(gemv_kernel<M, 2, 2>, 2);
      }
  }
}

}  // namespace

bool gemv_supported(int64_t rows, int64_t k, const void* x, const void* w) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return rows >= 1 && rows <= kGemvMaxRows && k % 8 == 0 && k > 0 && aligned(x) && aligned(w);
}

bool gemv_two_supported(int variant) {
  return variant >= 4 && variant <= 6;
}

bool gemv_norm_supported(int variant, int64_t rows, int64_t k, const NormTerm& norm) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return gemv_two_supported(variant) && rows >= 1 && rows <= kGemvNormMaxRows && k % 8 == 0 &&
         rows * k * 2 <= kGemvNormMaxBytes && norm.w && norm.b && aligned(norm.w) &&
         aligned(norm.b);
}

void gemv(const uint16_t* x, const uint16_t* w, const uint16_t* bias, int64_t rows, int64_t n,
          int64_t k, bool gelu, bool accumulate, const uint16_t* addend, void* out, bool f32_out,
          int variant, cudaStream_t s, const SecondTerm& plus, const NormTerm& norm) {
  if (n == 0) return;
  const auto* xv = reinterpret_cast<const uint4*>(x);
  const auto* wv = reinterpret_cast<const uint4*>(w);
  const int64_t kc = k / 8;
  const Second two{reinterpret_cast<const uint4*>(plus.x),
                   reinterpret_cast<const uint4*>(plus.w),
                   plus.bias,
                   plus.k / 8,
                   plus.out,
                   plus.n1,
                   plus.gelu};
  const Norm nt{reinterpret_cast<const uint4*>(norm.w), reinterpret_cast<const uint4*>(norm.b),
                norm.eps};
  switch (rows) {
#define KESTREL_GEMV_CASE(M)                                                                       \
  case M:                                                                                          \
    launch_m<M>(variant, xv, wv, bias, n, kc, gelu, accumulate, addend, out, f32_out, s, two, nt); \
    break;
    KESTREL_GEMV_CASE(1)
    KESTREL_GEMV_CASE(2)
    KESTREL_GEMV_CASE(3)
    KESTREL_GEMV_CASE(4)
    KESTREL_GEMV_CASE(5)
    KESTREL_GEMV_CASE(6)
    KESTREL_GEMV_CASE(7)
    KESTREL_GEMV_CASE(8)
#undef KESTREL_GEMV_CASE
    default:
      break;  // the caller checked gemv_supported
  }
}

void linear_epilogue(const float* y, const uint16_t* bias, int64_t rows, int64_t cols, bool gelu,
                     bool accumulate, void* out, bool f32_out, cudaStream_t s,
                     const Fp8Scales& scales, const uint16_t* addend) {
  const int64_t total = rows * cols;
  if (total == 0) return;
  const int64_t want = (total + 255) / 256, blocks = want < 4096 ? want : 4096;
  pdl_launch(linear_epilogue_kernel, static_cast<unsigned>(blocks), 256, 0, s, y, bias, total, cols,
             gelu, accumulate, out, f32_out, scales, addend);
}

}  // namespace kestrel::cuda::kernels
