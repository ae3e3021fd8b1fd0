// Token sampling on the GPU with the host sampler's semantics (engine/sampler.cpp:
// penalties, temperature, softmax, then top_k, top_p and typical_p in sequence,
// each over the renormalised survivors of the previous one, on the probabilities
// sorted most likely first, ties by id, and one draw u in [0, 1)
// from the request's generator, walked in token-id order). Only ids, logprobs
// and alternatives leave the device.
#include <cub/cub.cuh>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace kestrel::cuda::kernels {
namespace {

constexpr int kThreads = 512;  // 1024 asks for more registers than an SM has

size_t align_up(size_t n) {
  return (n + 255) / 256 * 256;
}

// One block per row: x = penalised (and, when sampling, temperature-scaled)
// logits; probs = softmax(x) (fp32 exp, fp64 sum, as the host); ids = iota for
// the sort. Greedy rows also get their argmax of x here.
__global__ void __launch_bounds__(kThreads)
    sample_prepare_kernel(const float* logits, int64_t vocab, const SampleRowParams* params,
                          const int32_t* seen_off, const int32_t* seen_ids, const int32_t* gen_off,
                          const int32_t* gen_ids, const int32_t* gen_counts, float* x, float* probs,
                          int32_t* iota, int32_t* out_ids) {
  pdl_enter();
  const int64_t r = blockIdx.x;
  const SampleRowParams p = params[r];
  const float* in = logits + r * vocab;
  float* xr = x + r * vocab;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) xr[i] = in[i];
  __syncthreads();
  if (p.repetition_penalty != 1.0f) {
    for (int32_t j = seen_off[r] + threadIdx.x; j < seen_off[r + 1]; j += blockDim.x) {
      const int32_t id = seen_ids[j];
      if (id < 0 || id >= vocab) continue;
      const float l = xr[id];
      xr[id] = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
    __syncthreads();
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    for (int32_t j = gen_off[r] + threadIdx.x; j < gen_off[r + 1]; j += blockDim.x) {
      const int32_t id = gen_ids[j];
      if (id < 0 || id >= vocab) continue;
      xr[id] -= p.frequency_penalty * static_cast<float>(gen_counts[j]) + p.presence_penalty;
    }
    __syncthreads();
  }
  const bool scale = p.do_sample && p.temperature != 1.0f;
  float m = -FLT_MAX, bv = -FLT_MAX;
  int32_t bi = kNoIndex;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    float v = xr[i];
    if (scale) xr[i] = v = v / p.temperature;
    m = fmaxf(m, v);
    if (v > bv) bv = v, bi = static_cast<int32_t>(i);
  }
  m = block_max<kThreads>(m);
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) sum += expf(xr[i] - m);
  sum = block_sum<kThreads>(sum);
  float* pr = probs + r * vocab;
  int32_t* ir = iota + r * vocab;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    pr[i] = static_cast<float>(static_cast<double>(expf(xr[i] - m)) / sum);
    ir[i] = static_cast<int32_t>(i);
  }
  if (!p.do_sample) {
    const ArgMaxPair best = block_argmax<kThreads>(bv, bi);
    if (threadIdx.x == 0) out_ids[r] = best.key == kNoIndex ? 0 : best.key;
  }
}

// Typical over the cut_m[r] survivors of top_k / top_p, q = p / cut_s[r]: the
// entropy of q and, in sorted order, each survivor's |-log q - H| (fp64, as the
// host; others infinite), keyed for a stable ascending sort of the sorted ranks.
__global__ void __launch_bounds__(kThreads)
    sample_typical_kernel(const float* sorted_p, int64_t vocab, const int32_t* cut_m,
                          const double* cut_s, double* dev_keys, int32_t* ranks) {
  pdl_enter();
  const int64_t r = blockIdx.x;
  const float* sp = sorted_p + r * vocab;
  const int64_t m = cut_m[r];
  const double s = cut_s[r];
  double h = 0.0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
    const double q = sp[i] / s;
    if (q > 0) h -= q * log(q);
  }
  h = block_sum<kThreads>(h);
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const double q = i < m ? sp[i] / s : 0.0;
    dev_keys[r * vocab + i] = q > 0 ? fabs(-log(q) - h) : INFINITY;
    ranks[r * vocab + i] = static_cast<int32_t>(i);
  }
}

