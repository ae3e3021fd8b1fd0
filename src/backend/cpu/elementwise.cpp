// CPU random fills, embedding lookup, exact GELU, adds, row gathers, argmax and the greedy
// pick, the token bitmask (the GPU's cuda/elementwise.cu).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace kestrel::cpu {
namespace {

// Uniform in [0, 1) from (seed, i); the CUDA kernel computes the same function.
float hash_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

// The first index of the largest of p[0, n).
int64_t row_argmax(const float* p, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (p[i] > p[best]) best = i;
  return best;
}

}  // namespace

Tensor random_uniform(const Shape& shape, DType dtype, uint64_t seed, float amp, float constant) {
  Tensor out = Tensor::empty(dtype, shape);
  const int64_t n = out.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v =
        amp > 0 ? amp * (2.0f * hash_uniform(seed, static_cast<uint64_t>(i)) - 1.0f) : constant;
    if (dtype == DType::kF32) {
      out.data<float>()[i] = v;
    } else {
      out.data<uint16_t>()[i] = f32_to_bf16(v);
    }
  }
  return out;
}

void argmax_rows(const Tensor& logits, Tensor& out) {
  const int64_t vocab = logits.dim(1);
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    out.data<int32_t>()[r] =
        static_cast<int32_t>(row_argmax(logits.data<float>() + r * vocab, vocab));
  }
}

void greedy_rows(const Tensor& logits, Tensor& ids, Tensor& logprobs) {
  const int64_t vocab = logits.dim(1);
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    const float* p = logits.data<float>() + r * vocab;
    const int64_t best = row_argmax(p, vocab);
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(p[i] - p[best]));
    ids.data<int32_t>()[r] = static_cast<int32_t>(best);
    // The top token's probability is 1 / sum.
    logprobs.data<float>()[r] = static_cast<float>(std::max(-std::log(sum), std::log(1e-38)));
  }
}

void embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  const int64_t n_tokens = ids.dim(0), vocab = table.dim(0), hidden = table.dim(1);
  const int32_t* id = ids.data<int32_t>();
  for (int64_t t = 0; t < n_tokens; ++t) {
    KESTREL_CHECK(id[t] >= 0 && id[t] < vocab, "embedding: token id ", id[t],
                  " is outside the vocabulary [0, ", vocab, ")");
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n_tokens; ++t) {
    std::memcpy(out.data<float>() + t * hidden, table.data<float>() + id[t] * hidden,
                sizeof(float) * hidden);
  }
}

void gelu(Tensor& x) {
  const int64_t n = x.numel();
  float* p = x.data<float>();
  constexpr float kInvSqrt2 = 0.70710678118654752440f;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = 0.5f * p[i] * (1.0f + std::erf(p[i] * kInvSqrt2));
}

void add(const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out) {
  const int64_t n = a.numel();
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  const float* pc = c.defined() ? c.data<float>() : nullptr;
  float* po = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) po[i] = pc ? pa[i] + pb[i] + pc[i] : pa[i] + pb[i];
}

void apply_token_bitmask(Tensor& logits, const std::vector<int32_t>& rows,
                         const std::vector<int32_t>& bitmask, int64_t words) {
  const int64_t vocab = logits.dim(1);
  for (size_t i = 0; i < rows.size(); ++i) {
    float* row = logits.data<float>() + rows[i] * vocab;
    const int32_t* mask = bitmask.data() + static_cast<int64_t>(i) * words;
    for (int64_t j = 0; j < vocab; ++j) {
      if (((static_cast<uint32_t>(mask[j >> 5]) >> (j & 31)) & 1u) == 0) row[j] = -INFINITY;
    }
  }
}

void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) {
  const int64_t n = indices.dim(0), rows = x.dim(0);
  const size_t row_bytes = static_cast<size_t>(x.dim(1)) * dtype_size(x.dtype());
  const int32_t* idx = indices.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    KESTREL_CHECK(idx[i] >= 0 && idx[i] < rows, "gather_rows: index ", idx[i], " outside [0, ",
                  rows, ")");
    std::memcpy(static_cast<char*>(out.raw()) + i * row_bytes,
                static_cast<const char*>(x.raw()) + idx[i] * row_bytes, row_bytes);
  }
}

}  // namespace kestrel::cpu
