// Attention over the paged KV cache, two kernels behind one contract
// (backend/ops.h: sequence b's new rows [cu_q[b], cu_q[b+1]) attend causally to
// context [0, kv_len - q_len + j]):
//  v1 attention_generic: one block per (token, head), warps stride over keys,
//     online softmax in fp32. Any head_dim <= 256; the reference on the GPU.
//  v3 attention_v3: FlashAttention-2 style on tensor cores (mma.sync m16n8k16
//     bf16, fp32 accumulate). Its rows are (token, query head) pairs of one
//     sequence and one K/V head, so a K/V tile in shared memory serves every
//     query head of the group (falcon-7b: 71 heads on 1 K/V head). K/V tiles are
//     gathered from the pages with cp.async, K double-buffered; the context may be
//     split over blocks (flash-decoding) and merged by attention_combine.
// Both add ALiBi's bias bf16(bf16(slope) * bf16(key position)) to q.k before
// the scale when given slopes (positions absolute: chunks and splits agree).
// An FP8 cache (E4M3 codes, scale 1) is read by both: every code is exact in BF16, so v3
// widens its tiles on the way into shared memory and its MMAs are unchanged, while the pages
// cost half the bytes. The earlier generations (v2: 64-row tiles; v3 with one K buffer; v3 as
// 8 warps of 16 rows) measured slower and are in git history (docs/gpu.md, "Attention").
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace kestrel::cuda::kernels {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float bf(uint16_t h) {
  return __bfloat162float(__ushort_as_bfloat16(h));
}

// Element i of a cache: BF16, or an E4M3 code (fp8).
__device__ __forceinline__ float kv_at(const void* cache, bool fp8, int64_t i) {
  if (fp8) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const uint8_t*>(cache)[i], __NV_E4M3);
    return __half2float(h);
  }
  return bf(static_cast<const uint16_t*>(cache)[i]);
}