// Exclusive prefix sums (fp64) of a row of n values, each thread a contiguous
// chunk: returns the chunk's start and fills the thread's own running sums.
struct ChunkScan {
  int64_t begin, end;
  double before;  // sum of everything before this thread's chunk
};

template <typename Load>
__device__ ChunkScan chunk_scan(int64_t n, Load load) {
  using Scan = cub::BlockScan<double, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int64_t per = (n + kThreads - 1) / kThreads;
  ChunkScan c;
  const int64_t start = static_cast<int64_t>(threadIdx.x) * per;
  c.begin = start < n ? start : n;
  c.end = c.begin + per < n ? c.begin + per : n;
  double local = 0.0;
  for (int64_t i = c.begin; i < c.end; ++i) local += load(i);
  Scan(tmp).ExclusiveSum(local, c.before);
  __syncthreads();
  return c;
}

// top_k then top_p, as a prefix of the sorted order: cut_m[r] survivors of
// mass cut_s[r]. top_k keeps what ties the k-th probability; top_p keeps rank
// j iff j == 0 or the mass before it over the top-k mass is < top_p.
__global__ void __launch_bounds__(kThreads)
    sample_cut_kernel(const float* sorted_p, int64_t vocab, const SampleRowParams* params,
                      int32_t* cut_m, double* cut_s) {
  pdl_enter();
  const int64_t r = blockIdx.x;
  const SampleRowParams p = params[r];
  const float* sp = sorted_p + r * vocab;
  int64_t m = vocab;
  if (p.do_sample && p.top_k > 0 && p.top_k < vocab) {
    const float kth = sp[p.top_k - 1];
    double c = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) c += sp[i] >= kth ? 1.0 : 0.0;
    m = static_cast<int64_t>(block_sum<kThreads>(c));
  }
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) s += sp[i];
  s = block_sum<kThreads>(s);
  if (p.do_sample && p.top_p < 1.0f) {
    ChunkScan c = chunk_scan(m, [&](int64_t j) { return static_cast<double>(sp[j]); });
    double acc = c.before, kept = 0.0;
    for (int64_t j = c.begin; j < c.end; ++j) {
      if (j == 0 || acc / s < p.top_p) kept += 1.0;
      acc += sp[j];
    }
    m = static_cast<int64_t>(block_sum<kThreads>(kept));
    double s2 = 0.0;
    for (int64_t i = threadIdx.x; i < m; i += blockDim.x) s2 += sp[i];
    s = block_sum<kThreads>(s2);
  }
  if (threadIdx.x == 0) {
    cut_m[r] = static_cast<int32_t>(m);
    cut_s[r] = s;
  }
}

