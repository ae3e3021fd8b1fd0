// The linear of decode batches (3..64 rows) on tensor cores: out [M, N] = epilogue(x [M, K] @
// w [N, K]^T + bias), bf16 in, fp32 sums. Still bound by streaming w (2 M FLOP per 2-byte
// weight), so it is the GEMV's design with the FMAs replaced by mma.sync: w streamed straight
// from memory into the A fragments (no shared-memory staging), x into the B fragments. A block's
// warps own 16 rows of w each and walk the same k range together, so their x loads hit in L1
// (x is read from L2 once a block, not once a warp). Few blocks would leave the memory system
// idle, so k is split over blocks (grid.y) until about two blocks a multiprocessor: each split
// writes its fp32 partial tile to a workspace, and the last split of a tile to arrive (a counter
// per tile, reset by that block) sums the partials in split order (deterministic) and applies
// the epilogue. One split writes out directly.
//
// Fragments of mma.m16n8k16 (A = 16 rows of w, B = 8 rows of x, k = 16): lane (g = lane / 4,
// c = lane % 4) holds A rows g and g + 8 at k {2c, 2c+1, 2c+8, 2c+9} and B row g at the same k.
// A sum over k does not care about the order of k, so each lane instead loads 16 bytes (8
// consecutive k) of w rows g, g + 8 and of x row g at k = 8c: the first mma takes their
// first halves, the second mma their second halves. Four lanes cover 64 contiguous bytes a row;
// a warp's step covers 32 k of 16 w rows.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/kernels.h"
#include "backend/cuda/linear_util.cuh"
#include "backend/cuda/pdl.cuh"

namespace kestrel::cuda::kernels {
namespace {

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// An x chunk: read by every warp of the block, so kept in L1; volatile, so that it is issued
// where it stands (with the step's weight loads), not moved down beside its mma.
__device__ __forceinline__ uint4 ld_cached(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// x [m, kc] and w [n, kc] in 16-byte chunks (kc = K / 8); out [m, n]. MT tiles of 8 x rows
// (m <= 8 MT), W warps of 16 rows of w a block, U steps of 32 k in flight a lane; blockIdx.y
// is the split of k (split_steps steps each), partial / counters its workspace.
template <int MT, int U, int W>
__global__ void __launch_bounds__(W * 32)
    skinny_kernel(const uint4* __restrict__ x, const uint4* __restrict__ w,
                  const uint16_t* __restrict__ bias, int64_t m, int64_t n, int64_t kc, bool gelu,
                  bool accumulate, const uint16_t* addend, void* out, bool f32_out, float* partial,
                  int* counters, int64_t split_steps) {
  constexpr int kRows = W * 16, kCols = MT * 8, kTile = kRows * kCols, kThreads = W * 32;
  const int lane = threadIdx.x & 31, warp = static_cast<int>(threadIdx.x >> 5);
  const int g = lane >> 2, c = lane & 3;
  const int64_t tile = blockIdx.x;
  const int splits = static_cast<int>(gridDim.y), split = static_cast<int>(blockIdx.y);
  const int64_t row0 = tile * kRows + warp * 16;
  pdl_enter();

  const uint4* wr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h)  // tail rows: re-read the last, never stored
    wr[h] = w + min(row0 + h * 8 + g, n - 1) * kc;
  const uint4* xr[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) xr[mt] = mt * 8 + g < m ? x + (mt * 8 + g) * kc : nullptr;

  float acc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[mt][i] = 0.0f;

  const uint4 zero = make_uint4(0, 0, 0, 0);
  const int64_t begin = split * split_steps * 4, end = min(kc, (split + 1) * split_steps * 4);
  for (int64_t c0 = begin; c0 < end; c0 += 4 * U) {
    // Every load of the step goes out before the first mma waits on one: x's too (an x load
    // between mmas would put one L1 / L2 round trip per x tile on the warp's path).
    uint4 wv[U][2], xv[U][MT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t ch = c0 + 4 * u + c;
#pragma unroll
      for (int h = 0; h < 2; ++h) wv[u][h] = ch < end ? ld_stream(wr[h] + ch) : zero;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t ch = c0 + 4 * u + c;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        xv[u][mt] = ch < end && xr[mt] ? ld_cached(xr[mt] + ch) : zero;
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint4& lo = wv[u][0];
        const uint4& hi = wv[u][1];
        mma_bf16(acc[mt], lo.x, hi.x, lo.y, hi.y, xv[u][mt].x, xv[u][mt].y);
        mma_bf16(acc[mt], lo.z, hi.z, lo.w, hi.w, xv[u][mt].z, xv[u][mt].w);
      }
  }

  // Fragment element i: x row mt * 8 + 2c + (i & 1), w row (of the tile) warp * 16 + g + 8 (i / 2).
  if (splits == 1) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t col = mt * 8 + 2 * c + (i & 1), row = row0 + g + 8 * (i >> 1);
        if (col >= m || row >= n) continue;
        const float b = bias ? bf16_bits_to_f32(bias[row]) : 0.0f;
        store_epilogue(acc[mt][i] + b, gelu, accumulate, addend, out, f32_out, col * n + row);
      }
    return;
  }
  float* mine = partial + (tile * splits + split) * kTile;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      mine[(mt * 8 + 2 * c + (i & 1)) * kRows + warp * 16 + g + 8 * (i >> 1)] = acc[mt][i];
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(&counters[tile], 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float* tile_parts = partial + tile * splits * kTile;
  const int valid = static_cast<int>(min(m, int64_t{kCols})) * kRows;  // x rows < m only
  for (int e = static_cast<int>(threadIdx.x); e < valid; e += kThreads) {
    const int col = e / kRows;
    const int64_t row = tile * kRows + e % kRows;
    if (row >= n) continue;
    float y = bias ? bf16_bits_to_f32(bias[row]) : 0.0f;
#pragma unroll 8
    for (int sp = 0; sp < splits; ++sp) y += __ldcg(tile_parts + sp * kTile + e);  // from L2
    store_epilogue(y, gelu, accumulate, addend, out, f32_out, col * n + row);
  }
  if (threadIdx.x == 0) counters[tile] = 0;  // ready for the next launch (and graph replay)
}

template <int MT, int U, int W>
void launch(const uint4* x, const uint4* w, const uint16_t* bias, int64_t m, int64_t n, int64_t kc,
            bool gelu, bool accumulate, const uint16_t* addend, void* out, bool f32_out,
            const SkinnyWorkspace& ws, cudaStream_t s) {
  constexpr int64_t kRows = W * 16, kTile = kRows * MT * 8;
  const int64_t tiles = (n + kRows - 1) / kRows, steps = (kc + 3) / 4;
  // Splits: about two blocks a multiprocessor, each split at least 2 U steps, within the
  // workspace.
  int64_t splits = std::max<int64_t>(1, (2 * ws.sms + tiles - 1) / tiles);
  splits = std::min<int64_t>({splits, std::max<int64_t>(1, steps / (2 * U)), 32});
  if (splits > 1 && (tiles > ws.n_counters || tiles * splits * kTile > ws.partial_floats))
    splits = 1;
  const int64_t split_steps = (steps + splits - 1) / splits;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits));
  pdl_launch(skinny_kernel<MT, U, W>, grid, W * 32, 0, s, x, w, bias, m, n, kc, gelu, accumulate,
             addend, out, f32_out, ws.partial, ws.counters, split_steps);
}

