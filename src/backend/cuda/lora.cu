// LoRA deltas over segments of rows (ops::lora_add on CUDA), in two kernels that read a
// device-side segment table (kernels::LoraSegDesc):
//   shrink: vp[split, row, j] = x[row, chunk] . a[j, chunk]       (fp32 partial dot products)
//   expand: out[row, o] += sum_j (scale * sum_split vp[split, row, j]) * b[o, j]
// The shrink splits the input dimension over blocks (split-K) when the grid would be small
// (decode), one rank per warp, so many blocks read a at once; the expand sums the splits in a
// fixed order while it loads its tile of v (no atomics: results are deterministic). Both walk
// tiles of kLoraTileRows rows of one segment, so a and b are read once per tile. The expand is
// launched as a programmatic dependent of the shrink (PDL, sm_90): it loads its b rows and out
// values while the shrink runs and waits for the shrink's results only before reading vp.
// Weights are bf16 or f16 (LoraSegDesc::f16), x and out bf16, all sums fp32, out rounded once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace kestrel::cuda::kernels {
namespace {

constexpr int kTile = kLoraTileRows;  // rows per tile
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;  // shrink: one rank per warp, kWarps ranks per block
constexpr int kPrefetch = 2;           // expand: 16-byte words of b rows loaded before the wait
constexpr int kMaxSplits = 64;         // split-K partials the expand sums at most
                                       // (KESTREL_LORA_SHRINK_BLOCKS overrides it)
constexpr int64_t kWideBlocks = 264;   // expand: 2 columns a thread from 264 blocks on

__device__ __forceinline__ float bf(uint16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}

__device__ __forceinline__ float hf(uint16_t v) {
  return __half2float(__ushort_as_half(v));
}

// Eight 16-bit values of one 16-byte word as floats: bf16, or f16 when f16.
__device__ __forceinline__ void cvt8(const uint4 u, bool f16, float (&f)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (f16) {
      f[2 * i] = hf(static_cast<uint16_t>(w[i] & 0xffffu));
      f[2 * i + 1] = hf(static_cast<uint16_t>(w[i] >> 16));
    } else {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
}

// E consecutive values as floats; E == 8 is one 16-byte load (aligned by the caller).
template <int E>
__device__ __forceinline__ void load_w(const uint16_t* p, bool f16, float (&f)[E]) {
  if constexpr (E == 8) {
    cvt8(*reinterpret_cast<const uint4*>(p), f16, f);
  } else {
#pragma unroll
    for (int i = 0; i < E; ++i) f[i] = f16 ? hf(p[i]) : bf(p[i]);
  }
}

// One warp's rank of one tile over one split (the shrink kernel's body, E as there).
template <int E, int ROWS>
__device__ __forceinline__ void shrink_warp(const LoraSegDesc& sd, const uint16_t* __restrict__ x,
                                            int64_t in, int64_t chunk, int split, int rank,
                                            int row0, float* __restrict__ vp, int v_stride,
                                            int64_t split_stride) {
  constexpr int kUnroll = ROWS == 1 ? 4 : 2;  // loads of a in flight per thread
  const int lane = threadIdx.x % 32;
  const int n_rows = min(ROWS, sd.end - row0);
  const bool f16 = sd.f16 != 0;
  const int64_t k0 = split * chunk, k1 = min(in, k0 + chunk);
  const uint16_t* arow = sd.a + rank * in;

  float acc[ROWS];
#pragma unroll
  for (int t = 0; t < ROWS; ++t) acc[t] = 0.0f;
  for (int64_t k = k0 + lane * E; k < k1; k += kUnroll * 32 * E) {
    float av[kUnroll][E];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (k + u * 32 * E < k1) {
        load_w<E>(arow + k + u * 32 * E, f16, av[u]);
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) av[u][e] = 0.0f;
      }
    }
#pragma unroll
    for (int t = 0; t < ROWS; ++t) {
      if (t < n_rows) {
        const uint16_t* xr = x + static_cast<int64_t>(row0 + t) * in;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (k + u * 32 * E < k1) {
            float xv[E];
            load_w<E>(xr + k + u * 32 * E, false, xv);
#pragma unroll
            for (int e = 0; e < E; ++e) acc[t] = fmaf(xv[e], av[u][e], acc[t]);
          }
        }
      }
    }
  }
  float* dst = vp + split * split_stride + static_cast<int64_t>(row0) * v_stride + rank;
#pragma unroll
  for (int t = 0; t < ROWS; ++t) {
    if (t < n_rows) {
      float s = acc[t];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0) dst[static_cast<int64_t>(t) * v_stride] = s;
    }
  }
}