// One block per sampled row: keep flags (the top_k / top_p prefix, typical
// over the deviation order of its survivors), then the draw in id order and
// the alternatives from the sorted order.
__global__ void __launch_bounds__(kThreads)
    sample_draw_kernel(const float* probs, const float* sorted_p, const int32_t* sorted_id,
                       const int32_t* dev_rank, const double* dev_keys_sorted, const int32_t* cut_m,
                       const double* cut_s, int64_t vocab, const SampleRowParams* params,
                       uint8_t* keep, int32_t* out_ids, float* out_logprobs, int32_t* alt_ids,
                       float* alt_logprobs, int32_t max_top_n) {
  pdl_enter();
  __shared__ int32_t pick;
  const int64_t r = blockIdx.x;
  const SampleRowParams p = params[r];
  const float* pr = probs + r * vocab;
  const float* sp = sorted_p + r * vocab;
  const int32_t* sid = sorted_id + r * vocab;
  uint8_t* kr = keep + r * vocab;
  if (p.do_sample) {
    const int64_t m = cut_m[r];
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) kr[sid[j]] = j < m ? 1 : 0;
    __syncthreads();
    if (p.typical_p < 1.0f) {
      // Deviation order j over the survivors' q: the first j whose cumulative q
      // reaches typical_p sets the limit; deviations above it go (ties stay).
      const int32_t* dr = dev_rank + r * vocab;
      const double* dk = dev_keys_sorted + r * vocab;
      const double s = cut_s[r];
      __shared__ int32_t first;
      if (threadIdx.x == 0) first = 0x7fffffff;
      auto q = [&](int64_t j) { return dr[j] < m ? static_cast<double>(sp[dr[j]]) / s : 0.0; };
      ChunkScan d = chunk_scan(vocab, q);
      double dacc = d.before;
      for (int64_t j = d.begin; j < d.end; ++j) {
        dacc += q(j);
        if (dacc >= p.typical_p) {
          atomicMin(&first, static_cast<int32_t>(j));
          break;
        }
      }
      __syncthreads();
      if (first != 0x7fffffff) {
        const double limit = dk[first];
        for (int64_t j = first + 1 + threadIdx.x; j < vocab; j += blockDim.x) {
          if (dk[j] > limit) kr[sid[dr[j]]] = 0;
        }
      }
      __syncthreads();
    }
    double total = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) total += kr[i] ? pr[i] : 0.0f;
    total = block_sum<kThreads>(total);
    const double target = p.u * total;
    if (threadIdx.x == 0) pick = 0x7fffffff;
    __syncthreads();
    // The first id whose running kept mass passes the target (the host's walk).
    ChunkScan w =
        chunk_scan(vocab, [&](int64_t i) { return kr[i] ? static_cast<double>(pr[i]) : 0.0; });
    double run = w.before;
    int32_t last_kept = -1;
    for (int64_t i = w.begin; i < w.end; ++i) {
      if (!kr[i]) continue;
      run += pr[i];
      last_kept = static_cast<int32_t>(i);
      if (run > target) {
        atomicMin(&pick, static_cast<int32_t>(i));
        break;
      }
    }
    __syncthreads();
    if (pick == 0x7fffffff) {
      // Rounding left the target unreached: the last kept id, as the host.
      __shared__ int32_t last;
      if (threadIdx.x == 0) last = -1;
      __syncthreads();
      if (last_kept >= 0) atomicMax(&last, last_kept);
      __syncthreads();
      if (threadIdx.x == 0) pick = last < 0 ? sid[0] : last;
      __syncthreads();
    }
    if (threadIdx.x == 0) out_ids[r] = pick;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int32_t id = out_ids[r];
    out_logprobs[r] = logf(fmaxf(pr[id], 1e-38f));
  }
  for (int32_t j = threadIdx.x; j < max_top_n; j += blockDim.x) {
    const bool on = j < p.top_n && j < vocab;
    alt_ids[r * max_top_n + j] = on ? sid[j] : -1;
    alt_logprobs[r * max_top_n + j] = on ? logf(fmaxf(sp[j], 1e-38f)) : 0.0f;
  }
}

struct Layout {
  size_t x, probs, iota, sorted_p, sorted_id, cut_m, cut_s, dev_keys, dev_keys_sorted, ranks,
      ranks_sorted, keep, offsets, cub1, cub2, total;
  size_t cub1_bytes, cub2_bytes;
};

Layout layout(int64_t n, int64_t vocab, bool typical) {
  const size_t nv = static_cast<size_t>(n * vocab);
  Layout l{};
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at += align_up(bytes);
    return here;
  };
  l.x = take(nv * 4);
  l.probs = take(nv * 4);
  l.iota = take(nv * 4);
  l.sorted_p = take(nv * 4);
  l.sorted_id = take(nv * 4);
  l.keep = take(nv);
  l.cut_m = take(static_cast<size_t>(n) * 4);
  l.cut_s = take(static_cast<size_t>(n) * 8);
  l.offsets = take(static_cast<size_t>(n + 1) * 4);
  size_t cub1 = 0, cub2 = 0;
  cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, cub1, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(nv),
      static_cast<int>(n), static_cast<const int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr));
  l.cub1 = take(cub1);
  l.cub1_bytes = cub1;
  if (typical) {
    l.dev_keys = take(nv * 8);
    l.dev_keys_sorted = take(nv * 8);
    l.ranks = take(nv * 4);
    l.ranks_sorted = take(nv * 4);
    cub::DeviceSegmentedRadixSort::SortPairs(
        nullptr, cub2, static_cast<const double*>(nullptr), static_cast<double*>(nullptr),
        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(nv),
        static_cast<int>(n), static_cast<const int32_t*>(nullptr),
        static_cast<const int32_t*>(nullptr));
    l.cub2 = take(cub2);
    l.cub2_bytes = cub2;
  }
  l.total = at;
  return l;
}

