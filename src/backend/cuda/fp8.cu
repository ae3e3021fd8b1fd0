// FP8 E4M3 weights on CUDA: per-row quantization of BF16 weights (the row's amax / 448, round to
// nearest even, saturating: the CPU's ops::quantize_fp8 on the same values, code for code), their
// dequantization back to BF16, and the skinny linear of decode with FP8 weights (weight-only:
// BF16 activations, weights converted in registers, fp32 sums, the row scale in the epilogue).
// The GEMV streams 1 byte a weight where the BF16 one streams 2: decode is bound by those bytes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <cub/block/block_reduce.cuh>

#include "backend/cuda/kernels.h"
#include "backend/cuda/linear_util.cuh"

namespace kestrel::cuda::kernels {
namespace {

constexpr int kQuantThreads = 256;
constexpr int kGemvThreads = 128;  // 4 warps, k split between them, as the BF16 v4 GEMV
constexpr float kE4M3Max = 448.0f;

__device__ __forceinline__ uint8_t to_e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// Two E4M3 codes (low byte first) as two floats.
__device__ __forceinline__ float2 e4m3x2_to_f32(uint16_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(codes, __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

__device__ __forceinline__ float load_f32(const uint16_t* p, int64_t i) {
  return bf16_bits_to_f32(p[i]);
}
__device__ __forceinline__ float load_f32(const float* p, int64_t i) {
  return p[i];
}

// One block per row: the row's amax, then its codes. T: uint16_t (BF16 bits) or float.
template <typename T>
__global__ void __launch_bounds__(kQuantThreads)
    quantize_rows_kernel(const T* __restrict__ w, int64_t cols, uint8_t* __restrict__ q,
                         float* __restrict__ scale, bool given) {
  using Reduce = cub::BlockReduce<float, kQuantThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float row_scale;
  const int64_t row = blockIdx.x;
  const T* wr = w + row * cols;
  float amax = 0.0f;
  for (int64_t c = threadIdx.x; c < cols && !given; c += kQuantThreads)
    amax = fmaxf(amax, fabsf(load_f32(wr, c)));
  amax = Reduce(tmp).Reduce(amax, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) {
    row_scale = given ? scale[row] : amax > 0.0f && isfinite(amax) ? amax / kE4M3Max : 1.0f;
    scale[row] = row_scale;
  }
  __syncthreads();
  const float s = row_scale;
  for (int64_t c = threadIdx.x; c < cols; c += kQuantThreads)
    q[row * cols + c] = to_e4m3(load_f32(wr, c) / s);
}

__global__ void dequantize_kernel(const uint8_t* __restrict__ q, const float* __restrict__ scale,
                                  bool per_row, int64_t rows, int64_t cols,
                                  uint16_t* __restrict__ out) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float s = scale[per_row ? i / cols : 0];
    const __half_raw h = __nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3);
    out[i] = f32_to_bf16_bits(__half2float(*reinterpret_cast<const __half*>(&h)) * s);
  }
}

// acc += the 16 products of 16 FP8 weights (one 16-byte chunk) and 16 BF16 activations (two).
__device__ __forceinline__ void dot16(float& acc, const uint4& w, const uint4& x0,
                                      const uint4& x1) {
  const uint32_t* pw = &w.x;
  const uint32_t* px0 = &x0.x;
  const uint32_t* px1 = &x1.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t xa = i < 2 ? px0[2 * i] : px1[2 * i - 4];
    const uint32_t xb = i < 2 ? px0[2 * i + 1] : px1[2 * i - 3];
    const float2 w01 = e4m3x2_to_f32(static_cast<uint16_t>(pw[i] & 0xffffu));
    const float2 w23 = e4m3x2_to_f32(static_cast<uint16_t>(pw[i] >> 16));
    acc = fmaf(__uint_as_float(xa << 16), w01.x, acc);
    acc = fmaf(__uint_as_float(xa & 0xffff0000u), w01.y, acc);
    acc = fmaf(__uint_as_float(xb << 16), w23.x, acc);
    acc = fmaf(__uint_as_float(xb & 0xffff0000u), w23.y, acc);
  }
}