// grid (tiles, segments, splits * rank_groups); warp w of rank group g owns rank g * 8 + w of
// its tile over the columns [split * chunk, (split + 1) * chunk) of x and a. E = 8 needs
// in % 8 == 0 and 16-byte aligned x and a; chunk is a multiple of 32 * E. E = 0: 8 or 1 per
// entry, from LoraSegDesc::vec (chunk then a multiple of 256 when in % 8 == 0). ROWS: rows per
// tile (1 when every segment has one row, as in decode; else kTile). At most 64 registers.
template <int E, int ROWS>
__global__ void __launch_bounds__(kThreads, 4)
    lora_shrink_kernel(const LoraSegDesc* __restrict__ table, const uint16_t* __restrict__ x,
                       int64_t in, int64_t chunk, int rank_groups, float* __restrict__ vp,
                       int v_stride, int64_t split_stride) {
  // The base linear's out and x are complete from the wait on; then the expand's blocks may
  // start their loads of b and out.
  pdl_enter();
  const LoraSegDesc sd = table[blockIdx.y];
  const int split = static_cast<int>(blockIdx.z) / rank_groups;
  const int group = static_cast<int>(blockIdx.z) % rank_groups;
  const int row0 = sd.begin + static_cast<int>(blockIdx.x) * ROWS;
  const int rank = group * kWarps + static_cast<int>(threadIdx.x) / 32;
  // Grid sized for the longest segment / rank; no block-wide barrier below, so warps leave alone.
  if (row0 >= sd.end || rank >= sd.r) return;
  if constexpr (E == 0) {
    if (sd.vec & kLoraVecA)
      shrink_warp<8, ROWS>(sd, x, in, chunk, split, rank, row0, vp, v_stride, split_stride);
    else
      shrink_warp<1, ROWS>(sd, x, in, chunk, split, rank, row0, vp, v_stride, split_stride);
  } else {
    shrink_warp<E, ROWS>(sd, x, in, chunk, split, rank, row0, vp, v_stride, split_stride);
  }
}

// The expand kernel's body for a block with rows (VEC as there, 0 or 1).
template <bool VEC, int C, int ROWS>
__device__ __forceinline__ void expand_block(const LoraSegDesc& sd, int row0,
                                             const float* __restrict__ vp, int splits,
                                             int64_t split_stride, int v_stride, int64_t out_dim,
                                             uint16_t* __restrict__ out) {
  const int n_rows = min(ROWS, sd.end - row0);
  const int r = sd.r;
  const bool f16 = sd.f16 != 0;
  const int64_t o0 = static_cast<int64_t>(blockIdx.z) * (kThreads * C) + threadIdx.x;

  // Prologue: out was written before the shrink began, b is constant.
  float base[C][ROWS];
  uint4 bq[C][kPrefetch];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t o = o0 + c * kThreads;
    if (o >= out_dim) continue;
    if constexpr (VEC) {
#pragma unroll
      for (int q = 0; q < kPrefetch; ++q)
        if (q * 8 < r) bq[c][q] = *reinterpret_cast<const uint4*>(sd.b + o * r + q * 8);
    }
#pragma unroll
    for (int t = 0; t < ROWS; ++t)
      if (t < n_rows) base[c][t] = bf(out[static_cast<int64_t>(row0 + t) * out_dim + o]);
  }

  pdl_wait();  // the shrink's vp is complete and visible from here on
  pdl_trigger();
  __shared__ float vs[ROWS][kMaxLoraRank];
  for (int i = threadIdx.x; i < n_rows * r; i += kThreads) {
    const int t = i / r, j = i % r;
    const float* src = vp + static_cast<int64_t>(row0 + t) * v_stride + j;
    float s = 0.0f;
    for (int sp = 0; sp < splits; ++sp) s += src[sp * split_stride];
    vs[t][j] = sd.scale * s;
  }
  __syncthreads();

  float acc[C][ROWS];
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int t = 0; t < ROWS; ++t) acc[c][t] = 0.0f;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t o = o0 + c * kThreads;
    if (o >= out_dim) continue;
    const uint16_t* brow = sd.b + o * r;
    if constexpr (VEC) {
#pragma unroll
      for (int q = 0; q < kPrefetch; ++q) {
        if (q * 8 < r) {
          float bv[8];
          cvt8(bq[c][q], f16, bv);
#pragma unroll
          for (int t = 0; t < ROWS; ++t)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[c][t] = fmaf(vs[t][q * 8 + e], bv[e], acc[c][t]);
        }
      }
      for (int j = 8 * kPrefetch; j < r; j += 8) {
        float bv[8];
        load_w<8>(brow + j, f16, bv);
#pragma unroll
        for (int t = 0; t < ROWS; ++t)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[c][t] = fmaf(vs[t][j + e], bv[e], acc[c][t]);
      }
    } else {
      for (int j = 0; j < r; ++j) {
        const float bv = f16 ? hf(brow[j]) : bf(brow[j]);
#pragma unroll
        for (int t = 0; t < ROWS; ++t) acc[c][t] = fmaf(vs[t][j], bv, acc[c][t]);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t o = o0 + c * kThreads;
    if (o >= out_dim) continue;
#pragma unroll
    for (int t = 0; t < ROWS; ++t) {
      if (t < n_rows) {
        out[static_cast<int64_t>(row0 + t) * out_dim + o] =
            __bfloat16_as_ushort(__float2bfloat16_rn(base[c][t] + acc[c][t]));
      }
    }
  }
}

