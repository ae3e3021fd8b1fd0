// The linear of decode batches (3..128 rows) on tensor cores: out [M, N] = epilogue(x [M, K] @
// w [N, K]^T + bias), bf16 in, fp32 sums. Bound by streaming w once (2 M FLOP a 2-byte weight),
// so everything serves that stream:
// - w and x go through shared memory in tiles of 128 k (256 contiguous bytes a row, 16 threads a
//   row: the wide reads DRAM wants), STAGES deep with cp.async, so a block keeps
//   (STAGES - 1) tiles of w in flight while it multiplies the oldest.
// - Rows are XOR-swizzled in 16-byte chunks (chunk ^ row % 8): the cp.async writes and the
//   ldmatrix reads are both free of bank conflicts.
// - A block is WARPS warps of 16 rows of w each, over every row of x (MT tiles of 8): x is read
//   from L2 once a block. mma.sync m16n8k16 with w as A (ldmatrix.x4) and x as B (ldmatrix.x4
//   gives two tiles of 8 rows).
// - Few tiles of w would leave multiprocessors idle, so k is split over blocks (grid.y) up to
//   one full wave; each split writes its fp32 partial tile to a workspace and
//   the last split of a tile to arrive (a counter a tile, reset by that block) sums the partials
//   in split order (deterministic) and applies the epilogue. One split writes out directly.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/kernels.h"
#include "backend/cuda/linear_util.cuh"
#include "backend/cuda/pdl.cuh"