// x [M, 2 kc] and w [n, kc] in 16-byte chunks (kc = K / 16); a block's 4 warps share R rows of w
// and split k, summed through shared memory; out [M, n] under the epilogue (as gemv.cu's).
template <int M, int R, int U>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_fp8_kernel(const uint4* __restrict__ x, const uint4* __restrict__ w,
                    const float* __restrict__ scale, bool per_row,
                    const uint16_t* __restrict__ bias, int64_t n, int64_t kc, bool gelu,
                    bool accumulate, const uint16_t* addend, void* out, bool f32_out) {
  constexpr int kWarps = kGemvThreads / 32;
  __shared__ float part[kWarps][M * R];
  const int lane = threadIdx.x & 31, warp = static_cast<int>(threadIdx.x >> 5);
  const int64_t row0 = int64_t{blockIdx.x} * R;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = w + min(row0 + r, n - 1) * kc;
  float acc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.0f;

  for (int64_t c = threadIdx.x; c < kc; c += kGemvThreads * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + kGemvThreads * u;
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = cc < kc ? ld_stream(wr[r] + cc) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t cc = c + kGemvThreads * u;
      if (cc < kc) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 x0 = __ldg(x + m * 2 * kc + 2 * cc), x1 = __ldg(x + m * 2 * kc + 2 * cc + 1);
#pragma unroll
          for (int r = 0; r < R; ++r) dot16(acc[m][r], wv[u][r], x0, x1);
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
  const int t = static_cast<int>(threadIdx.x);
  if (t >= M * R) return;
  const int m = t / R, r = t % R;
  const int64_t row = row0 + r;
  if (row >= n) return;
  float y = 0.0f;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) y += part[i][t];
  y *= scale[per_row ? row : 0];
  if (bias) y += bf16_bits_to_f32(bias[row]);
  store_epilogue(y, gelu, accumulate, addend, out, f32_out, m * n + row);
}

template <int M>
void launch_fp8(const uint4* x, const uint4* w, const float* scale, bool per_row,
                const uint16_t* bias, int64_t n, int64_t kc, bool gelu, bool accumulate,
                const uint16_t* addend, void* out, bool f32_out, cudaStream_t s) {
  // Twice the weights of a BF16 chunk per load: half the chunks in flight buy the same bytes.
  constexpr int kR = M <= 4 ? 2 : 1;
  constexpr int kU = M <= 2 ? 4 : 2;
  const unsigned blocks = static_cast<unsigned>((n + kR - 1) / kR);
  gemv_fp8_kernel<M, kR, kU><<<blocks, kGemvThreads, 0, s>>>(
      x, w, scale, per_row, bias, n, kc, gelu, accumulate, addend, out, f32_out);
}

}  // namespace

void quantize_fp8_rows(const void* w, bool f32_in, int64_t rows, int64_t cols, uint8_t* q,
                       float* scale, bool given_scale, cudaStream_t s) {
  if (rows == 0) return;
  const auto blocks = static_cast<unsigned>(rows);
  if (f32_in)
    quantize_rows_kernel<<<blocks, kQuantThreads, 0, s>>>(static_cast<const float*>(w), cols, q,
                                                          scale, given_scale);
  else
    quantize_rows_kernel<<<blocks, kQuantThreads, 0, s>>>(static_cast<const uint16_t*>(w), cols, q,
                                                          scale, given_scale);
}

void dequantize_fp8_rows(const uint8_t* q, const float* scale, bool per_row, int64_t rows,
                         int64_t cols, uint16_t* out, cudaStream_t s) {
  const int64_t total = rows * cols;
  if (total == 0) return;
  const int64_t want = (total + 255) / 256, blocks = want < 8192 ? want : 8192;
  dequantize_kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(q, scale, per_row, rows, cols,
                                                                  out);
}

bool gemv_fp8_supported(int64_t rows, int64_t k, const void* x, const void* w) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return rows >= 1 && rows <= kFp8GemvMaxRows && k % 16 == 0 && k > 0 && aligned(x) && aligned(w);
}

void gemv_fp8(const uint16_t* x, const uint8_t* w, const float* scale, bool per_row,
              const uint16_t* bias, int64_t rows, int64_t n, int64_t k, bool gelu, bool accumulate,
              const uint16_t* addend, void* out, bool f32_out, cudaStream_t s) {
  if (n == 0) return;
  const auto* xv = reinterpret_cast<const uint4*>(x);
  const auto* wv = reinterpret_cast<const uint4*>(w);
  const int64_t kc = k / 16;
  switch (rows) {
#define KESTREL_GEMV_FP8_CASE(M)                                                                   \
  case M:                                                                                          \
    launch_fp8<M>(xv, wv, scale, per_row, bias, n, kc, gelu, accumulate, addend, out, f32_out, s); \
    break;
    KESTREL_GEMV_FP8_CASE(1)
    KESTREL_GEMV_FP8_CASE(2)
#undef KESTREL_GEMV_FP8_CASE
    default:
      break;  // the caller checked gemv_fp8_supported
  }
}

}  // namespace kestrel::cuda::kernels