__global__ void offsets_kernel(int32_t* off, int64_t n, int64_t vocab) {
  pdl_enter();
  for (int64_t i = threadIdx.x + blockIdx.x * int64_t{blockDim.x}; i <= n;
       i += blockDim.x * int64_t{gridDim.x})
    off[i] = static_cast<int32_t>(i * vocab);
}

}  // namespace

size_t sample_workspace_bytes(int64_t n_rows, int64_t vocab, bool typical) {
  return layout(n_rows, vocab, typical).total;
}

void sample_rows(const SampleRowsArgs& a, void* workspace, cudaStream_t s) {
  if (a.n_rows == 0) return;
  const Layout l = layout(a.n_rows, a.vocab, a.typical);
  char* w = static_cast<char*>(workspace);
  float* x = reinterpret_cast<float*>(w + l.x);
  float* probs = reinterpret_cast<float*>(w + l.probs);
  int32_t* iota = reinterpret_cast<int32_t*>(w + l.iota);
  float* sorted_p = reinterpret_cast<float*>(w + l.sorted_p);
  int32_t* sorted_id = reinterpret_cast<int32_t*>(w + l.sorted_id);
  uint8_t* keep = reinterpret_cast<uint8_t*>(w + l.keep);
  int32_t* off = reinterpret_cast<int32_t*>(w + l.offsets);
  const unsigned n = static_cast<unsigned>(a.n_rows);
  const int nv = static_cast<int>(a.n_rows * a.vocab);
  pdl_launch(offsets_kernel, 1, 256, 0, s, off, a.n_rows, a.vocab);
  pdl_launch(sample_prepare_kernel, n, kThreads, 0, s, a.logits, a.vocab, a.params, a.seen_off,
             a.seen_ids, a.gen_off, a.gen_ids, a.gen_counts, x, probs, iota, a.out_ids);
  size_t cub1 = l.cub1_bytes;
  cub::DeviceSegmentedRadixSort::SortPairsDescending(w + l.cub1, cub1, probs, sorted_p, iota,
                                                     sorted_id, nv, static_cast<int>(n), off,
                                                     off + 1, 0, 32, s);
  int32_t* cut_m = reinterpret_cast<int32_t*>(w + l.cut_m);
  double* cut_s = reinterpret_cast<double*>(w + l.cut_s);
  pdl_launch(sample_cut_kernel, n, kThreads, 0, s, sorted_p, a.vocab, a.params, cut_m, cut_s);
  int32_t* ranks_sorted = nullptr;
  double* keys_sorted = nullptr;
  if (a.typical) {
    double* keys = reinterpret_cast<double*>(w + l.dev_keys);
    keys_sorted = reinterpret_cast<double*>(w + l.dev_keys_sorted);
    int32_t* ranks = reinterpret_cast<int32_t*>(w + l.ranks);
    ranks_sorted = reinterpret_cast<int32_t*>(w + l.ranks_sorted);
    pdl_launch(sample_typical_kernel, n, kThreads, 0, s, sorted_p, a.vocab, cut_m, cut_s, keys,
               ranks);
    size_t cub2 = l.cub2_bytes;
    cub::DeviceSegmentedRadixSort::SortPairs(w + l.cub2, cub2, keys, keys_sorted, ranks,
                                             ranks_sorted, nv, static_cast<int>(n), off, off + 1, 0,
                                             64, s);
  }
  pdl_launch(sample_draw_kernel, n, kThreads, 0, s, probs, sorted_p, sorted_id, ranks_sorted,
             keys_sorted, cut_m, cut_s, a.vocab, a.params, keep, a.out_ids, a.out_logprobs,
             a.alt_ids, a.alt_logprobs, a.max_top_n);
  if (a.keep_out != nullptr) {
    cudaMemcpyAsync(a.keep_out, keep, static_cast<size_t>(nv), cudaMemcpyDeviceToDevice, s);
  }
}

}  // namespace kestrel::cuda::kernels