namespace kestrel::cuda::kernels {
namespace {

constexpr int kChunks = 16;  // 16-byte chunks in a tile row: 128 k

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, zero-filled when !valid (src must still be a mapped address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Chunk (row, chunk) of a tile [rows][kChunks] of 16-byte chunks, swizzled.
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * kChunks + (chunk ^ (row & 7));
}

template <int MT, int WARPS, int STAGES>
struct Shape {
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kWRows = WARPS * 16;  // rows of w a block
  static constexpr int kXRows = MT * 8;      // rows of x a block (all of them)
  static constexpr int kStageChunks = (kWRows + kXRows) * kChunks;
  static constexpr size_t kSmem = size_t{16} * kStageChunks * STAGES;
  static constexpr int kTile = kWRows * kXRows;  // floats of a partial tile
};

// x [m, kc] and w [n, kc] in 16-byte chunks (kc = K / 8); out [m, n]. blockIdx.x: the tile of
// w rows; blockIdx.y: the split of k (split_tiles tiles of 128 k each); partial / counters: the
// workspace of the splits.
template <int MT, int WARPS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32)
    decode_gemm_kernel(const uint4* __restrict__ x, const uint4* __restrict__ w,
                       const uint16_t* __restrict__ bias, int64_t m, int64_t n, int64_t kc,
                       bool gelu, bool accumulate, const uint16_t* addend, void* out, bool f32_out,
                       float* partial, int* counters, int64_t split_tiles) {
  using S = Shape<MT, WARPS, STAGES>;
  extern __shared__ uint4 smem[];  // STAGES x ([kWRows][kChunks] w, then [kXRows][kChunks] x)
  const int t = static_cast<int>(threadIdx.x), lane = t & 31, warp = t >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int64_t tile = blockIdx.x, w_row0 = tile * S::kWRows;
  const int splits = static_cast<int>(gridDim.y), split = static_cast<int>(blockIdx.y);
  const int64_t k_tiles = (kc + kChunks - 1) / kChunks;
  const int64_t kt_begin = min(k_tiles, split * split_tiles);
  const int64_t kt_end = min(k_tiles, kt_begin + split_tiles);
  pdl_enter();

  // Loads tile kt (128 k) of w's rows and x's rows into stage st.
  auto load = [&](int64_t kt, int st) {
    uint4* ws = smem + st * S::kStageChunks;
    uint4* xs = ws + S::kWRows * kChunks;
#pragma unroll
    for (int i = t; i < S::kWRows * kChunks; i += S::kThreads) {
      const int row = i / kChunks, ch = i % kChunks;
      const int64_t k = kt * kChunks + ch;
      const uint4* src = w + min(w_row0 + row, n - 1) * kc + min(k, kc - 1);  // tail: re-read
      cp_async16(ws + swz(row, ch), src, k < kc);
    }
#pragma unroll
    for (int i = t; i < S::kXRows * kChunks; i += S::kThreads) {
      const int row = i / kChunks, ch = i % kChunks;
      const int64_t k = kt * kChunks + ch;
      const bool valid = row < m && k < kc;
      cp_async16(xs + swz(row, ch), valid ? x + row * kc + k : x, valid);
    }
  };

  // Prologue: STAGES - 1 tiles in flight (a group each, empty past the end).
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (kt_begin + st < kt_end) load(kt_begin + st, st);
    cp_async_commit();
  }
  float acc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[mt][i] = 0.0f;
  // ldmatrix lanes: matrix j = lane / 8 gives row r = lane % 8 of its 8x8 piece.
  const int j = lane >> 3, r = lane & 7;
  const int a_row = warp * 16 + (j & 1) * 8 + r, a_half = j >> 1;  // w: a0 a1 a2 a3
  const int b_row = (j >> 1) * 8 + r, b_half = j & 1;              // x: two tiles' b0 b1
  for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
    const int64_t i = kt - kt_begin;
    cp_async_wait<STAGES - 2>();  // tile kt has landed (this thread's part)
    __syncthreads();              // everyone's part; and stage (i - 1) % STAGES is free again
    {
      const int64_t next = kt + STAGES - 1;
      if (next < kt_end) load(next, static_cast<int>((i + STAGES - 1) % STAGES));
      cp_async_commit();
    }
    const uint4* ws = smem + (i % STAGES) * S::kStageChunks;
    const uint4* xs = ws + S::kWRows * kChunks;
#pragma unroll
    for (int kk = 0; kk < kChunks / 2; ++kk) {  // 16 k a step
      uint32_t a[4];
      ldmatrix_x4(a, ws + swz(a_row, 2 * kk + a_half));
#pragma unroll
      for (int p = 0; p < MT / 2; ++p) {
        uint32_t b[4];
        ldmatrix_x4(b, xs + swz(16 * p + b_row, 2 * kk + b_half));
        mma_bf16(acc[2 * p], a, b[0], b[1]);
        mma_bf16(acc[2 * p + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();

  // Fragment element e of x tile mt: x row mt * 8 + 2c + (e & 1), w row (of the block)
  // warp * 16 + g + 8 (e / 2).
  if (splits == 1) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t col = mt * 8 + 2 * c + (e & 1), row = w_row0 + warp * 16 + g + 8 * (e >> 1);
        if (col >= m || row >= n) continue;
        const float b = bias ? bf16_bits_to_f32(bias[row]) : 0.0f;
        store_epilogue(acc[mt][e] + b, gelu, accumulate, addend, out, f32_out, col * n + row);
      }
    return;
  }
  float* mine = partial + (tile * splits + split) * S::kTile;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      mine[(mt * 8 + 2 * c + (e & 1)) * S::kWRows + warp * 16 + g + 8 * (e >> 1)] = acc[mt][e];
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (t == 0) last = atomicAdd(&counters[tile], 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float* tile_parts = partial + tile * splits * S::kTile;
  const int valid = static_cast<int>(min(m, int64_t{S::kXRows})) * S::kWRows;  // x rows < m
  for (int e = t; e < valid; e += S::kThreads) {
    const int col = e / S::kWRows;
    const int64_t row = w_row0 + e % S::kWRows;
    if (row >= n) continue;
    float y = bias ? bf16_bits_to_f32(bias[row]) : 0.0f;
#pragma unroll 8
    for (int sp = 0; sp < splits; ++sp) y += __ldcg(tile_parts + sp * S::kTile + e);  // from L2
    store_epilogue(y, gelu, accumulate, addend, out, f32_out, col * n + row);
  }
  if (t == 0) counters[tile] = 0;  // ready for the next launch (and a graph's next replay)
}

template <int MT, int WARPS, int STAGES>
void launch(const uint4* x, const uint4* w, const uint16_t* bias, int64_t m, int64_t n, int64_t kc,
            bool gelu, bool accumulate, const uint16_t* addend, void* out, bool f32_out,
            const DecodeGemmWorkspace& ws, cudaStream_t s) {
  using S = Shape<MT, WARPS, STAGES>;
  auto* kernel = decode_gemm_kernel<MT, WARPS, STAGES>;
  if constexpr (S::kSmem > 48 * 1024) {     // once a device, before any capture needs it
    static std::atomic<uint64_t> opted{0};  // a bit a device
    int dev = 0;
    cudaGetDevice(&dev);
    const uint64_t bit = uint64_t{1} << (dev & 63);
    if (!(opted.load(std::memory_order_acquire) & bit)) {
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(S::kSmem));
      opted.fetch_or(bit, std::memory_order_acq_rel);
    }
  }
  const int64_t tiles = (n + S::kWRows - 1) / S::kWRows, k_tiles = (kc + kChunks - 1) / kChunks;
  // Splits: at most one wave of blocks (as many as the multiprocessors hold at this shared
  // memory), at least 2 tiles of k a split (the pipeline needs some depth), within the
  // workspace.
  const int64_t per_sm = std::max<int64_t>(1, (227 * 1024) / (S::kSmem + 1024));
  int64_t splits = std::max<int64_t>(1, ws.sms * per_sm / tiles);
  splits = std::min<int64_t>({splits, std::max<int64_t>(1, k_tiles / 2), 32});
  if (splits > 1 && (tiles > ws.n_counters || tiles * splits * S::kTile > ws.partial_floats))
    splits = 1;
  const int64_t split_tiles = (k_tiles + splits - 1) / splits;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits));
  pdl_launch(kernel, grid, S::kThreads, S::kSmem, s, x, w, bias, m, n, kc, gelu, accumulate, addend,
             out, f32_out, ws.partial, ws.counters, split_tiles);
}

