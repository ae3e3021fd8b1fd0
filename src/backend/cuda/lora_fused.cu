// One-row LoRA deltas in ONE kernel per add (decode steps, in CUDA graphs and eagerly): a cluster
// of kLoraCluster blocks per table entry (one row of x and out, one adapter).
//   1. block p dots its part [p * chunk, (p + 1) * chunk) of `in` with every rank of a (warp w
//      owns ranks w, w + 8, ...) into its shared memory, while L2 is asked for its slice of b;
//   2. the cluster barrier publishes the parts; every block sums the kLoraCluster parts in the
//      same fixed order through distributed shared memory (so every block holds the same v);
//   3. block p expands its slice [p * ocols, (p + 1) * ocols) of out_dim: out += scale * v . b,
//      then GELU of the sum where asked (fc1, so the base fc1 needs no GELU pass of its own).
// Against the two-kernel form (lora.cu: split-K shrink, then the expand) this drops a launch
// and the round trip of v through global memory per add; ncu put the two kernels at 5.5 us each
// for qkv's 5 MB at batch 32 with 32 adapters (0.9 TB/s), mostly ramp-up and latency.
// Staging (BULK): where the block's x part, a part and b slice fit in shared memory (rank 16 at
// falcon-7b's shapes), one thread asks for all of them at once with 1D bulk copies
// (cp.async.bulk, Hopper's TMA) that complete on two mbarriers (x and a; b), so every byte of
// the block is in flight from the start and b arrives while the shrink runs. Otherwise (and for
// entries without 16-byte-aligned rows) each thread loads its share through registers.
// Entries with begin == end do nothing; with r == 0 (GELU only) the add is out = gelu(out).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace kestrel::cuda::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kCluster = kLoraCluster;

__device__ __forceinline__ float to_f(uint16_t v, bool f16) {
  return f16 ? __half2float(__ushort_as_half(v)) : __uint_as_float(static_cast<uint32_t>(v) << 16);
}

__device__ __forceinline__ void fma8(const uint4 xq, const uint4 wq, bool f16, float& acc) {
  const uint32_t xs[4] = {xq.x, xq.y, xq.z, xq.w}, ws[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float x0 = __uint_as_float(xs[i] << 16), x1 = __uint_as_float(xs[i] & 0xffff0000u);
    float w0, w1;
    if (f16) {
      w0 = __half2float(__ushort_as_half(static_cast<uint16_t>(ws[i] & 0xffffu)));
      w1 = __half2float(__ushort_as_half(static_cast<uint16_t>(ws[i] >> 16)));
    } else {
      w0 = __uint_as_float(ws[i] << 16);
      w1 = __uint_as_float(ws[i] & 0xffff0000u);
    }
    acc = fmaf(x0, w0, acc);
    acc = fmaf(x1, w1, acc);
  }
}

// v (fp32 weights) . eight b values of one 16-byte word.
__device__ __forceinline__ float dot8(const float* v, const uint4 wq, bool f16, float acc) {
  const uint32_t ws[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float w0, w1;
    if (f16) {
      w0 = __half2float(__ushort_as_half(static_cast<uint16_t>(ws[i] & 0xffffu)));
      w1 = __half2float(__ushort_as_half(static_cast<uint16_t>(ws[i] >> 16)));
    } else {
      w0 = __uint_as_float(ws[i] << 16);
      w1 = __uint_as_float(ws[i] & 0xffff0000u);
    }
    acc = fmaf(v[2 * i], w0, acc);
    acc = fmaf(v[2 * i + 1], w1, acc);
  }
  return acc;
}

__device__ __forceinline__ float gelu_erf(float v) {
  return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// mbarrier and 1D bulk copies (sm_90).
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
#endif
}

__device__ __forceinline__ void fence_mbar_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// The one arrival the barrier waits for, with the bytes its copies will bring.
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t phase) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "LORA_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra LORA_WAIT;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(phase)
      : "memory");
#endif
}

// dst (shared, 16-byte aligned) <- bytes (a multiple of 16) at src (global, 16-byte aligned).
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
#endif
}