// Eight E4M3 codes as eight BF16 (exact: E4M3's 3 mantissa bits and exponents 2^-9..2^8
// fit BF16's).
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8(uint2 codes) {
  uint4 out;
  uint32_t* o = &out.x;
  const uint32_t in[2] = {codes.x, codes.y};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint16_t two = static_cast<uint16_t>(in[i / 2] >> (16 * (i % 2)));
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(two, __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    o[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return out;
}

__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

// ALiBi bias of key position pos for a slope already rounded to bf16 (as
// transformers' build_alibi_tensor: bf16 slope times bf16 position, in bf16).
__device__ __forceinline__ float alibi_bias(float slope_bf16, int pos) {
  return round_bf16(slope_bf16 * round_bf16(static_cast<float>(pos)));
}

// The sequence that row t of q belongs to: the last b with cu_q[b] <= t.
__device__ __forceinline__ int find_seq(const int32_t* cu_q, int n_seqs, int t) {
  int lo = 0, hi = n_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_q[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// ---------------------------------------------------------------------------
// v1: grid (n_heads, T), 4 warps; lane l holds dims l, l + 32, ... of the head.
constexpr int kGenericWarps = 4;
constexpr int kGenericMaxDimsPerLane = 8;  // head_dim <= 256

__global__ void attention_generic_kernel(AttentionParams p) {
  pdl_enter();
  const int h = blockIdx.x, t = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int d = static_cast<int>(p.head_dim);
  const int per_lane = (d + 31) / 32;
  const int b = find_seq(p.cu_q, static_cast<int>(p.n_seqs), t);
  const int q_len = p.cu_q[b + 1] - p.cu_q[b];
  const int64_t cap = p.max_blocks * p.block_size;
  const int kv_len = static_cast<int>(min(static_cast<int64_t>(p.kv_lens[b]), cap));
  const int ctx = kv_len - q_len + (t - p.cu_q[b]) + 1;
  const int kvh = h / static_cast<int>(p.n_heads / p.n_kv_heads);
  const int32_t* table = p.block_tables + b * p.max_blocks;

  float qv[kGenericMaxDimsPerLane], acc[kGenericMaxDimsPerLane];
  const uint16_t* qp = p.q + (static_cast<int64_t>(t) * p.n_heads + h) * d;
#pragma unroll
  for (int i = 0; i < kGenericMaxDimsPerLane; ++i) {
    const int dim = lane + 32 * i;
    qv[i] = (i < per_lane && dim < d) ? bf(qp[dim]) * p.scale * kLog2e : 0.0f;
    acc[i] = 0.0f;
  }
  const float* slopes = p.alibi_slopes;
  const float slope = slopes ? round_bf16(slopes[h]) : 0.0f;
  const float scale_log2 = p.scale * kLog2e;
  float m = -INFINITY, l = 0.0f;
  for (int pos = warp; pos < ctx; pos += kGenericWarps) {
    const int32_t blk = table[pos / p.block_size];
    if (blk < 0 || blk >= p.num_blocks) continue;
    const int64_t base =
        ((static_cast<int64_t>(blk) * p.block_size + pos % p.block_size) * p.n_kv_heads + kvh) * d;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kGenericMaxDimsPerLane; ++i) {
      const int dim = lane + 32 * i;
      if (i < per_lane && dim < d) dot += qv[i] * kv_at(p.k_cache, p.kv_fp8, base + dim);
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (slopes) dot += alibi_bias(slope, pos) * scale_log2;
    const float m_new = fmaxf(m, dot);
    const float alpha = exp2f(m - m_new), w = exp2f(dot - m_new);
    l = l * alpha + w;
#pragma unroll
    for (int i = 0; i < kGenericMaxDimsPerLane; ++i) {
      const int dim = lane + 32 * i;
      const float vv = (i < per_lane && dim < d) ? kv_at(p.v_cache, p.kv_fp8, base + dim) : 0.0f;
      acc[i] = acc[i] * alpha + w * vv;
    }
    m = m_new;
  }
  // Merge the warps' partial softmaxes.
  __shared__ float s_m[kGenericWarps], s_l[kGenericWarps];
  __shared__ float s_acc[kGenericWarps][32 * kGenericMaxDimsPerLane];
  if (lane == 0) s_m[warp] = m, s_l[warp] = l;
#pragma unroll
  for (int i = 0; i < kGenericMaxDimsPerLane; ++i) s_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float mm = -INFINITY;
  for (int w = 0; w < kGenericWarps; ++w) mm = fmaxf(mm, s_m[w]);
  float denom = 0.0f, wts[kGenericWarps];
  for (int w = 0; w < kGenericWarps; ++w) {
    wts[w] = s_m[w] == -INFINITY ? 0.0f : exp2f(s_m[w] - mm);
    denom += wts[w] * s_l[w];
  }
  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
  uint16_t* op = p.out + (static_cast<int64_t>(t) * p.n_heads + h) * d;
  for (int dim = threadIdx.x; dim < d; dim += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kGenericWarps; ++w) o += wts[w] * s_acc[w][dim];
    op[dim] = __bfloat16_as_ushort(__float2bfloat16(o * inv));
  }
}

// ---------------------------------------------------------------------------
// Tensor-core flash attention: the mma.sync helpers. Row r of the (sequence b, K/V head g)
// problem is token j = r / group, query head g * group + r % group; keys go in 64-key tiles.
constexpr int kBlockN = 64;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c[16x8] += a[16x16] (row) * b[16x8] (col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---------------------------------------------------------------------------
// v3: 4 warps of MF m16 fragments, 64 * MF rows a tile; each K / V fragment read from shared
// memory feeds MF mma (head_dim 64 with more than 64 rows: MF = 2, 128-row tiles, 32 rows a
// warp). Only tiles that cross a row's
// causal end or the split end are masked; the scale is folded into the exponent's FMA (scores and
// maxima stay unscaled); a K/V tile's slots are computed once for K and V,
// from block-table entries read one tile ahead (shift / mask for power-of-two
// block sizes); tiles are issued last first (the heavy ones), and a warp whose
// rows are all past the problem skips the math (decode: 71 rows in a 128-row
// tile).
constexpr int kV3BlockN = 64;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Merges the context splits of (token, head) pair th at dims dim0, dim0 + step, ...: every split
// wrote its normalised partial output and its log2-sum-exp (an empty split: zeros and -inf);
// out = sum_s 2^(lse_s - max) o_s / sum_s 2^(lse_s - max), in split order. Reads through L2
// (other blocks of the running kernel may have written the partials).
__device__ __forceinline__ void merge_pair(const AttentionParams& p, int n_splits,
                                           const float* o_part, const float* lse_part, int64_t th,
                                           int dim0, int step) {
  const int64_t stride = p.n_tokens * p.n_heads;  // between splits
  const int d = static_cast<int>(p.head_dim);
  float m = -INFINITY;
  for (int s = 0; s < n_splits; ++s) m = fmaxf(m, __ldcg(lse_part + s * stride + th));
  for (int dim = dim0; dim < d; dim += step) {
    float o = 0.0f, denom = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      const float lse = __ldcg(lse_part + s * stride + th);
      const float w = lse == -INFINITY ? 0.0f : exp2f(lse - m);
      o += w * __ldcg(o_part + (s * stride + th) * d + dim);
      denom += w;
    }
    p.out[th * d + dim] = __bfloat16_as_ushort(__float2bfloat16(denom > 0.0f ? o / denom : 0.0f));
  }
}

// The rows of this block's tile (kM rows of v3's (token, query head) pairs of one sequence and
// K/V head), merged by the block: a warp a row, its lanes over the dims. Everything comes from
// the block's indices again (nothing of the kernel's body stays live past its loop).
__device__ __forceinline__ void merge_last_split(const AttentionParams& p, int n_splits,
                                                 const float* o_part, const float* lse_part,
                                                 int kM) {
  const int n_kv_heads = static_cast<int>(p.n_kv_heads);
  const int b = blockIdx.y / n_kv_heads, g = blockIdx.y % n_kv_heads;
  const int group = static_cast<int>(p.n_heads / p.n_kv_heads);
  const int q_begin = p.cu_q[b], m_rows = (p.cu_q[b + 1] - q_begin) * group;
  const int row0 = (gridDim.x - 1 - blockIdx.x) * kM, rows = min(kM, m_rows - row0);
  for (int r = threadIdx.x / 32; r < rows; r += blockDim.x / 32) {
    const int row = row0 + r;
    const int64_t th = (q_begin + row / group) * p.n_heads + g * group + row % group;
    merge_pair(p, n_splits, o_part, lse_part, th, threadIdx.x % 32, 32);
  }
}

constexpr int kV3Warps = 4;

template <int D, int MF, bool kAlibi, bool kFp8>
__global__ void __launch_bounds__(kV3Warps * 32)
    attention_v3_kernel(AttentionParams p, int n_splits, float* o_part, float* lse_part,
                        int* counters) {
  constexpr int NW = kV3Warps;
  pdl_enter();
  constexpr int kV3Threads = NW * 32, kM = 16 * MF * NW, kN = kV3BlockN;
  constexpr int kStride = D + 8;                   // bf16 per smem row: 16 bytes of padding
  constexpr int kCpr = D / 8;                      // 16-byte chunks per row
  constexpr int kRowsPerPass = kV3Threads / kCpr;  // K/V rows one pass of the block loads
  constexpr int kLoads = kN / kRowsPerPass;        // K/V chunks per thread per tile
  constexpr bool kQRegs = D * MF <= 128;           // else Q fragments are re-read from smem
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* s_q = smem;
  uint16_t* s_k0 = s_q + kM * kStride;  // K tiles alternate over two buffers
  uint16_t* s_v = s_k0 + 2 * kN * kStride;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n_kv_heads = static_cast<int>(p.n_kv_heads);
  const int b = blockIdx.y / n_kv_heads, g = blockIdx.y % n_kv_heads;
  const int group = static_cast<int>(p.n_heads / p.n_kv_heads);
  const int q_begin = p.cu_q[b], q_len = p.cu_q[b + 1] - q_begin;
  const int m_rows = q_len * group;
  const int row0 = (gridDim.x - 1 - blockIdx.x) * kM;
  if (row0 >= m_rows) return;
  const int64_t cap = p.max_blocks * p.block_size;
  const int kv_len = static_cast<int>(min(static_cast<int64_t>(p.kv_lens[b]), cap));
  const int32_t* table = p.block_tables + b * p.max_blocks;
  const int split = blockIdx.z;

  // This block's keys: its split of the context, up to the last row's causal end;
  // keys below k_free are inside every row's range (no mask).
  const int last_row = min(row0 + kM, m_rows) - 1;
  const int ctx_max = kv_len - q_len + last_row / group + 1;
  const int chunk = ((kv_len + n_splits - 1) / n_splits + kN - 1) / kN * kN;
  const int k_begin = split * chunk;
  const int k_end = min(min(kv_len, k_begin + chunk), ctx_max);
  const int k_free = min(k_end, kv_len - q_len + row0 / group + 1);

  for (int c = tid; c < kM * kCpr; c += kV3Threads) {
    const int r = c / kCpr, col = (c % kCpr) * 8;
    const int row = row0 + r;
    const bool ok = row < m_rows;
    const int tok = q_begin + (ok ? row / group : 0);
    const int head = g * group + (ok ? row % group : 0);
    cp_async16(s_q + r * kStride + col,
               p.q + (static_cast<int64_t>(tok) * p.n_heads + head) * D + col, ok ? 16 : 0);
  }

  // This thread's K/V chunks: rows ld_row + i * kRowsPerPass of a tile, column ld_col.
  const int bs = static_cast<int>(p.block_size);
  const bool pow2 = (bs & (bs - 1)) == 0;
  const int shift = __ffs(bs) - 1;
  const int num_blocks = static_cast<int>(min(p.num_blocks, static_cast<int64_t>(INT32_MAX)));
  const int ld_row = tid / kCpr, ld_col = (tid % kCpr) * 8;
  int slot[kLoads];  // cache slot of each chunk's key, -1: zeros
  auto table_at = [&](int pos) -> int {
    return pos < k_end ? __ldg(table + (pow2 ? pos >> shift : pos / bs)) : -1;
  };
  auto set_slots = [&](const int(&blk)[kLoads], int n0) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int pos = n0 + ld_row + i * kRowsPerPass;
      const bool ok = blk[i] >= 0 && blk[i] < num_blocks;
      slot[i] = ok ? blk[i] * bs + (pow2 ? pos & (bs - 1) : pos % bs) : -1;
    }
  };
  auto load_tile = [&](uint16_t* dst, const void* cache) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int64_t s = slot[i] < 0 ? 0 : slot[i];
      cp_async16(dst + (ld_row + i * kRowsPerPass) * kStride + ld_col,
                 static_cast<const uint16_t*>(cache) + (s * n_kv_heads + g) * D + ld_col,
                 slot[i] < 0 ? 0 : 16);
    }
  };
  // FP8: a tile's codes (8 a chunk) fetched into registers when cp.async would be issued,
  // widened into shared memory before the barrier that publishes the tile.
  uint2 k_raw[kFp8 ? kLoads : 1], v_raw[kFp8 ? kLoads : 1];
  auto fetch_tile = [&](uint2(&raw)[kFp8 ? kLoads : 1], const void* cache) {
#pragma unroll
    for (int i = 0; i < (kFp8 ? kLoads : 0); ++i)
      raw[i] = slot[i] < 0 ? make_uint2(0, 0)
                           : __ldg(reinterpret_cast<const uint2*>(
                                 static_cast<const uint8_t*>(cache) +
                                 (static_cast<int64_t>(slot[i]) * n_kv_heads + g) * D + ld_col));
  };
  auto store_tile = [&](uint16_t* dst, const uint2(&raw)[kFp8 ? kLoads : 1]) {
#pragma unroll
    for (int i = 0; i < (kFp8 ? kLoads : 0); ++i)
      *reinterpret_cast<uint4*>(dst + (ld_row + i * kRowsPerPass) * kStride + ld_col) =
          e4m3x8_to_bf16x8(raw[i]);
  };
  int blk_next[kLoads];
  if (k_begin < k_end) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) blk_next[i] = table_at(k_begin + ld_row + i * kRowsPerPass);
    set_slots(blk_next, k_begin);
    if constexpr (kFp8) {
      fetch_tile(k_raw, p.k_cache);
      store_tile(s_k0, k_raw);
    } else {
      load_tile(s_k0, p.k_cache);
    }
  }
  cp_async_commit();
