// ops::linear's epilogues on the CPU (the reference of the CUDA linear) against a direct
// double-precision sum: GELU, accumulate, the addend of the 3-way residual add, and the
// addend's checks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"

namespace kestrel {
namespace {

Tensor random_f32(Shape shape, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

std::vector<float> values(const Tensor& t) {
  return {t.data<float>(), t.data<float>() + t.numel()};
}

struct Case {
  bool gelu, accumulate, addend;
};

TEST(CpuLinear, EpiloguesMatchDirectSum) {
  std::mt19937_64 rng(11);
  const int64_t T = 5, in = 19, n_out = 13;
  for (const Case c :
       {Case{false, false, false}, Case{true, false, false}, Case{false, true, false},
        Case{true, true, false}, Case{false, true, true}, Case{true, true, true}}) {
    Tensor x = random_f32({T, in}, rng), w = random_f32({n_out, in}, rng);
    Tensor b = random_f32({n_out}, rng), out = random_f32({T, n_out}, rng);
    Tensor add = random_f32({T, n_out}, rng);
    const std::vector<float> start = values(out), addv = values(add);
    ops::linear(x, w, b, out,
                {.gelu = c.gelu, .accumulate = c.accumulate, .addend = c.addend ? &add : nullptr});
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t o = 0; o < n_out; ++o) {
        double y = b.data<float>()[o];
        for (int64_t i = 0; i < in; ++i)
          y += double{x.data<float>()[t * in + i]} * w.data<float>()[o * in + i];
        if (c.gelu) y = 0.5 * y * (1.0 + std::erf(y / std::sqrt(2.0)));
        if (c.addend) y += addv[t * n_out + o];
        if (c.accumulate) y += start[t * n_out + o];
        EXPECT_NEAR(out.data<float>()[t * n_out + o], y, 1e-4)
            << "gelu " << c.gelu << " accumulate " << c.accumulate << " addend " << c.addend
            << " at " << t << "," << o;
      }
    }
  }
}

TEST(CpuLinear, AddendNeedsAccumulateAndMustBeApartAndShaped) {
  std::mt19937_64 rng(3);
  Tensor x = random_f32({2, 4}, rng), w = random_f32({3, 4}, rng), out = random_f32({2, 3}, rng);
  EXPECT_THROW(ops::linear(x, w, Tensor(), out, {.accumulate = true, .addend = &out}), Error);
  Tensor wrong = random_f32({3, 2}, rng);
  EXPECT_THROW(ops::linear(x, w, Tensor(), out, {.accumulate = true, .addend = &wrong}), Error);
  Tensor add = random_f32({2, 3}, rng);
  EXPECT_THROW(ops::linear(x, w, Tensor(), out, {.addend = &add}), Error);  // needs accumulate
}

}  // namespace
}  // namespace kestrel
