// LoRA deltas over segments of rows (ops::lora_add on CUDA), in two kernels that read a
// device-side segment table (kernels::LoraSegDesc):
//   shrink: v[row, j] = x[row, :] . a[j, :]        (fp32, v [T, v_stride])
//   expand: out[row, o] += scale * sum_j v[row, j] * b[o, j]   (bf16 out, fp32 sums)
// Both walk tiles of kLoraTileRows rows of one segment, so a and b are read once per tile
// (decode: a segment is one row, one tile; prefill: a tile of 8 rows reads a / b once).
// No atomics: each shrink block owns 4 ranks (1 when the grid is small) of one tile over the whole
// input dimension (split over its 8 warps, reduced in shared memory), so results are deterministic.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace kestrel::cuda::kernels {
namespace {

constexpr int kTile = kLoraTileRows;  // rows per tile
constexpr int kShrinkRanksMax = 4;    // ranks per shrink block (1 when the grid is small)
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kExpandCols = 256;  // out columns per expand block (one per thread)

__device__ __forceinline__ float bf(uint16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}

// E consecutive bf16 values as floats; E == 8 is one 16-byte load (aligned by the caller).
template <int E>
__device__ __forceinline__ void load_bf16(const uint16_t* p, float (&f)[E]) {
  if constexpr (E == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < E; ++i) f[i] = bf(p[i]);
  }
}

// grid (tiles, segments, ceil(max_r / kShrinkRanks)); E = 8 needs in % 8 == 0 and 16-byte
// aligned x and a.
template <int E, int kShrinkRanks>
__global__ void __launch_bounds__(kThreads)
    lora_shrink_kernel(const LoraSegDesc* __restrict__ table, const uint16_t* __restrict__ x,
                       int64_t in, float* __restrict__ v, int v_stride) {
  const LoraSegDesc sd = table[blockIdx.y];
  const int row0 = sd.begin + blockIdx.x * kTile;
  const int rank0 = blockIdx.z * kShrinkRanks;
  if (row0 >= sd.end || rank0 >= sd.r) return;  // grid sized for the longest segment / rank
  const int n_rows = min(kTile, sd.end - row0);
  const int n_ranks = min(kShrinkRanks, sd.r - rank0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  float acc[kTile][kShrinkRanks];
#pragma unroll
  for (int t = 0; t < kTile; ++t)
#pragma unroll
    for (int g = 0; g < kShrinkRanks; ++g) acc[t][g] = 0.0f;

  for (int64_t k = static_cast<int64_t>(threadIdx.x) * E; k < in; k += kThreads * E) {
    float av[kShrinkRanks][E];
#pragma unroll
    for (int g = 0; g < kShrinkRanks; ++g) {
      if (g < n_ranks) {
        load_bf16<E>(sd.a + (rank0 + g) * in + k, av[g]);
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) av[g][e] = 0.0f;
      }
    }
#pragma unroll
    for (int t = 0; t < kTile; ++t) {
      if (t < n_rows) {
        float xv[E];
        load_bf16<E>(x + (row0 + t) * in + k, xv);
#pragma unroll
        for (int g = 0; g < kShrinkRanks; ++g)
#pragma unroll
          for (int e = 0; e < E; ++e) acc[t][g] = fmaf(xv[e], av[g][e], acc[t][g]);
      }
    }
  }

  __shared__ float red[kWarps][kTile][kShrinkRanks];
#pragma unroll
  for (int t = 0; t < kTile; ++t) {
    if (t < n_rows) {
#pragma unroll
      for (int g = 0; g < kShrinkRanks; ++g) {
        float s = acc[t][g];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0) red[warp][t][g] = s;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < kTile * kShrinkRanks) {
    const int t = threadIdx.x / kShrinkRanks, g = threadIdx.x % kShrinkRanks;
    if (t < n_rows && g < n_ranks) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += red[w][t][g];
      v[static_cast<int64_t>(row0 + t) * v_stride + rank0 + g] = s;
    }
  }
}