// Step 1: this warp's ranks of part [k0, k1) of x . a^T into part[rank] (NR = ranks a warp at
// most, = ceil(max_r / 8), taken G at a time). x_vec and the entry's kLoraVecA: 16-byte loads
// (k0 a multiple of 8).
template <int NR>
__device__ __forceinline__ void shrink_part(const LoraSegDesc& sd, const uint16_t* __restrict__ xr,
                                            int64_t in, int64_t k0, int64_t k1, bool x_vec,
                                            float* part) {
  constexpr int G = NR > 8 ? 8 : NR;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool f16 = sd.f16 != 0;
  const bool vec = x_vec && (sd.vec & kLoraVecA);
#pragma unroll 1
  for (int g0 = 0; g0 < NR; g0 += G) {
    if (warp + g0 * kWarps >= sd.r) break;
    float acc[G];
#pragma unroll
    for (int i = 0; i < G; ++i) acc[i] = 0.0f;
    if (vec) {
      constexpr int U = G >= 8 ? 1 : 4 / G;  // k steps a lane loads before it sums
      for (int64_t k = k0 + lane * 8; k < k1; k += U * 32 * 8) {
        uint4 xq[U], aq[U][G];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t kk = k + u * 32 * 8;
          const bool ok = kk < k1;
          xq[u] = ok ? *reinterpret_cast<const uint4*>(xr + kk) : make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int i = 0; i < G; ++i) {
            const int j = warp + (g0 + i) * kWarps;
            aq[u][i] = ok && j < sd.r ? __ldg(reinterpret_cast<const uint4*>(sd.a + j * in + kk))
                                      : make_uint4(0, 0, 0, 0);
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int i = 0; i < G; ++i) fma8(xq[u], aq[u][i], f16, acc[i]);
      }
    } else {
      for (int64_t k = k0 + lane; k < k1; k += 32) {
        const float xv = to_f(xr[k], false);
#pragma unroll
        for (int i = 0; i < G; ++i) {
          const int j = warp + (g0 + i) * kWarps;
          if (j < sd.r) acc[i] = fmaf(xv, to_f(sd.a[j * in + k], f16), acc[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < G; ++i) {
      float s = acc[i];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      const int j = warp + (g0 + i) * kWarps;
      if (lane == 0 && j < sd.r) part[j] = s;
    }
  }
}

// Step 1 from shared memory: the part's x (xs) and rank rows of a (as, row stride chunk).
template <int NR>
__device__ __forceinline__ void shrink_part_smem(const LoraSegDesc& sd, const uint16_t* xs,
                                                 const uint16_t* as, int64_t chunk, int64_t kl,
                                                 float* part) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool f16 = sd.f16 != 0;
  float acc[NR];
#pragma unroll
  for (int i = 0; i < NR; ++i) acc[i] = 0.0f;
  for (int64_t k = lane * 8; k < kl; k += 32 * 8) {
    const uint4 xq = *reinterpret_cast<const uint4*>(xs + k);
#pragma unroll
    for (int i = 0; i < NR; ++i) {
      const int j = warp + i * kWarps;
      if (j < sd.r) fma8(xq, *reinterpret_cast<const uint4*>(as + j * chunk + k), f16, acc[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < NR; ++i) {
    float s = acc[i];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    const int j = warp + i * kWarps;
    if (lane == 0 && j < sd.r) part[j] = s;
  }
}

// grid (kCluster, entries), clusters of kCluster along x. chunk and ocols: multiples of 8.
// BULK: dynamic shared memory of (chunk * (1 + max_r) + ocols * max_r) 16-bit words.
template <int NR, bool GELU, bool BULK>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, 2)
    lora_fused_kernel(const LoraSegDesc* __restrict__ table, const uint16_t* __restrict__ x,
                      int64_t in, int64_t chunk, bool x_vec, int64_t out_dim, int64_t ocols,
                      uint16_t* __restrict__ out) {
  extern __shared__ __align__(16) uint16_t stage[];
  __shared__ __align__(8) uint64_t bars[2];  // x and a; b
  __shared__ float part[kMaxLoraRank];
  __shared__ float vs[kMaxLoraRank];
  // Before the wait (launched as a programmatic dependent of the base linear in graphs): only
  // the table (a static input, copied before the step) and the adapter's weights, which no
  // kernel writes; x and out from pdl_enter on.
  const LoraSegDesc sd = table[blockIdx.y];
  // The whole cluster shares the entry, so it leaves (or stays) together: no barrier is left
  // waiting.
  if (sd.end <= sd.begin) return;
  cg::cluster_group cluster = cg::this_cluster();
  const int p = static_cast<int>(cluster.block_rank());
  const int r = sd.r;
  const bool f16 = sd.f16 != 0;
  const int64_t row = sd.begin;
  const int64_t k0 = min(in, p * chunk), k1 = min(in, k0 + chunk);
  const int64_t o0 = min(out_dim, p * ocols), o1 = min(out_dim, o0 + ocols);
  const bool vec_a = x_vec && (sd.vec & kLoraVecA);
  const bool vec_b = (sd.vec & kLoraVecB) != 0;
  // Block-uniform: every thread of the block takes the same branches below.
  const bool bulk = BULK && r > 0 && vec_a && vec_b;
  uint16_t* xs = stage;
  uint16_t* as = stage + chunk;
  uint16_t* bs = as + r * chunk;
  const uint32_t xa = static_cast<uint32_t>((k1 - k0) * 2);  // a multiple of 16 when vec_a
  if (bulk) {
    if (threadIdx.x == 0) {
      mbar_init(&bars[0]);
      mbar_init(&bars[1]);
      fence_mbar_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const uint32_t bb = static_cast<uint32_t>((o1 - o0) * r * 2);  // r % 8 == 0
      mbar_arrive_expect(&bars[0], xa * static_cast<uint32_t>(r + 1));
      mbar_arrive_expect(&bars[1], bb);
      if (xa > 0)
        for (int j = 0; j < r; ++j) bulk_copy(as + j * chunk, sd.a + j * in + k0, xa, &bars[0]);
      if (bb > 0) bulk_copy(bs, sd.b + o0 * r, bb, &bars[1]);
    }
  } else if (r > 0) {
    // The part's rows of a, then b's slice (contiguous: [o0, o1) rows of r values), into L2;
    // whole 16-byte words only.
    if (vec_a && xa > 0 && threadIdx.x < r) prefetch_l2(sd.a + threadIdx.x * in + k0, xa);
    if (vec_b && o1 > o0 && threadIdx.x == kThreads - 1) {
      const uint16_t* b0 = sd.b + o0 * r;
      const int64_t bytes = ((o1 - o0) * r * 2) & ~int64_t{15};
      for (int64_t off = 0; off < bytes; off += 16384)
        prefetch_l2(reinterpret_cast<const char*>(b0) + off,
                    static_cast<uint32_t>(bytes - off < 16384 ? bytes - off : 16384));
    }
  }
  pdl_enter();
  if (bulk && threadIdx.x == 0 && xa > 0) bulk_copy(xs, x + row * in + k0, xa, &bars[0]);

  if (r > 0) {
    if (bulk) {
      mbar_wait(&bars[0], 0);
      shrink_part_smem<NR>(sd, xs, as, chunk, k1 - k0, part);
    } else {
      shrink_part<NR>(sd, x + row * in, in, k0, k1, x_vec, part);
    }
    cluster.sync();  // every part written and visible to the cluster
    for (int j = threadIdx.x; j < r; j += kThreads) {
      float s = 0.0f;
#pragma unroll
      for (int q = 0; q < kCluster; ++q) s += cluster.map_shared_rank(part, q)[j];
      vs[j] = sd.scale * s;
    }
    cluster.sync();  // no block leaves while another reads its part; vs complete in the block
    if (bulk) mbar_wait(&bars[1], 0);
  }

  uint16_t* orow = out + row * out_dim;
  const uint16_t* bsrc = bulk ? bs - o0 * r : sd.b;  // column o's b row at bsrc + o * r
  constexpr int C = NR >= 4 ? 1 : 4 / NR;            // columns a thread loads before it sums
  for (int64_t o = o0 + threadIdx.x; o < o1; o += C * kThreads) {
    float acc[C];
    float base[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int64_t oc = o + c * kThreads;
      acc[c] = 0.0f;
      base[c] = oc < o1 ? to_f(orow[oc], false) : 0.0f;
    }
    if (r > 0 && vec_b) {
      constexpr int QB = NR > 4 ? 4 : NR;  // 16-byte words of a b row in registers at once
#pragma unroll
      for (int q0 = 0; q0 < NR; q0 += QB) {
        if (q0 * 8 >= r) break;
        uint4 bq[C][QB];
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
          for (int q = 0; q < QB; ++q) {
            const int64_t oc = o + c * kThreads;
            bq[c][q] = oc < o1 && (q0 + q) * 8 < r
                           ? *reinterpret_cast<const uint4*>(bsrc + oc * r + (q0 + q) * 8)
                           : make_uint4(0, 0, 0, 0);
          }
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
          for (int q = 0; q < QB; ++q)
            if ((q0 + q) * 8 < r) acc[c] = dot8(vs + (q0 + q) * 8, bq[c][q], f16, acc[c]);
      }
    } else if (r > 0) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int64_t oc = o + c * kThreads;
        if (oc >= o1) continue;
        const uint16_t* brow = sd.b + oc * r;
        for (int j = 0; j < r; ++j) acc[c] = fmaf(vs[j], to_f(brow[j], f16), acc[c]);
      }
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int64_t oc = o + c * kThreads;
      if (oc >= o1) continue;
      float v = base[c] + acc[c];
      if constexpr (GELU) v = gelu_erf(v);
      orow[oc] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
  }
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// In a CUDA graph capture the kernel is a programmatic dependent of the base linear before it
// (its weight loads start while that finishes); eagerly a plain launch (cudaLaunchKernelEx costs
// the host more, and eager decode is bound by the host). KESTREL_LORA_PDL=0: never.
bool pdl_in_graphs(cudaStream_t s) {
  static const bool on = [] {
    const char* e = std::getenv("KESTREL_LORA_PDL");
    return !(e && e[0] == '0');
  }();
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  return on && cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusActive;
}

// Largest BULK stage: two blocks an SM fit in the 227 KiB of an H100 / H200 SM.
constexpr int64_t kBulkMaxBytes = 112 * 1024;

template <int NR, bool GELU, bool BULK>
void launch(dim3 grid, size_t smem, cudaStream_t s, const LoraSegDesc* table, const uint16_t* x,
            int64_t in, int64_t chunk, bool x_vec, int64_t out_dim, int64_t ocols, uint16_t* out) {
  auto* kernel = lora_fused_kernel<NR, GELU, BULK>;
  if constexpr (BULK) {
    static const bool sized = [&] {  // once per instantiation, before any capture uses it
      return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kBulkMaxBytes)) == cudaSuccess;
    }();
    (void)sized;  // a refusal shows as the launch's own error
  }
  if (pdl_in_graphs(s)) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, kernel, table, x, in, chunk, x_vec, out_dim, ocols, out) ==
        cudaSuccess)
      return;
    (void)cudaGetLastError();  // PDL refused: the plain launch below reports its own errors
  }
  kernel<<<grid, kThreads, smem, s>>>(table, x, in, chunk, x_vec, out_dim, ocols, out);
}