#pragma unroll
  for (int i = 0; i < kLoads; ++i) blk_next[i] = table_at(k_begin + kN + ld_row + i * kRowsPerPass);

  // Each thread's rows: lane / 4 and lane / 4 + 8 of each of its warp's MF fragments.
  const int warp_row0 = row0 + warp * 16 * MF;
  const bool warp_active = warp_row0 < m_rows;
  int lim[MF][2];  // keys below lim: inside the row's causal range and the split
  float slope[MF][2];
  const float* slopes = p.alibi_slopes;
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = warp_row0 + mf * 16 + lane / 4 + i * 8;
      lim[mf][i] = row < m_rows ? min(kv_len - q_len + row / group + 1, k_end) : 0;
      slope[mf][i] = kAlibi && row < m_rows ? round_bf16(slopes[g * group + row % group]) : 0.0f;
    }
  }
  float o_acc[MF][D / 8][4];
#pragma unroll
  for (int mf = 0; mf < MF; ++mf)
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
      o_acc[mf][i][0] = o_acc[mf][i][1] = o_acc[mf][i][2] = o_acc[mf][i][3] = 0.0f;
  float m_i[MF][2], l_i[MF][2];  // m_i: running max of the unscaled scores
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) m_i[mf][0] = m_i[mf][1] = -INFINITY, l_i[mf][0] = l_i[mf][1] = 0;
  const float scale_log2 = p.scale * kLog2e;
  uint32_t q_frag[kQRegs ? MF : 1][kQRegs ? D / 16 : 1][4];
  auto q_addr = [&](int mf, int kc) {
    const int r = warp * 16 * MF + mf * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
    return s_q + r * kStride + kc * 16 + (lane / 16) * 8;
  };

  for (int n0 = k_begin; n0 < k_end; n0 += kN) {
    cp_async_wait_all();
    __syncthreads();  // K tile (and Q) visible; every warp is done with the previous V
    if (kQRegs && n0 == k_begin) {
#pragma unroll
      for (int mf = 0; mf < (kQRegs ? MF : 0); ++mf)
#pragma unroll
        for (int kc = 0; kc < D / 16; ++kc) ldmatrix_x4(q_frag[mf][kc], q_addr(mf, kc));
    }
    const int tile = (n0 - k_begin) / kN;
    uint16_t* s_k = s_k0 + (tile & 1) * kN * kStride;
    if constexpr (kFp8) {
      fetch_tile(v_raw, p.v_cache);
    } else {
      load_tile(s_v, p.v_cache);
    }
    cp_async_commit();
    const bool k_next = n0 + kN < k_end;
    if (k_next) {  // the next K tile, into the buffer that K(n - 1) left
      set_slots(blk_next, n0 + kN);
      if constexpr (kFp8) {
        fetch_tile(k_raw, p.k_cache);
      } else {
        load_tile(s_k0 + ((tile + 1) & 1) * kN * kStride, p.k_cache);
      }
    }
    cp_async_commit();
#pragma unroll
    for (int i = 0; i < kLoads; ++i)
      blk_next[i] = table_at(n0 + 2 * kN + ld_row + i * kRowsPerPass);

    float s[MF][kN / 8][4];
    if (warp_active) {
#pragma unroll
      for (int mf = 0; mf < MF; ++mf)
#pragma unroll
        for (int i = 0; i < kN / 8; ++i) s[mf][i][0] = s[mf][i][1] = s[mf][i][2] = s[mf][i][3] = 0;
          // S = Q K^T: MF x 16 rows x 64 keys (8 n-tiles of 8 keys).
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) {
        uint32_t qa[MF][4];
#pragma unroll
        for (int mf = 0; mf < MF; ++mf) {
          if constexpr (kQRegs) {
#pragma unroll
            for (int j = 0; j < 4; ++j) qa[mf][j] = q_frag[mf][kc][j];
          } else {
            ldmatrix_x4(qa[mf], q_addr(mf, kc));
          }
        }
#pragma unroll
        for (int np = 0; np < kN / 16; ++np) {
          uint32_t kb[4];
          const int key = np * 16 + (lane % 8) + (lane / 16) * 8;
          const int col = kc * 16 + ((lane / 8) % 2) * 8;
          ldmatrix_x4(kb, s_k + key * kStride + col);
#pragma unroll
          for (int mf = 0; mf < MF; ++mf) {
            mma_bf16(s[mf][2 * np], qa[mf], kb[0], kb[1]);
            mma_bf16(s[mf][2 * np + 1], qa[mf], kb[2], kb[3]);
          }
        }
      }
      if constexpr (kAlibi) {
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
          for (int nt = 0; nt < kN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              s[mf][nt][e] += alibi_bias(slope[mf][e / 2], n0 + nt * 8 + (lane % 4) * 2 + (e % 2));
      }
      if (n0 + kN > k_free) {  // a tile on a causal end or the split end
#pragma unroll
        for (int mf = 0; mf < MF; ++mf)
#pragma unroll
          for (int nt = 0; nt < kN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = n0 + nt * 8 + (lane % 4) * 2 + (e % 2);
              if (key >= lim[mf][e / 2]) s[mf][nt][e] = -INFINITY;
            }
      }
      // Online softmax in the log2 domain: p = 2^(s * scale_log2 - m * scale_log2).
      // Maxima and sums over two interleaved chains (shorter dependences); the
      // accumulators are rescaled only when some row of the warp has a new maximum.
#pragma unroll
      for (int mf = 0; mf < MF; ++mf) {
        float mx[2][2] = {{m_i[mf][0], m_i[mf][1]}, {-INFINITY, -INFINITY}};
#pragma unroll
        for (int nt = 0; nt < kN / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) mx[nt % 2][e / 2] = fmaxf(mx[nt % 2][e / 2], s[mf][nt][e]);
        float alpha[2], neg_m[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float m = fmaxf(mx[0][i], mx[1][i]);
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
          neg_m[i] = m == -INFINITY ? 0.0f : -m * scale_log2;
          alpha[i] = m == m_i[mf][i] ? 1.0f : ex2(fmaf(m_i[mf][i], scale_log2, neg_m[i]));
          m_i[mf][i] = m;
        }
        float sum[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
        for (int nt = 0; nt < kN / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[mf][nt][e] = ex2(fmaf(s[mf][nt][e], scale_log2, neg_m[e / 2]));
            sum[nt % 2][e / 2] += s[mf][nt][e];
          }
#pragma unroll
        for (int i = 0; i < 2; ++i) l_i[mf][i] = fmaf(l_i[mf][i], alpha[i], sum[0][i] + sum[1][i]);
        if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
          for (int dt = 0; dt < D / 8; ++dt) {
            o_acc[mf][dt][0] *= alpha[0];
            o_acc[mf][dt][1] *= alpha[0];
            o_acc[mf][dt][2] *= alpha[1];
            o_acc[mf][dt][3] *= alpha[1];
          }
        }
      }
    }

    if constexpr (kFp8) {  // V(n) and K(n + 1) widened into their buffers, then published
      store_tile(s_v, v_raw);
      if (k_next) store_tile(s_k0 + ((tile + 1) & 1) * kN * kStride, k_raw);
      __syncthreads();
    } else {
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // V(n); K(n + 1) may fly on
      __syncthreads();
    }

    if (warp_active) {
      // O += P V: P's accumulator layout is the A operand of the next mma.
#pragma unroll
      for (int kc = 0; kc < kN / 16; ++kc) {
        uint32_t a[MF][4];
#pragma unroll
        for (int mf = 0; mf < MF; ++mf) {
          a[mf][0] = pack_bf16(s[mf][2 * kc][0], s[mf][2 * kc][1]);
          a[mf][1] = pack_bf16(s[mf][2 * kc][2], s[mf][2 * kc][3]);
          a[mf][2] = pack_bf16(s[mf][2 * kc + 1][0], s[mf][2 * kc + 1][1]);
          a[mf][3] = pack_bf16(s[mf][2 * kc + 1][2], s[mf][2 * kc + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];
          const int key = kc * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
          const int col = dp * 16 + (lane / 16) * 8;
          ldmatrix_x4_trans(vb, s_v + key * kStride + col);
#pragma unroll
          for (int mf = 0; mf < MF; ++mf) {
            mma_bf16(o_acc[mf][2 * dp], a[mf], vb[0], vb[1]);
            mma_bf16(o_acc[mf][2 * dp + 1], a[mf], vb[2], vb[3]);
          }
        }
      }
    }
  }
  cp_async_wait_all();
  if (!warp_active && (n_splits == 1 || counters == nullptr)) return;

#pragma unroll
  for (int mf = 0; mf < MF && warp_active; ++mf) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l_i[mf][i] += __shfl_xor_sync(0xffffffffu, l_i[mf][i], 1);
      l_i[mf][i] += __shfl_xor_sync(0xffffffffu, l_i[mf][i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = warp_row0 + mf * 16 + lane / 4 + i * 8;
      if (row >= m_rows) continue;
      const int64_t tok = q_begin + row / group;
      const int64_t head = g * group + row % group;
      const float inv = l_i[mf][i] > 0.0f ? 1.0f / l_i[mf][i] : 0.0f;
      if (n_splits == 1) {
        uint16_t* op = p.out + (tok * p.n_heads + head) * D;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          const int col = dt * 8 + (lane % 4) * 2;
          *reinterpret_cast<uint32_t*>(op + col) =
              pack_bf16(o_acc[mf][dt][2 * i] * inv, o_acc[mf][dt][2 * i + 1] * inv);
        }
      } else {
        const int64_t idx = (static_cast<int64_t>(split) * p.n_tokens + tok) * p.n_heads + head;
        float* op = o_part + idx * D;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          const int col = dt * 8 + (lane % 4) * 2;
          *reinterpret_cast<float2*>(op + col) =
              make_float2(o_acc[mf][dt][2 * i] * inv, o_acc[mf][dt][2 * i + 1] * inv);
        }
        if (lane % 4 == 0)
          lse_part[idx] =
              l_i[mf][i] > 0.0f ? m_i[mf][i] * scale_log2 + log2f(l_i[mf][i]) : -INFINITY;
      }
    }
  }
  if (n_splits == 1 || counters == nullptr) return;
  // The last split of this tile to finish merges every split's partial (in split order, so
  // the sums repeat) and leaves the counter at zero for the next launch.
  __shared__ int s_last;
  __threadfence();
  __syncthreads();
  int* counter = counters + blockIdx.y * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) s_last = atomicAdd(counter, 1) == n_splits - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  merge_last_split(p, n_splits, o_part, lse_part, kM);
  if (threadIdx.x == 0) *counter = 0;
}

