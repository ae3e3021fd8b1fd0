// The linear of decode batches and short prompts (3..128 rows) on Hopper's tensor cores:
// out [M, N] = epilogue(x [M, K] @ w [N, K]^T + bias), bf16 in, fp32 sums. Bound by streaming w
// once (2 M FLOP a 2-byte weight), so the kernel is built around that stream:
// - Operands swap roles: a tile is 128 rows of w (two warpgroups' wgmma M of 64) by all M rows
//   of x (the wgmma N, 16..128), so a decode batch never pads w.
// - Warpgroup 0's first thread streams 64-k slices of the w tile and of x into shared memory
//   with the tensor memory accelerator (TMA, 128-byte swizzle, zero fill past the edges), up to
//   8 stages deep; warpgroups 1 and 2 multiply each stage with wgmma straight from shared memory
//   and hand it back through an mbarrier, so loads of later stages overlap the math.
// - Stream-K: one block a multiprocessor (a persistent grid) takes an equal, contiguous share of
//   all (tile, 64-k slice) steps, so every multiprocessor streams the same bytes whatever the
//   tile count (qkv's 37 tiles over 132 multiprocessors), and the stream never stops between
//   tiles. A share starts and ends inside tiles: a block whose share starts inside a tile
//   writes its fp32 partial to the workspace (a slot a block, one store a thread, coalesced) and
//   counts it on the tile's flag; the block that holds the tile's first slice (its owner, which
//   reaches that tile last, at the end of its own share) waits for the flag, adds the partials
//   of the blocks after it in block order (deterministic), resets the flag and applies the
//   epilogue. Only owners wait, and only on partials written first thing by later blocks.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/linear_util.cuh"
#include "backend/cuda/pdl.cuh"

// wgmma is sm_90a only; the compute_90 PTX carries an empty kernel that is never launched
// (decode_gemm returns false unless the workspace says compute capability 9.0).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KESTREL_WGMMA 1
#endif

namespace kestrel::cuda::kernels {
namespace {

constexpr int kTileN = 128;    // rows of w a tile: two warpgroups of 64
constexpr int kTileK = 64;     // k a stage: 128 bytes of bf16, a swizzle row
constexpr int kThreads = 384;  // warpgroup 0 loads, 1 and 2 multiply
constexpr int kConsumerThreads = 256;
constexpr int kWBytes = kTileN * kTileK * 2;  // 16 KB of w a stage
constexpr int kSmemLimit = 227 * 1024;        // a block's dynamic shared memory on sm_90
constexpr int kMaxStages = 8;

// NT: the rows of x a tile holds (16, 32, 64 or 128; x has M <= NT rows, the rest zero-filled).
// KB: the 64-k boxes a stage holds (a stage reads 128 x KB contiguous bytes of each row of w).
// The stages take what shared memory allows, up to 8.
template <int NT, int KB>
struct Cfg {
  static constexpr int kXBox = NT * kTileK * 2;  // one 64-k box of x
  static constexpr int kXBytes = KB * kXBox;
  static constexpr int kStageBytes = KB * kWBytes + kXBytes;  // a multiple of 1024: swizzle atoms
  static constexpr int kStages = std::min(kMaxStages, (kSmemLimit - 2048) / kStageBytes);
  // Stages, the barriers (full and empty a stage) and 1024 bytes to align the start.
  static constexpr int kSmem = kStages * kStageBytes + 16 * kStages + 1024;
  static constexpr int kSub = NT < 64 ? NT : 64;  // x rows of one wgmma (its N)
  static constexpr int kSubs = NT / kSub;
  static constexpr int kTile = kTileN * NT;  // floats of a partial tile
};

struct GemmArgs {
  const uint16_t* bias;   // [n] or null
  const uint16_t* bias2;  // the second product's, [n] or null
  int64_t m, n;
  int64_t k_tiles, steps;  // k slices (KB boxes of 64) a tile; tiles x k_tiles
  int64_t k_tiles1;        // the first product's slices; a second product's follow them
  // A pair (SecondTerm::out): tiles from tiles_a on are the second weight's (its maps), into
  // out_b [m, n_b] with bias_b and gelu_b; else tiles_a is every tile.
  int64_t tiles_a, n_b;
  const uint16_t* bias_b;
  void* out_b;
  bool gelu_b;
  bool gelu, accumulate, f32_out;
  bool w_evict_first;      // w's boxes leave L2 first (read once; x and the partials stay)
  bool pipelined;          // a stage's wgmma runs while the next stage's is issued
  const uint16_t* addend;  // [m, n] or null
  void* out;
  float* partial;  // a partial tile a block
  int* flags;      // one a tile, zero between launches
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#ifdef KESTREL_WGMMA
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

// An arrive on bar by the threads where `pred` holds, predicated rather than branched (a branch
// around it would put the consumers' wgmma on a divergent path).
__device__ __forceinline__ void mbar_arrive_if(uint64_t* bar, bool pred) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %1, 0;\n"
      "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(smem_u32(bar)),
      "r"(static_cast<int>(pred))
      : "memory");
}

// Until the phase of `parity` has completed (a fresh barrier's phase "1" counts as completed).
// The retry loop is inside the asm: a loop the compiler sees would be a divergent path.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "KESTREL_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra KESTREL_MBAR_WAIT;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// Box (k0, row0) of a 2-D tensor map into shared memory, completing on bar.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int k0,
                                         int row0) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];" ::"r"(smem_u32(dst)),
      "l"(map), "r"(k0), "r"(row0), "r"(smem_u32(bar))
      : "memory");
}

