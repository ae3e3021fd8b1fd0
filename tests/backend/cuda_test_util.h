// What the CUDA op tests share: the skip without a GPU, one random engine, bf16-rounded random
// host tensors, uploads and the normalised error (llama.cpp's test-backend-ops habit: inputs drawn
// in F32 and rounded to bf16 so that both backends see the same values).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>

#include "backend/ops.h"

#define REQUIRE_GPU()                                                            \
  do {                                                                           \
    if (ops::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible"; \
  } while (0)

namespace kestrel::test {

inline std::mt19937_64& rng() {
  static std::mt19937_64 r(std::random_device{}());
  return r;
}

// A host F32 tensor of uniform values in [lo, hi), rounded to bf16.
inline Tensor random_host(Shape shape, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = bf16_to_f32(f32_to_bf16(u(rng())));
  return t;
}

// host (F32) on the GPU as dtype.
inline Tensor to_gpu(const Tensor& host, DType dtype) {
  return ops::upload_weight(host.raw(), DType::kF32, host.shape(), dtype, Device::kCuda);
}

inline Tensor to_gpu_bf16(const Tensor& host) {
  return to_gpu(host, DType::kBF16);
}

// ||got - ref|| / ||ref||; NaN anywhere in got gives infinity.
inline double norm_error(const Tensor& got_host, const Tensor& ref) {
  EXPECT_EQ(got_host.numel(), ref.numel());
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double g = got_host.data<float>()[i], r = ref.data<float>()[i];
    if (!std::isfinite(g)) return INFINITY;
    num += (g - r) * (g - r);
    den += r * r;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace kestrel::test
