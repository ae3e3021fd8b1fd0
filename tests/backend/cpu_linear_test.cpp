// ops::linear's epilogues on the CPU (the reference of the CUDA linear) against a direct
// double-precision sum: GELU, accumulate, the addend of the 3-way residual add, a second
// product summed before the epilogue, and their checks.
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

// out += x @ w^T + b + x2 @ w2^T + b2 (parallel attention's fc2 and dense in one linear).
TEST(CpuLinear, SecondProductSumsBeforeTheResidualAdd) {
  std::mt19937_64 rng(17);
  const int64_t T = 4, in = 23, in2 = 9, n_out = 11;
  for (const bool biases : {false, true}) {
    Tensor x = random_f32({T, in}, rng), w = random_f32({n_out, in}, rng);
    Tensor x2 = random_f32({T, in2}, rng), w2 = random_f32({n_out, in2}, rng);
    Tensor b = biases ? random_f32({n_out}, rng) : Tensor();
    Tensor b2 = biases ? random_f32({n_out}, rng) : Tensor();
    Tensor out = random_f32({T, n_out}, rng);
    const std::vector<float> start = values(out);
    ops::linear(x, w, b, out, {.accumulate = true, .plus = {&x2, &w2, &b2}});
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t o = 0; o < n_out; ++o) {
        double y = start[t * n_out + o];
        if (biases) y += double{b.data<float>()[o]} + b2.data<float>()[o];
        for (int64_t i = 0; i < in; ++i)
          y += double{x.data<float>()[t * in + i]} * w.data<float>()[o * in + i];
        for (int64_t i = 0; i < in2; ++i)
          y += double{x2.data<float>()[t * in2 + i]} * w2.data<float>()[o * in2 + i];
        EXPECT_NEAR(out.data<float>()[t * n_out + o], y, 1e-4)
            << "biases " << biases << " at " << t << "," << o;
      }
    }
  }
}

// linear_pair is the two linears (the second with GELU where asked).
TEST(CpuLinear, PairIsTwoLinears) {
  std::mt19937_64 rng(23);
  Tensor x = random_f32({3, 10}, rng), w1 = random_f32({7, 10}, rng), w2 = random_f32({5, 10}, rng);
  Tensor b1 = random_f32({7}, rng), b2 = random_f32({5}, rng);
  for (const bool gelu : {false, true}) {
    Tensor o1 = random_f32({3, 7}, rng), o2 = random_f32({3, 5}, rng);
    Tensor r1 = random_f32({3, 7}, rng), r2 = random_f32({3, 5}, rng);
    ops::linear_pair(x, w1, b1, o1, w2, b2, o2, gelu);
    ops::linear(x, w1, b1, r1);
    ops::linear(x, w2, b2, r2, {.gelu = gelu});
    EXPECT_EQ(values(o1), values(r1));
    EXPECT_EQ(values(o2), values(r2));
  }
  Tensor wrong = random_f32({3, 6}, rng), o1 = random_f32({3, 7}, rng);
  EXPECT_THROW(ops::linear_pair(x, w1, b1, o1, w2, b2, wrong, true), Error);
  Tensor w1b = random_f32({7, 10}, rng);
  EXPECT_THROW(ops::linear_pair(x, w1, b1, o1, w1b, b1, o1, true), Error);  // one out for both
}

// With a PairNorm, linear_pair is the LayerNorm (written to its out) and then the pair on it.
TEST(CpuLinear, PairWithNormIsLayerNormThenPair) {
  std::mt19937_64 rng(29);
  Tensor x = random_f32({3, 10}, rng), w1 = random_f32({7, 10}, rng), w2 = random_f32({5, 10}, rng);
  Tensor b1 = random_f32({7}, rng), b2 = random_f32({5}, rng);
  Tensor g = random_f32({10}, rng), beta = random_f32({10}, rng);
  Tensor ln = random_f32({3, 10}, rng), ref_ln = random_f32({3, 10}, rng);
  Tensor o1 = random_f32({3, 7}, rng), o2 = random_f32({3, 5}, rng);
  Tensor r1 = random_f32({3, 7}, rng), r2 = random_f32({3, 5}, rng);
  ops::linear_pair(x, w1, b1, o1, w2, b2, o2, true, {&g, &beta, 1e-5f, &ln});
  ops::layer_norm(x, g, beta, 1e-5f, ref_ln);
  ops::linear_pair(ref_ln, w1, b1, r1, w2, b2, r2, true);
  EXPECT_EQ(values(ln), values(ref_ln));
  EXPECT_EQ(values(o1), values(r1));
  EXPECT_EQ(values(o2), values(r2));
  // The norm's out must be x's shape and apart from x and the outs; its weights hidden long.
  Tensor short_ln = random_f32({3, 9}, rng), short_g = random_f32({9}, rng);
  EXPECT_THROW(ops::linear_pair(x, w1, b1, o1, w2, b2, o2, true, {&g, &beta, 1e-5f, &short_ln}),
               Error);
  EXPECT_THROW(ops::linear_pair(x, w1, b1, o1, w2, b2, o2, true, {&g, &beta, 1e-5f, &x}), Error);
  EXPECT_THROW(ops::linear_pair(x, w1, b1, o1, w2, b2, o2, true, {&g, &beta, 1e-5f, &o1}), Error);
  EXPECT_THROW(ops::linear_pair(x, w1, b1, o1, w2, b2, o2, true, {&short_g, &beta, 1e-5f, &ln}),
               Error);
  EXPECT_THROW(ops::linear_pair(x, w1, b1, o1, w2, b2, o2, true, {&g, nullptr, 1e-5f, &ln}), Error);
}

TEST(CpuLinear, SecondProductNeedsAccumulateAndMatchingShapes) {
  std::mt19937_64 rng(5);
  Tensor x = random_f32({2, 4}, rng), w = random_f32({3, 4}, rng), out = random_f32({2, 3}, rng);
  Tensor x2 = random_f32({2, 6}, rng), w2 = random_f32({3, 6}, rng);
  EXPECT_THROW(ops::linear(x, w, Tensor(), out, {.plus = {&x2, &w2}}), Error);  // no accumulate
  EXPECT_THROW(
      ops::linear(x, w, Tensor(), out, {.gelu = true, .accumulate = true, .plus = {&x2, &w2}}),
      Error);
  Tensor add = random_f32({2, 3}, rng);
  EXPECT_THROW(
      ops::linear(x, w, Tensor(), out, {.accumulate = true, .addend = &add, .plus = {&x2, &w2}}),
      Error);
  Tensor w2_rows = random_f32({4, 6}, rng), x2_rows = random_f32({3, 6}, rng);
  EXPECT_THROW(ops::linear(x, w, Tensor(), out, {.accumulate = true, .plus = {&x2, &w2_rows}}),
               Error);  // other outputs
  EXPECT_THROW(ops::linear(x, w, Tensor(), out, {.accumulate = true, .plus = {&x2_rows, &w2}}),
               Error);  // other rows
  EXPECT_THROW(ops::linear(x, w, Tensor(), out, {.accumulate = true, .plus = {&x2, &w}}),
               Error);  // k of x2 and w2 differ
  EXPECT_THROW(ops::linear(x, w, Tensor(), out, {.accumulate = true, .plus = {&x2}}), Error);
  Tensor b_wrong = random_f32({2}, rng);
  EXPECT_THROW(ops::linear(x, w, Tensor(), out, {.accumulate = true, .plus = {&x2, &w2, &b_wrong}}),
               Error);
}

}  // namespace
}  // namespace kestrel