// Merges the splits of each (token, head): every split wrote its partial
// (an empty one: zeros with lse -inf). block (D, kCombineRows): a row of threads per
// (token, head), kCombineRows of them a block (one (token, head) a block of 64 threads made
// 9,088 blocks at decode batch 128 and took 13 us on the H200).
constexpr int kCombineRows = 4;

__global__ void attention_combine_kernel(AttentionParams p, int n_splits, const float* o_part,
                                         const float* lse_part) {
  pdl_enter();
  const int64_t th = int64_t{blockIdx.x} * kCombineRows + threadIdx.y;
  if (th >= p.n_tokens * p.n_heads) return;
  merge_pair(p, n_splits, o_part, lse_part, th, static_cast<int>(threadIdx.x),
             static_cast<int>(blockDim.x));
}

// Rows of a tile: 128 (MF = 2) for head_dim 64 when a (sequence, K/V head) problem has more
// than 64 rows, else 64 (decode with groups up to 64; head_dim 128, where MF = 2 spills: 255
// registers and 132 bytes of spill stores under ptxas, against 238 and none with MF = 1).
int tile_rows(const AttentionParams& p) {
  const int64_t group = p.n_heads / p.n_kv_heads;
  return p.head_dim == 64 && static_cast<int64_t>(p.max_q_len) * group > 64 ? 128 : 64;
}