// variant 1: 4 warps (64 rows of w a block); 2: 8 warps (128 rows). Stages by the smem a stage
// takes: a block stays within about 100 KB (two blocks a multiprocessor) where it can.
template <int MT>
void launch_mt(int variant, const uint4* x, const uint4* w, const uint16_t* bias, int64_t m,
               int64_t n, int64_t kc, bool gelu, bool accumulate, const uint16_t* addend, void* out,
               bool f32_out, const DecodeGemmWorkspace& ws, cudaStream_t s) {
  if (variant == 2) {
    constexpr int kStages = MT <= 8 ? 3 : 2;
    return launch<MT, 8, kStages>(x, w, bias, m, n, kc, gelu, accumulate, addend, out, f32_out, ws,
                                  s);
  }
  constexpr int kStages = MT <= 4 ? 4 : MT <= 8 ? 3 : 2;
  launch<MT, 4, kStages>(x, w, bias, m, n, kc, gelu, accumulate, addend, out, f32_out, ws, s);
}

}  // namespace

bool decode_gemm_supported(int64_t rows, int64_t k, const void* x, const void* w) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return rows >= 1 && rows <= kDecodeGemmMaxRows && k % 8 == 0 && k > 0 && aligned(x) && aligned(w);
}

int64_t decode_gemm_workspace_floats(int sms) {
  return int64_t{4} * sms * kDecodeGemmMaxTile;
}

void decode_gemm(const uint16_t* x, const uint16_t* w, const uint16_t* bias, int64_t rows,
                 int64_t n, int64_t k, bool gelu, bool accumulate, const uint16_t* addend,
                 void* out, bool f32_out, int variant, const DecodeGemmWorkspace& ws,
                 cudaStream_t s) {
  if (n == 0 || rows == 0) return;
  const auto* xv = reinterpret_cast<const uint4*>(x);
  const auto* wv = reinterpret_cast<const uint4*>(w);
  const int64_t kc = k / 8;
#define KESTREL_DECODE_GEMM_GO(MT) \
  launch_mt<MT>(variant, xv, wv, bias, rows, n, kc, gelu, accumulate, addend, out, f32_out, ws, s)
  if (rows <= 16) {
    KESTREL_DECODE_GEMM_GO(2);
  } else if (rows <= 32) {
    KESTREL_DECODE_GEMM_GO(4);
  } else if (rows <= 64) {
    KESTREL_DECODE_GEMM_GO(8);
  } else {
    KESTREL_DECODE_GEMM_GO(16);
  }
#undef KESTREL_DECODE_GEMM_GO
}

}  // namespace kestrel::cuda::kernels
