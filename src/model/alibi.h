// ALiBi slopes of the RefinedWeb models (falcon-rw-1b / -7b), as transformers'
// build_alibi_tensor computes them: for n heads, the nearest lower power of two
// p gives slopes base^1 .. base^p with base = 2^(-8 / p); the heads beyond p take
// the odd powers 1, 3, 5, ... of the next power's base, 2^(-4 / p).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.h"

namespace kestrel {

// Slopes of heads [first_head, first_head + n_heads) of a model with
// total_heads query heads (tensor parallelism: a rank passes its own range),
// in float32 as transformers holds them (base rounded to float32, then its
// integer powers). The attention op rounds them to bfloat16 (backend/ops.h).
inline std::vector<float> alibi_slopes(int64_t total_heads, int64_t first_head, int64_t n_heads) {
  KESTREL_CHECK(
      total_heads >= 1 && first_head >= 0 && n_heads >= 0 && first_head + n_heads <= total_heads,
      "alibi_slopes: heads [", first_head, ", ", first_head + n_heads, ") of ", total_heads);
  int64_t p = 1;
  while (p * 2 <= total_heads) p *= 2;
  const float base = static_cast<float>(std::pow(2.0, -8.0 / static_cast<double>(p)));
  const float extra_base = static_cast<float>(std::pow(2.0, -4.0 / static_cast<double>(p)));
  std::vector<float> out;
  out.reserve(static_cast<size_t>(n_heads));
  for (int64_t h = first_head; h < first_head + n_heads; ++h) {
    const double power = h < p ? static_cast<double>(h + 1) : static_cast<double>(2 * (h - p) + 1);
    out.push_back(
        static_cast<float>(std::pow(static_cast<double>(h < p ? base : extra_base), power)));
  }
  return out;
}

}  // namespace kestrel