// The same, with an L2 eviction policy (createpolicy) for the box.
__device__ __forceinline__ void tma_load_hint(void* dst, const CUtensorMap* map, uint64_t* bar,
                                              int k0, int row0, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_u32(dst)),
      "l"(map), "r"(k0), "r"(row0), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

// A wgmma operand in shared memory: rows of 128 bytes (64 k), 128-byte swizzle, 8-row groups
// 1024 bytes apart; the start moves 32 bytes a 16-k step inside the swizzle atom.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{16 >> 4} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_one() {  // all but the last committed group
  asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
}

// The consumer warpgroups only (barrier 1; 0 is __syncthreads).
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
}

// d [64 x 16] (+)= a [64 x 16] b [16 x 16]^T, both from shared memory (descriptors).
__device__ __forceinline__ void wgmma_n16(float (&d)[8], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7"
      "}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "l"(a), "l"(b), "r"(scale_d));
}

// d [64 x 32] (+)= a [64 x 16] b [16 x 32]^T, both from shared memory (descriptors).
__device__ __forceinline__ void wgmma_n32(float (&d)[16], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(scale_d));
}

// d [64 x 64] (+)= a [64 x 16] b [16 x 64]^T, both from shared memory (descriptors).
__device__ __forceinline__ void wgmma_n64(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(scale_d));
}

template <int N>
__device__ __forceinline__ void wgmma(float (&d)[N / 2], uint64_t a, uint64_t b) {
  if constexpr (N == 16) {
    wgmma_n16(d, a, b, 1);
  } else if constexpr (N == 32) {
    wgmma_n32(d, a, b, 1);
  } else {
    wgmma_n64(d, a, b, 1);
  }
}
#endif  // KESTREL_WGMMA

// The block holding step `step` of a grid of g blocks over `steps` (block b: steps
// [b steps / g, (b + 1) steps / g)).
__device__ __forceinline__ int64_t block_of(int64_t step, int64_t steps, int64_t g) {
  return ((step + 1) * g - 1) / steps;
}

