// CPU attention over the paged KV cache: every (new token, head) pair scores
// its causal context block by block, softmax in fp32, then the weighted sum of
// values. One code path for prefill, decode, chunked prefill and cached prefixes.
// ALiBi adds bf16(bf16(slope) * bf16(key position)) to q.k before the scale.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/dtype.h"
#include "core/error.h"

namespace kestrel::cpu {
namespace {

inline float round_bf16(float x) {
  return bf16_to_f32(f32_to_bf16(x));
}

}  // namespace

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& block_tables, const Tensor& cu_q, const Tensor& kv_lens,
                     int32_t max_kv_len, float scale, Tensor& out, const Tensor& alibi_slopes) {
  const int64_t n_heads = q.dim(1), head_dim = q.dim(2);
  const int64_t num_blocks = k_cache.dim(0), block_size = k_cache.dim(1);
  const int64_t n_kv_heads = k_cache.dim(2), group = n_heads / n_kv_heads;
  const int64_t n_seqs = kv_lens.dim(0), max_blocks = block_tables.dim(1);
  const int32_t* cu = cu_q.data<int32_t>();
  const int32_t* lens = kv_lens.data<int32_t>();
  const int32_t* tables = block_tables.data<int32_t>();
  const float* slopes = alibi_slopes.defined() ? alibi_slopes.data<float>() : nullptr;

  // Validate the layout once, so that the parallel loop cannot read out of bounds.
  std::vector<int64_t> work_begin(n_seqs + 1, 0);  // prefix sum of (q_len * n_heads)
  for (int64_t b = 0; b < n_seqs; ++b) {
    const int64_t q_len = cu[b + 1] - cu[b];
    KESTREL_CHECK(q_len >= 0 && cu[b] >= 0 && cu[b + 1] <= q.dim(0), "paged_attention: sequence ",
                  b, " has rows [", cu[b], ", ", cu[b + 1], ") of ", q.dim(0));
    KESTREL_CHECK(lens[b] >= q_len && lens[b] <= max_kv_len, "paged_attention: sequence ", b,
                  " has ", q_len, " new tokens but kv_len ", lens[b], " (max ", max_kv_len, ")");
    const int64_t used = (lens[b] + block_size - 1) / block_size;
    KESTREL_CHECK(used <= max_blocks, "paged_attention: sequence ", b, " needs ", used,
                  " blocks, table has ", max_blocks);
    for (int64_t i = 0; i < used; ++i) {
      const int32_t blk = tables[b * max_blocks + i];
      KESTREL_CHECK(blk >= 0 && blk < num_blocks, "paged_attention: sequence ", b, " block ", blk,
                    " outside the cache's ", num_blocks);
    }
    work_begin[b + 1] = work_begin[b] + q_len * n_heads;
  }
  const int64_t total = work_begin[n_seqs];
  const int64_t kv_row = n_kv_heads * head_dim;

  // An FP8 cache (E4M3, scale 1) is read through a row of F32 per position.
  const bool fp8 = k_cache.dtype() == DType::kF8E4M3;
#pragma omp parallel
  {
    std::vector<float> scores(std::max<int32_t>(max_kv_len, 1));
    std::vector<float> acc(head_dim), wide(fp8 ? head_dim : 0);
    auto row_of = [&](const Tensor& cache, int64_t slot, int64_t kvh) -> const float* {
      const int64_t at = slot * kv_row + kvh * head_dim;
      if (!fp8) return cache.data<float>() + at;
      convert_to_f32(cache.data<uint8_t>() + at, DType::kF8E4M3, static_cast<size_t>(head_dim),
                     wide.data());
      return wide.data();
    };
#pragma omp for schedule(dynamic, 4)
    for (int64_t w = 0; w < total; ++w) {
      const int64_t b =
          std::upper_bound(work_begin.begin(), work_begin.end(), w) - work_begin.begin() - 1;
      const int64_t local = w - work_begin[b];
      const int64_t j = local / n_heads, h = local % n_heads, kvh = h / group;
      const int64_t q_len = cu[b + 1] - cu[b];
      const int64_t ctx = lens[b] - q_len + j + 1;  // causal context of new token j
      const int64_t row = cu[b] + j;
      const float* qv = q.data<float>() + (row * n_heads + h) * head_dim;
      const int32_t* table = tables + b * max_blocks;
      const float slope = slopes ? round_bf16(slopes[h]) : 0.0f;

      float max_score = -INFINITY;
      for (int64_t p = 0; p < ctx; ++p) {
        const int64_t slot =
            static_cast<int64_t>(table[p / block_size]) * block_size + p % block_size;
        const float* kv = row_of(k_cache, slot, kvh);
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < head_dim; ++i) dot += qv[i] * kv[i];
        if (slopes) dot += round_bf16(slope * round_bf16(static_cast<float>(p)));
        scores[p] = dot * scale;
        max_score = std::max(max_score, scores[p]);
      }
      float denom = 0.0f;
      for (int64_t p = 0; p < ctx; ++p) {
        scores[p] = std::exp(scores[p] - max_score);
        denom += scores[p];
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t p = 0; p < ctx; ++p) {
        const int64_t slot =
            static_cast<int64_t>(table[p / block_size]) * block_size + p % block_size;
        const float* vv = row_of(v_cache, slot, kvh);
        const float wgt = scores[p];
#pragma omp simd
        for (int64_t i = 0; i < head_dim; ++i) acc[i] += wgt * vv[i];
      }
      float* o = out.data<float>() + (row * n_heads + h) * head_dim;
      const float inv = 1.0f / denom;
      for (int64_t i = 0; i < head_dim; ++i) o[i] = acc[i] * inv;
    }
  }
}

}  // namespace kestrel::cpu
