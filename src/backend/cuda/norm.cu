// LayerNorm on the GPU (the CPU's cpu/norm.cpp): one block per row, bf16 in and out,
// fp32 mean and variance from CUB block sums.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace kestrel::cuda::kernels {
namespace {

// One block per row; mean, then variance of (x - mean), then the write.
// Generic version (any hidden), kBlock threads.
template <int kBlock>
__global__ void layer_norm_kernel(const uint16_t* x, const uint16_t* w, const uint16_t* b,
                                  int64_t hidden, float eps, uint16_t* out) {
  pdl_enter();
  const uint16_t* xr = x + blockIdx.x * hidden;
  uint16_t* yr = out + blockIdx.x * hidden;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden; i += kBlock) s += ld_bf16(xr, i);
  const float mean = block_sum<kBlock>(s) / static_cast<float>(hidden);
  float v = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden; i += kBlock) {
    const float c = ld_bf16(xr, i) - mean;
    v += c * c;
  }
  const float var = block_sum<kBlock>(v) / static_cast<float>(hidden);
  const float inv = rsqrtf(var + eps);
  for (int64_t i = threadIdx.x; i < hidden; i += kBlock)
    st_bf16(yr, i, (ld_bf16(xr, i) - mean) * inv * ld_bf16(w, i) + ld_bf16(b, i));
}

// hidden % 8 == 0 and hidden <= 8 * kLnChunks * kBlock: the row is read once, 16 bytes
// a thread at a time, and kept in registers.
constexpr int kLnChunks = 4;
template <int kBlock>
__global__ void layer_norm_vec_kernel(const uint16_t* x, const uint16_t* w, const uint16_t* b,
                                      int64_t hidden, float eps, uint16_t* out) {
  pdl_enter();
  const int n_chunks = static_cast<int>(hidden / 8);
  const uint4* xr = reinterpret_cast<const uint4*>(x + blockIdx.x * hidden);
  float vals[kLnChunks][8];
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kLnChunks; ++c) {
    const int idx = threadIdx.x + c * kBlock;
    uint4 u = idx < n_chunks ? xr[idx] : uint4{0, 0, 0, 0};
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      vals[c][2 * j] = f.x, vals[c][2 * j + 1] = f.y;
      s += f.x + f.y;
    }
  }
  const float mean = block_sum<kBlock>(s) / static_cast<float>(hidden);
  float v = 0.0f;
#pragma unroll
  for (int c = 0; c < kLnChunks; ++c) {
    if (threadIdx.x + c * kBlock >= n_chunks) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) v += (vals[c][j] - mean) * (vals[c][j] - mean);
  }
  const float inv = rsqrtf(block_sum<kBlock>(v) / static_cast<float>(hidden) + eps);
#pragma unroll
  for (int c = 0; c < kLnChunks; ++c) {
    const int idx = threadIdx.x + c * kBlock;
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

}  // namespace

template <int kBlock>
void launch_layer_norm(bool vec, const uint16_t* x, const uint16_t* w, const uint16_t* b,
                       int64_t n_tokens, int64_t hidden, float eps, uint16_t* out, cudaStream_t s) {
  const auto rows = static_cast<unsigned>(n_tokens);
  if (vec)
    pdl_launch(layer_norm_vec_kernel<kBlock>, rows, kBlock, 0, s, x, w, b, hidden, eps, out);
  else
    pdl_launch(layer_norm_kernel<kBlock>, rows, kBlock, 0, s, x, w, b, hidden, eps, out);
}

void layer_norm(const uint16_t* x, const uint16_t* w, const uint16_t* b, int64_t n_tokens,
                int64_t hidden, float eps, uint16_t* out, cudaStream_t s) {
  if (n_tokens == 0) return;
  const bool vec = hidden % 8 == 0 && hidden <= 8 * kLnChunks * 1024;
  int threads = hidden >= 1024 ? 512 : hidden >= 256 ? 256 : 64;
  if (vec) {
    // Enough threads for the row's 16-byte chunks at kLnChunks each, at least 128 once
    // there are that many chunks (more loads in flight).
    const int64_t chunks = hidden / 8;
    threads = 32;
    while (threads < 1024 && threads * kLnChunks < chunks) threads *= 2;
    if (threads < 128 && chunks >= 128) threads = 128;
  }
  switch (threads) {
    case 32:
      return launch_layer_norm<32>(vec, x, w, b, n_tokens, hidden, eps, out, s);
    case 64:
      return launch_layer_norm<64>(vec, x, w, b, n_tokens, hidden, eps, out, s);
    case 128:
      return launch_layer_norm<128>(vec, x, w, b, n_tokens, hidden, eps, out, s);
    case 256:
      return launch_layer_norm<256>(vec, x, w, b, n_tokens, hidden, eps, out, s);
    case 512:
      return launch_layer_norm<512>(vec, x, w, b, n_tokens, hidden, eps, out, s);
    default:
      return launch_layer_norm<1024>(vec, x, w, b, n_tokens, hidden, eps, out, s);
  }
}

}  // namespace kestrel::cuda::kernels
