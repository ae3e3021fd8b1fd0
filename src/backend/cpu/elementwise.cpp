// CPU embedding lookup, exact GELU, adds and row gathers.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace kestrel::cpu {

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