// grid (tiles, segments, ceil(out_dim / kExpandCols)); one out column per thread, its b row
// read once for the tile. VEC: r % 8 == 0 and b 16-byte aligned.
template <bool VEC>
__global__ void __launch_bounds__(kThreads)
    lora_expand_kernel(const LoraSegDesc* __restrict__ table, const float* __restrict__ v,
                       int v_stride, int64_t out_dim, uint16_t* __restrict__ out) {
  const LoraSegDesc sd = table[blockIdx.y];
  const int row0 = sd.begin + blockIdx.x * kTile;
  if (row0 >= sd.end) return;
  const int n_rows = min(kTile, sd.end - row0);
  const int r = sd.r;
  __shared__ float vs[kTile][kMaxLoraRank];
  for (int i = threadIdx.x; i < n_rows * r; i += kThreads)
    vs[i / r][i % r] = v[static_cast<int64_t>(row0 + i / r) * v_stride + i % r];
  __syncthreads();
  const int64_t o = static_cast<int64_t>(blockIdx.z) * kExpandCols + threadIdx.x;
  if (o >= out_dim) return;
  const uint16_t* brow = sd.b + o * r;
  float acc[kTile];
#pragma unroll
  for (int t = 0; t < kTile; ++t) acc[t] = 0.0f;
  if constexpr (VEC) {
    for (int j = 0; j < r; j += 8) {
      float bv[8];
      load_bf16<8>(brow + j, bv);
#pragma unroll
      for (int t = 0; t < kTile; ++t)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[t] = fmaf(vs[t][j + e], bv[e], acc[t]);
    }
  } else {
    for (int j = 0; j < r; ++j) {
      const float bv = bf(brow[j]);
#pragma unroll
      for (int t = 0; t < kTile; ++t) acc[t] = fmaf(vs[t][j], bv, acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kTile; ++t) {
    if (t < n_rows) {
      uint16_t* p = out + static_cast<int64_t>(row0 + t) * out_dim + o;
      const float y = bf(*p) + sd.scale * acc[t];
      *p = __bfloat16_as_ushort(__float2bfloat16_rn(y));
    }
  }
}

}  // namespace

void lora_add(const LoraSegDesc* table, int n_segments, int max_rows, int max_r, bool vec_in,
              bool vec_b, const uint16_t* x, int64_t in, float* v, int64_t out_dim, uint16_t* out,
              cudaStream_t s) {
  if (n_segments == 0 || max_rows == 0 || max_r == 0) return;
  const unsigned tiles = static_cast<unsigned>((max_rows + kTile - 1) / kTile);
  // Few blocks (decode: one tile per segment) read a at a few SMs' bandwidth: one rank a block
  // then gives 4x the blocks.
  const unsigned groups4 = static_cast<unsigned>((max_r + kShrinkRanksMax - 1) / kShrinkRanksMax);
  const bool small = static_cast<int64_t>(tiles) * n_segments * groups4 < 264;
  const dim3 gs(tiles, static_cast<unsigned>(n_segments),
                small ? static_cast<unsigned>(max_r) : groups4);
  if (vec_in && small)
    lora_shrink_kernel<8, 1><<<gs, kThreads, 0, s>>>(table, x, in, v, max_r);
  else if (vec_in)
    lora_shrink_kernel<8, 4><<<gs, kThreads, 0, s>>>(table, x, in, v, max_r);
  else if (small)
    lora_shrink_kernel<1, 1><<<gs, kThreads, 0, s>>>(table, x, in, v, max_r);
  else
    lora_shrink_kernel<1, 4><<<gs, kThreads, 0, s>>>(table, x, in, v, max_r);
  const dim3 ge(tiles, static_cast<unsigned>(n_segments),
                static_cast<unsigned>((out_dim + kExpandCols - 1) / kExpandCols));
  if (vec_b)
    lora_expand_kernel<true><<<ge, kThreads, 0, s>>>(table, v, max_r, out_dim, out);
  else
    lora_expand_kernel<false><<<ge, kThreads, 0, s>>>(table, v, max_r, out_dim, out);
}

}  // namespace kestrel::cuda::kernels