template <int D, int MF, bool kAlibi, bool kFp8>
void launch_v3(const AttentionParams& p, int n_splits, float* o_part, float* lse_part,
               int* counters, cudaStream_t s) {
  constexpr int kM = 16 * MF * kV3Warps;
  const int group = static_cast<int>(p.n_heads / p.n_kv_heads);
  const int64_t m_tiles = (static_cast<int64_t>(p.max_q_len) * group + kM - 1) / kM;
  const dim3 grid(static_cast<unsigned>(m_tiles), static_cast<unsigned>(p.n_seqs * p.n_kv_heads),
                  static_cast<unsigned>(n_splits));
  const size_t smem = static_cast<size_t>(kM + 3 * kV3BlockN) * (D + 8) * sizeof(uint16_t);
  static bool configured = false;  // one stream, one thread drives the device
  if (!configured) {
    cudaFuncSetAttribute(attention_v3_kernel<D, MF, kAlibi, kFp8>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    configured = true;
  }
  pdl_launch(attention_v3_kernel<D, MF, kAlibi, kFp8>, grid, kV3Warps * 32, smem, s, p, n_splits,
             o_part, lse_part, counters);
}

template <int D, int MF>
void launch_v3_variant(const AttentionParams& p, int n_splits, float* o_part, float* lse_part,
                       int* counters, cudaStream_t s) {
  const bool alibi = p.alibi_slopes != nullptr;
  if (p.kv_fp8) {
    alibi ? launch_v3<D, MF, true, true>(p, n_splits, o_part, lse_part, counters, s)
          : launch_v3<D, MF, false, true>(p, n_splits, o_part, lse_part, counters, s);
  } else {
    alibi ? launch_v3<D, MF, true, false>(p, n_splits, o_part, lse_part, counters, s)
          : launch_v3<D, MF, false, false>(p, n_splits, o_part, lse_part, counters, s);
  }
}

template <int D>
void launch_v3_rows(const AttentionParams& p, int rows, int n_splits, float* o_part,
                    float* lse_part, int* counters, cudaStream_t s) {
  if constexpr (D == 64) {
    if (rows == 128) return launch_v3_variant<D, 2>(p, n_splits, o_part, lse_part, counters, s);
  }
  launch_v3_variant<D, 1>(p, n_splits, o_part, lse_part, counters, s);
}

// Splits over the context when the (tile, sequence, K/V head) grid would leave
// most multiprocessors idle; down to one key tile a split (a block's key
// loop is latency-bound: on the H200, a decode step's 2-tile blocks took
// 12 us, 1-tile ones 7 us). Not once the grid fills half the multiprocessors: at falcon-7b
// decode batch 128 (128 blocks of 3 tiles) 3 splits took 16 us and their combine 13 us, more
// than the unsplit kernel. Tuning::attention_splits forces a count (benchmarks).
int choose_splits(const AttentionParams& p, int rows, int n_sms) {
  const int forced = tuning().attention_splits;
  const int group = static_cast<int>(p.n_heads / p.n_kv_heads);
  const int64_t m_tiles = (static_cast<int64_t>(p.max_q_len) * group + rows - 1) / rows;
  const int64_t base = m_tiles * p.n_seqs * p.n_kv_heads;
  const int64_t by_len = std::max<int64_t>(1, (p.max_kv_len + kBlockN - 1) / kBlockN);
  if (forced > 0) return static_cast<int>(std::min<int64_t>({forced, by_len, 32}));
  if (2 * base > n_sms || p.n_tokens > 512) return 1;
  int64_t splits = (2 * n_sms + base - 1) / base;
  if (splits > by_len) splits = by_len;
  if (splits > 32) splits = 32;
  return splits < 1 ? 1 : static_cast<int>(splits);
}

}  // namespace