// grid (tiles, segments, ceil(out_dim / (kThreads * C))); thread columns o + c * kThreads for
// c < C. ROWS as in the shrink. VEC: 1 when every r % 8 == 0 and every b 16-byte aligned (then the
// first 16 ranks of each b row are loaded before the wait for the shrink, with the tile's out
// values), 0 scalar loads, 2 either per entry from LoraSegDesc::vec.
template <int VEC, int C, int ROWS>
__global__ void __launch_bounds__(kThreads, 4)
    lora_expand_kernel(const LoraSegDesc* __restrict__ table, const float* __restrict__ vp,
                       int splits, int64_t split_stride, int v_stride, int64_t out_dim,
                       uint16_t* __restrict__ out) {
  const LoraSegDesc sd = table[blockIdx.y];
  const int row0 = sd.begin + static_cast<int>(blockIdx.x) * ROWS;
  if (row0 >= sd.end) {
    pdl_wait();  // every block waits, so this grid never ends before the shrink
    pdl_trigger();
    return;
  }
  if (VEC == 1 || (VEC == 2 && (sd.vec & kLoraVecB)))
    expand_block<true, C, ROWS>(sd, row0, vp, splits, split_stride, v_stride, out_dim, out);
  else
    expand_block<false, C, ROWS>(sd, row0, vp, splits, split_stride, v_stride, out_dim, out);
}

template <typename... Params, typename... Args>
void launch_expand(void (*kernel)(Params...), dim3 grid, cudaStream_t s, bool pdl, Args... args) {
  if (pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, kernel, args...) == cudaSuccess) return;
    (void)cudaGetLastError();  // PDL refused: the plain launch below reports its own errors
  }
  kernel<<<grid, kThreads, 0, s>>>(args...);
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// One-row segments take their own kernel (Tuning::lora_rows1).
int64_t rows_per_tile(int max_rows) {
  return max_rows == 1 && tuning().lora_rows1 ? 1 : kTile;
}

template <int ROWS>
void launch(const LoraSegDesc* table, int n_segments, int max_rows, int max_r, bool vec_in,
            bool vec_b, const uint16_t* x, int64_t rows, int64_t in, float* v, int splits,
            int64_t out_dim, uint16_t* out, cudaStream_t s) {
  const int64_t tiles = ceil_div(max_rows, ROWS);
  const int64_t unit = 32 * (vec_in ? 8 : 1);
  const int64_t chunk = ceil_div(ceil_div(in, unit), splits) * unit;
  const int groups = static_cast<int>(ceil_div(max_r, kWarps));
  const int64_t split_stride = rows * max_r;
  const dim3 gs(static_cast<unsigned>(tiles), static_cast<unsigned>(n_segments),
                static_cast<unsigned>(splits * groups));
  if (vec_in)
    pdl_launch(lora_shrink_kernel<8, ROWS>, gs, kThreads, 0, s, table, x, in, chunk, groups, v,
               max_r, split_stride);
  else
    pdl_launch(lora_shrink_kernel<1, ROWS>, gs, kThreads, 0, s, table, x, in, chunk, groups, v,
               max_r, split_stride);
  const bool wide = ROWS == 1 && tuning().lora_wide &&
                    tiles * n_segments * ceil_div(out_dim, 2 * kThreads) >= kWideBlocks;
  const dim3 ge(static_cast<unsigned>(tiles), static_cast<unsigned>(n_segments),
                static_cast<unsigned>(ceil_div(out_dim, (wide ? 2 : 1) * kThreads)));
  // PDL only with more than one tile: decode batch 1 is bound by the host, where
  // cudaLaunchKernelEx costs more than a plain launch (1.69 against 1.40 ms a step measured).
  // In a capture the host's cost is paid once: PDL there at every size.
  const bool pdl = tuning().lora_pdl && (tiles * n_segments > 1 || pdl_for(s));
  const float* vc = v;
  if (vec_b && wide)
    launch_expand(lora_expand_kernel<1, 2, ROWS>, ge, s, pdl, table, vc, splits, split_stride,
                  max_r, out_dim, out);
  else if (vec_b)
    launch_expand(lora_expand_kernel<1, 1, ROWS>, ge, s, pdl, table, vc, splits, split_stride,
                  max_r, out_dim, out);
  else if (wide)
    launch_expand(lora_expand_kernel<0, 2, ROWS>, ge, s, pdl, table, vc, splits, split_stride,
                  max_r, out_dim, out);
  else
    launch_expand(lora_expand_kernel<0, 1, ROWS>, ge, s, pdl, table, vc, splits, split_stride,
                  max_r, out_dim, out);
}

}  // namespace