template <bool GELU, bool BULK>
void launch_nr(int nr, dim3 grid, size_t smem, cudaStream_t s, const LoraSegDesc* table,
               const uint16_t* x, int64_t in, int64_t chunk, bool x_vec, int64_t out_dim,
               int64_t ocols, uint16_t* out) {
  switch (nr) {
    case 1:
      return launch<1, GELU, BULK>(grid, smem, s, table, x, in, chunk, x_vec, out_dim, ocols, out);
    case 2:
      return launch<2, GELU, BULK>(grid, smem, s, table, x, in, chunk, x_vec, out_dim, ocols, out);
    case 4:
      return launch<4, GELU, BULK>(grid, smem, s, table, x, in, chunk, x_vec, out_dim, ocols, out);
    case 8:
      return launch<8, GELU, BULK>(grid, smem, s, table, x, in, chunk, x_vec, out_dim, ocols, out);
    default:  // ranks above 64 never stage (lora_add_fused): the register form
      return launch<16, GELU, false>(grid, 0, s, table, x, in, chunk, x_vec, out_dim, ocols, out);
  }
}

int fused_override = -2;  // set_lora_fused's value; -2: not set, read the environment

// -1 the default rule, 0 the pair, 1 fused, 2 fused without the bulk stage.
int fused_mode() {
  static const int env = [] {
    const char* e = std::getenv("KESTREL_LORA_FUSED");
    return e && *e ? std::atoi(e) : -1;
  }();
  return fused_override != -2 ? fused_override : env;
}

}  // namespace

