// ops::apply_token_bitmask on the CPU against the bits, and on CUDA (where a GPU is visible)
// against the CPU. Built into both backend test binaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "backend/ops.h"

namespace kestrel {
namespace {

Tensor random_logits(int64_t n, int64_t vocab, std::mt19937& rng) {
  Tensor t = Tensor::empty(DType::kF32, {n, vocab});
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// Random bitmasks over some rows of random logits; CUDA must equal the CPU exactly (both only
// write -inf).
TEST(Ops, TokenBitmask) {
  std::mt19937 rng(7);
  for (auto [n, vocab, masked] : {std::tuple<int64_t, int64_t, int64_t>{1, 7, 1},
                                  {9, 65024, 3},
                                  {64, 65024, 64},
                                  {5, 50001, 2}}) {
    const int64_t words = (vocab + 31) / 32 + (vocab % 5 == 0 ? 1 : 0);  // may be padded
    Tensor logits = random_logits(n, vocab, rng);
    std::vector<int32_t> rows, bits(masked * words);
    std::vector<int32_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    rows.assign(all.begin(), all.begin() + masked);
    for (int32_t& w : bits) w = static_cast<int32_t>(rng());
    Tensor want = ops::to_device(logits, Device::kCpu);
    ops::apply_token_bitmask(want, rows, bits, words);
    std::vector<bool> is_masked(n, false);
    for (int64_t i = 0; i < masked; ++i) is_masked[rows[i]] = true;
    for (int64_t r = 0; r < n; ++r) {
      int64_t i = std::find(rows.begin(), rows.end(), r) - rows.begin();
      for (int64_t j = 0; j < vocab; ++j) {
        const float got = want.data<float>()[r * vocab + j],
                    was = logits.data<float>()[r * vocab + j];
        const bool keep =
            !is_masked[r] || ((static_cast<uint32_t>(bits[i * words + j / 32]) >> (j % 32)) & 1u);
        ASSERT_EQ(got, keep ? was : -INFINITY) << "cpu " << n << "x" << vocab << " row " << r;
      }
    }
    if (ops::cuda_device_count() == 0) continue;  // the CPU check alone
    Tensor dev = ops::to_device(logits, Device::kCuda);
    ops::apply_token_bitmask(dev, rows, bits, words);
    const Tensor got = ops::to_host_f32(dev);
    ASSERT_EQ(std::memcmp(got.data<float>(), want.data<float>(), n * vocab * sizeof(float)), 0)
        << "cuda " << n << "x" << vocab;
  }
}

}  // namespace
}  // namespace kestrel