int lora_shrink_splits(int64_t in, int n_segments, int max_rows, int max_r, bool vec_in) {
  if (n_segments == 0 || max_rows == 0 || max_r == 0 || in == 0) return 1;
  const int64_t units = ceil_div(in, 32 * (vec_in ? 8 : 1));  // one load per lane per unit
  const int64_t blocks =
      ceil_div(max_rows, rows_per_tile(max_rows)) * n_segments * ceil_div(max_r, kWarps);
  const int64_t target = tuning().lora_shrink_blocks;
  const int64_t want = ceil_div(target, blocks);
  int64_t per_split = std::max<int64_t>(1, units / want);
  per_split = std::max(per_split, ceil_div(units, kMaxSplits));
  return static_cast<int>(ceil_div(units, per_split));
}

void lora_add(const LoraSegDesc* table, int n_segments, int max_rows, int max_r, bool vec_in,
              bool vec_b, const uint16_t* x, int64_t rows, int64_t in, float* v, int splits,
              int64_t out_dim, uint16_t* out, cudaStream_t s) {
  if (n_segments == 0 || max_rows == 0 || max_r == 0) return;
  if (rows_per_tile(max_rows) == 1)
    launch<1>(table, n_segments, max_rows, max_r, vec_in, vec_b, x, rows, in, v, splits, out_dim,
              out, s);
  else
    launch<kTile>(table, n_segments, max_rows, max_r, vec_in, vec_b, x, rows, in, v, splits,
                  out_dim, out, s);
}

void lora_add_graph(const LoraSegDesc* table, int n_segments, int max_r, bool x_vec,
                    const uint16_t* x, int64_t rows, int64_t in, float* v, int splits,
                    int64_t out_dim, uint16_t* out, cudaStream_t s) {
  if (n_segments == 0 || max_r == 0) return;
  // One row per entry: one tile per segment; the unit of a split fits either load width.
  const int64_t unit = 32 * (x_vec ? 8 : 1);
  const int64_t chunk = ceil_div(ceil_div(in, unit), splits) * unit;
  const int groups = static_cast<int>(ceil_div(max_r, kWarps));
  const int64_t split_stride = rows * max_r;
  const dim3 gs(1, static_cast<unsigned>(n_segments), static_cast<unsigned>(splits * groups));
  if (x_vec)
    pdl_launch(lora_shrink_kernel<0, 1>, gs, kThreads, 0, s, table, x, in, chunk, groups, v, max_r,
               split_stride);
  else
    pdl_launch(lora_shrink_kernel<1, 1>, gs, kThreads, 0, s, table, x, in, chunk, groups, v, max_r,
               split_stride);
  const bool wide =
      tuning().lora_wide && n_segments * ceil_div(out_dim, 2 * kThreads) >= kWideBlocks;
  const dim3 ge(1, static_cast<unsigned>(n_segments),
                static_cast<unsigned>(ceil_div(out_dim, (wide ? 2 : 1) * kThreads)));
  // In a graph the host's launch cost is paid once at capture: PDL at every batch size.
  const float* vc = v;
  if (wide)
    launch_expand(lora_expand_kernel<2, 2, 1>, ge, s, tuning().lora_pdl, table, vc, splits,
                  split_stride, max_r, out_dim, out);
  else
    launch_expand(lora_expand_kernel<2, 1, 1>, ge, s, tuning().lora_pdl, table, vc, splits,
                  split_stride, max_r, out_dim, out);
}

}  // namespace kestrel::cuda::kernels