void attention_generic(const AttentionParams& p, cudaStream_t s) {
  if (p.n_tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(p.n_heads), static_cast<unsigned>(p.n_tokens));
  pdl_launch(attention_generic_kernel, grid, kGenericWarps * 32, 0, s, p);
}

bool attention_mma_supported(const AttentionParams& p) {
  return (p.head_dim == 64 || p.head_dim == 128) && p.max_q_len > 0;
}

size_t attention_workspace_bytes(const AttentionParams& p, int n_sms) {
  const int splits = choose_splits(p, tile_rows(p), n_sms);
  if (splits <= 1) return 0;
  return static_cast<size_t>(splits) * p.n_tokens * p.n_heads * (p.head_dim + 1) * sizeof(float);
}

void attention_mma(const AttentionParams& p, void* workspace, int* counters, int64_t n_counters,
                   int n_sms, cudaStream_t s) {
  if (p.n_tokens == 0) return;
  const int rows = tile_rows(p);
  const int splits = workspace ? choose_splits(p, rows, n_sms) : 1;
  float* o_part = static_cast<float*>(workspace);
  float* lse_part =
      splits > 1 ? o_part + static_cast<int64_t>(splits) * p.n_tokens * p.n_heads * p.head_dim
                 : nullptr;
  // The merge in the last split's block when a counter a block tile is there, else its own
  // kernel.
  const int group = static_cast<int>(p.n_heads / p.n_kv_heads);
  const int64_t tiles = (static_cast<int64_t>(p.max_q_len) * group + rows - 1) / rows;
  if (splits == 1 || tiles * p.n_seqs * p.n_kv_heads > n_counters) counters = nullptr;
  p.head_dim == 64 ? launch_v3_rows<64>(p, rows, splits, o_part, lse_part, counters, s)
                   : launch_v3_rows<128>(p, rows, splits, o_part, lse_part, counters, s);
  if (splits > 1 && counters == nullptr) {
    const int64_t pairs = p.n_tokens * p.n_heads;
    pdl_launch(
        attention_combine_kernel, static_cast<unsigned>((pairs + kCombineRows - 1) / kCombineRows),
        dim3(static_cast<unsigned>(p.head_dim), kCombineRows), 0, s, p, splits, o_part, lse_part);
  }
}

}  // namespace kestrel::cuda::kernels