void set_lora_fused(int mode) {
  fused_override = mode;
}

bool lora_use_fused(int n_entries) {
  const int mode = fused_mode();
  if (mode >= 0) return mode != 0;
  // One segment's a and b over 8 blocks stream too slowly below this (batch 1: the split-K pair
  // spreads them over ~260 blocks).
  return n_entries >= kLoraFusedMinEntries;
}

void lora_add_fused(const LoraSegDesc* table, int n_entries, int max_r, bool x_vec,
                    const uint16_t* x, int64_t in, int64_t out_dim, bool gelu, uint16_t* out,
                    cudaStream_t s) {
  if (n_entries == 0 || (max_r == 0 && !gelu)) return;
  const int64_t chunk = ceil_div(ceil_div(in, kCluster), 8) * 8;
  const int64_t ocols = ceil_div(ceil_div(out_dim, kCluster), 8) * 8;
  int nr = 1;
  while (nr * kWarps < max_r) nr *= 2;
  const dim3 grid(kCluster, static_cast<unsigned>(n_entries));
  const int64_t stage = (chunk * (1 + max_r) + ocols * max_r) * 2;
  const bool bulk = fused_mode() != 2 && x_vec && max_r > 0 && nr <= 8 && stage <= kBulkMaxBytes;
  const size_t smem = bulk ? static_cast<size_t>(stage) : 0;
  if (gelu && bulk)
    launch_nr<true, true>(nr, grid, smem, s, table, x, in, chunk, x_vec, out_dim, ocols, out);
  else if (gelu)
    launch_nr<true, false>(nr, grid, smem, s, table, x, in, chunk, x_vec, out_dim, ocols, out);
  else if (bulk)
    launch_nr<false, true>(nr, grid, smem, s, table, x, in, chunk, x_vec, out_dim, ocols, out);
  else
    launch_nr<false, false>(nr, grid, smem, s, table, x, in, chunk, x_vec, out_dim, ocols, out);
}

}  // namespace kestrel::cuda::kernels