// The variants (U, W) for MT tiles of x rows.
template <int MT>
void launch_mt(int variant, const uint4* x, const uint4* w, const uint16_t* bias, int64_t m,
               int64_t n, int64_t kc, bool gelu, bool accumulate, const uint16_t* addend, void* out,
               bool f32_out, const SkinnyWorkspace& ws, cudaStream_t s) {
  constexpr int kU = MT <= 2 ? 4 : 2;  // the step's x chunks live in registers too
  switch (variant) {
    case 2:
      return launch<MT, 2, 8>(x, w, bias, m, n, kc, gelu, accumulate, addend, out, f32_out, ws, s);
    case 3:
      return launch<MT, kU, 4>(x, w, bias, m, n, kc, gelu, accumulate, addend, out, f32_out, ws, s);
    default:  // 1
      return launch<MT, kU, 8>(x, w, bias, m, n, kc, gelu, accumulate, addend, out, f32_out, ws, s);
  }
}

}  // namespace

bool skinny_supported(int64_t rows, int64_t k, const void* x, const void* w) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return rows >= 1 && rows <= kSkinnyMaxRows && k % 8 == 0 && k > 0 && aligned(x) && aligned(w);
}

int64_t skinny_workspace_floats(int sms) {
  return int64_t{4} * sms * kSkinnyMaxTile;
}

void skinny_gemm(const uint16_t* x, const uint16_t* w, const uint16_t* bias, int64_t rows,
                 int64_t n, int64_t k, bool gelu, bool accumulate, const uint16_t* addend,
                 void* out, bool f32_out, int variant, const SkinnyWorkspace& ws, cudaStream_t s) {
  if (n == 0 || rows == 0) return;
  const auto* xv = reinterpret_cast<const uint4*>(x);
  const auto* wv = reinterpret_cast<const uint4*>(w);
  const int64_t kc = k / 8;
#define KESTREL_SKINNY_GO(MT) \
  launch_mt<MT>(variant, xv, wv, bias, rows, n, kc, gelu, accumulate, addend, out, f32_out, ws, s)
  if (rows <= 8) {
    KESTREL_SKINNY_GO(1);
  } else if (rows <= 16) {
    KESTREL_SKINNY_GO(2);
  } else if (rows <= 32) {
    KESTREL_SKINNY_GO(4);
  } else {
    KESTREL_SKINNY_GO(8);
  }
#undef KESTREL_SKINNY_GO
}

}  // namespace kestrel::cuda::kernels