// w's and x's tensor maps, those of the second product (the first's again without one), then
// the launch's arguments. Block: 3 warpgroups (above).
template <int NT, int KB>
__global__ void __launch_bounds__(kThreads, 1)
    decode_gemm_kernel(const __grid_constant__ CUtensorMap w_map,
                       const __grid_constant__ CUtensorMap x_map,
                       const __grid_constant__ CUtensorMap w2_map,
                       const __grid_constant__ CUtensorMap x2_map, const GemmArgs a) {
#ifdef KESTREL_WGMMA
  using C = Cfg<NT, KB>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  auto* full = reinterpret_cast<uint64_t*>(smem + C::kStages * C::kStageBytes);
  uint64_t* empty = full + C::kStages;
  // The warpgroup through a shuffle: the compiler then knows it is the same across a warp, and
  // the consumers' wgmma sit on no divergent path (ptxas would serialize them otherwise).
  const int t = static_cast<int>(threadIdx.x), wg = __shfl_sync(0xffffffffu, t / 128, 0);
  const int64_t g = gridDim.x, b = blockIdx.x;
  const int64_t begin = b * a.steps / g, end = (b + 1) * a.steps / g;
  if (t == 0) {
    // The two tensor maps into the TMA unit's cache while the barriers are set up.
    asm volatile("prefetch.tensormap [%0];" ::"l"(&w_map) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(&x_map) : "memory");
    if (a.k_tiles1 < a.k_tiles) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(&w2_map) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(&x2_map) : "memory");
    }
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(&full[s], 1);   // the producer's arrive, plus the bytes of the stage
      mbar_init(&empty[s], 8);  // each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_enter();

  if (wg == 0) {  // the producer: one thread issues every load
    if (t != 0) return;
    uint64_t policy = 0;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    int stage = 0;
    uint32_t phase = 0;
    for (int64_t step = begin; step < end; ++step) {
      const int tile = static_cast<int>(step / a.k_tiles);
      int kt = static_cast<int>(step % a.k_tiles);
      // The second product's slices follow the first's.
      const bool second = kt >= a.k_tiles1, second_w = tile >= a.tiles_a;
      const CUtensorMap* wm = second || second_w ? &w2_map : &w_map;
      const CUtensorMap* xm = second ? &x2_map : &x_map;
      if (second) kt -= static_cast<int>(a.k_tiles1);
      const int w_row = (second_w ? tile - static_cast<int>(a.tiles_a) : tile) * kTileN;
      mbar_wait(&empty[stage], phase ^ 1);
      uint8_t* st = smem + stage * C::kStageBytes;
      mbar_expect_tx(&full[stage], C::kStageBytes);
#pragma unroll
      for (int bx = 0; bx < KB; ++bx) {
        const int k0 = (kt * KB + bx) * kTileK;
        if (a.w_evict_first) {
          tma_load_hint(st + bx * kWBytes, wm, &full[stage], k0, w_row, policy);
        } else {
          tma_load(st + bx * kWBytes, wm, &full[stage], k0, w_row);
        }
      }
#pragma unroll
      for (int bx = 0; bx < KB; ++bx)
        tma_load(st + KB * kWBytes + bx * C::kXBox, xm, &full[stage], (kt * KB + bx) * kTileK, 0);
      if (++stage == C::kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    return;
  }

  // Consumers: warpgroup cw takes rows [64 cw, 64 cw + 64) of the tile. Accumulator i of sub s:
  // tile row cw * 64 + warp * 16 + lane / 4 + 8 (i % 4 / 2) (a row of w, so a column of out),
  // x row s * 64 + 8 (i / 4) + 2 (lane % 4) + i % 2.
  const int cw = wg - 1, warp = (t / 32) % 4, lane = t % 32;
  const int ct = t - 128;  // 0..255 among the consumers
  const int r_base = cw * 64 + warp * 16 + lane / 4;
  auto x_row = [&](int s, int i) { return s * 64 + 8 * (i / 4) + 2 * (lane % 4) + i % 2; };
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t step = begin; step < end;) {
    const int tile = static_cast<int>(step / a.k_tiles);
    const int64_t kb = step % a.k_tiles, ke = min(a.k_tiles, kb + (end - step));
    step += ke - kb;
    float acc[C::kSubs][C::kSub / 2];
#pragma unroll
    for (int s = 0; s < C::kSubs; ++s)
#pragma unroll
      for (int i = 0; i < C::kSub / 2; ++i) acc[s][i] = 0.0f;
    int prev = -1;  // the stage whose wgmma may still run (pipelined)
    for (int64_t kt = kb; kt < ke; ++kt) {
      mbar_wait(&full[stage], phase);
      const uint32_t w_s = smem_u32(smem + stage * C::kStageBytes) + cw * 64 * 128;
      const uint32_t x_s = smem_u32(smem + stage * C::kStageBytes + KB * kWBytes);
      wgmma_fence();
#pragma unroll
      for (int bx = 0; bx < KB; ++bx)
#pragma unroll
        for (int kk = 0; kk < kTileK / 16; ++kk) {
          const uint64_t da = smem_desc(w_s + bx * kWBytes + kk * 32);
#pragma unroll
          for (int s = 0; s < C::kSubs; ++s)
            wgmma<C::kSub>(acc[s], da, smem_desc(x_s + bx * C::kXBox + s * 64 * 128 + kk * 32));
        }
      wgmma_commit();
      if (a.pipelined) {
        wgmma_wait_one();  // the stage before this one is read: hand it back
        if (prev >= 0) mbar_arrive_if(&empty[prev], lane == 0);
        prev = stage;
      } else {
        wgmma_wait_all();
        mbar_arrive_if(&empty[stage], lane == 0);
      }
      if (++stage == C::kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    wgmma_wait_all();  // (a no-op unless pipelined) the sums are read below
    if (prev >= 0) mbar_arrive_if(&empty[prev], lane == 0);

    if (kb != 0) {  // the tile began in an earlier block: hand the partial to its owner
      float* mine = a.partial + b * C::kTile;
#pragma unroll
      for (int s = 0; s < C::kSubs; ++s)
#pragma unroll
        for (int i = 0; i < C::kSub / 2; ++i)
          if (x_row(s, i) < a.m) mine[(s * (C::kSub / 2) + i) * kConsumerThreads + ct] = acc[s][i];
      __threadfence();
      consumer_sync();
      if (ct == 0) atomicAdd(&a.flags[tile], 1);
      continue;
    }
    if (ke != a.k_tiles) {  // the owner of a tile that goes on in blocks b + 1 .. last
      const int64_t last = block_of(int64_t{tile} * a.k_tiles + a.k_tiles - 1, a.steps, g);
      if (ct == 0) {
        volatile int* flag = a.flags + tile;
        while (*flag != last - b) {
        }
        *flag = 0;  // ready for the next launch (and a graph's replay)
      }
      consumer_sync();
      __threadfence();
      for (int64_t from = b + 1; from <= last; ++from) {
        const float* part = a.partial + from * C::kTile;
#pragma unroll
        for (int s = 0; s < C::kSubs; ++s)
#pragma unroll
          for (int i = 0; i < C::kSub / 2; ++i)
            if (x_row(s, i) < a.m)
              acc[s][i] += __ldcg(part + (s * (C::kSub / 2) + i) * kConsumerThreads + ct);
      }
    }
    // The tile's weight: the first, or a pair's second (its own rows, out, bias and GELU).
    const bool second_w = tile >= a.tiles_a;
    const int64_t row0 = (second_w ? tile - a.tiles_a : int64_t{tile}) * kTileN;
    const int64_t n_out = second_w ? a.n_b : a.n;
    const uint16_t* bias = second_w ? a.bias_b : a.bias;
    void* out = second_w ? a.out_b : a.out;
    const bool gelu = second_w ? a.gelu_b : a.gelu;
#pragma unroll
    for (int s = 0; s < C::kSubs; ++s)
#pragma unroll
      for (int i = 0; i < C::kSub / 2; ++i) {
        const int64_t row = row0 + r_base + 8 * ((i % 4) / 2), col = x_row(s, i);
        if (row >= n_out || col >= a.m) continue;
        const float bv = (bias ? bf16_bits_to_f32(bias[row]) : 0.0f) +
                         (a.bias2 ? bf16_bits_to_f32(a.bias2[row]) : 0.0f);
        store_epilogue(acc[s][i] + bv, gelu, a.accumulate, a.addend, out, a.f32_out,
                       col * n_out + row);
      }
  }
#endif  // KESTREL_WGMMA
}

// cuTensorMapEncodeTiled from the driver (through the runtime: no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A row-major bf16 matrix [rows, k] as boxes of box_rows x 64 k, 128-byte swizzled.
bool make_map(CUtensorMap* map, const void* base, int64_t rows, int64_t k, int box_rows) {
  const auto fn = encode_fn();
  if (!fn) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * 2};
  const cuuint32_t box[2] = {kTileK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
            elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int NT, int KB>
bool launch(int variant, const uint16_t* x, const uint16_t* w, const uint16_t* bias, int64_t m,
            int64_t n, int64_t k, bool gelu, bool accumulate, const uint16_t* addend, void* out,
            bool f32_out, const DecodeGemmWorkspace& ws, cudaStream_t s, const SecondTerm& plus) {
  using C = Cfg<NT, KB>;
  auto* kernel = decode_gemm_kernel<NT, KB>;
  {                                         // once a device, before any capture needs it
    static std::atomic<uint64_t> opted{0};  // a bit a device
    int dev = 0;
    cudaGetDevice(&dev);
    const uint64_t bit = uint64_t{1} << (dev & 63);
    if (!(opted.load(std::memory_order_acquire) & bit)) {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem) !=
          cudaSuccess)
        return false;
      opted.fetch_or(bit, std::memory_order_acq_rel);
    }
  }
  // A pair: n is both weights' rows, the first's plus.n1 (gemv's convention).
  const bool pair = plus.out != nullptr, two = !pair && plus.k > 0;
  const int64_t n_a = pair ? plus.n1 : n, n_b = pair ? n - plus.n1 : 0;
  CUtensorMap w_map, x_map, w2_map, x2_map;
  if (!make_map(&w_map, w, n_a, k, kTileN) || !make_map(&x_map, x, m, k, NT)) return false;
  if (two &&
      (!make_map(&w2_map, plus.w, n, plus.k, kTileN) || !make_map(&x2_map, plus.x, m, plus.k, NT)))
    return false;
  if (pair && !make_map(&w2_map, plus.w, n_b, k, kTileN)) return false;
  if (!two && !pair) w2_map = w_map;
  if (!two) x2_map = x_map;
  GemmArgs a{};
  a.bias = bias;
  a.bias2 = two ? plus.bias : nullptr;
  a.m = m;
  a.n = n_a;
  const int64_t slice = KB * kTileK;
  a.k_tiles1 = (k + slice - 1) / slice;
  a.k_tiles = a.k_tiles1 + (two ? (plus.k + slice - 1) / slice : 0);
  a.tiles_a = (n_a + kTileN - 1) / kTileN;
  a.n_b = n_b;
  a.bias_b = pair ? plus.bias : nullptr;
  a.out_b = plus.out;
  a.gelu_b = plus.gelu;
  const int64_t tiles = a.tiles_a + (n_b + kTileN - 1) / kTileN;
  if (tiles > ws.n_flags) return false;
  a.steps = tiles * a.k_tiles;
  // A block a multiprocessor, each at least 4 steps (shorter shares pay their partials for
  // little), within the workspace's partial slots.
  const int64_t grid =
      std::min<int64_t>({ws.sms, std::max<int64_t>(1, a.steps / 4), ws.partial_floats / C::kTile});
  a.gelu = gelu;
  a.accumulate = accumulate;
  a.f32_out = f32_out;
  a.w_evict_first = variant >= 2;
  a.pipelined = variant >= 3;
  a.addend = addend;
  a.out = out;
  a.partial = ws.partial;
  a.flags = ws.flags;
  pdl_launch(kernel, static_cast<unsigned>(grid), kThreads, C::kSmem, s, w_map, x_map, w2_map,
             x2_map, a);
  return true;
}

}  // namespace

bool decode_gemm_supported(int64_t rows, int64_t n, int64_t k, const void* x, const void* w) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return rows >= 1 && rows <= kDecodeGemmMaxRows && k % 8 == 0 && k > 0 && n > 0 &&
         n <= (int64_t{1} << 31) - kTileN && k < (int64_t{1} << 31) && aligned(x) && aligned(w);
}

int64_t decode_gemm_workspace_floats(int sms) {
  return int64_t{sms} * kTileN * kDecodeGemmMaxRows;
}

bool decode_gemm(const uint16_t* x, const uint16_t* w, const uint16_t* bias, int64_t rows,
                 int64_t n, int64_t k, bool gelu, bool accumulate, const uint16_t* addend,
                 void* out, bool f32_out, int variant, const DecodeGemmWorkspace& ws,
                 cudaStream_t s, const SecondTerm& plus) {
  if (!ws.sm90) return false;  // the kernel's sm_90a code runs on compute capability 9.0 only
  if (n == 0 || rows == 0) return true;
  // Variant 4 reads 256 k a stage up to 32 rows and 128 above (shared memory holds 3-4 stages).
  const bool wide = variant >= 4;
  auto go = [&](auto nt, auto kb) {
    return launch<decltype(nt)::value, decltype(kb)::value>(
        variant, x, w, bias, rows, n, k, gelu, accumulate, addend, out, f32_out, ws, s, plus);
  };
  using I16 = std::integral_constant<int, 16>;
  using I32 = std::integral_constant<int, 32>;
  using I64 = std::integral_constant<int, 64>;
  using I128 = std::integral_constant<int, 128>;
  using K1 = std::integral_constant<int, 1>;
  using K2 = std::integral_constant<int, 2>;
  using K4 = std::integral_constant<int, 4>;
  if (rows <= 16) return wide ? go(I16{}, K4{}) : go(I16{}, K1{});
  if (rows <= 32) return wide ? go(I32{}, K4{}) : go(I32{}, K1{});
  if (rows <= 64) return wide ? go(I64{}, K2{}) : go(I64{}, K1{});
  return wide ? go(I128{}, K2{}) : go(I128{}, K1{});
}

}  // namespace kestrel::cuda::kernels
