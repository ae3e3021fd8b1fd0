// FP8 weights on the CPU (the reference of the CUDA FP8 GEMM): ops::quantize_fp8's per-row scales
// and codes against the definition, ops::linear with an F8_E4M3 weight against a double sum over
// the dequantized values (with every epilogue, per-row and per-tensor scales, and activations
// rounded to FP8), and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"

namespace kestrel {
namespace {

Tensor random_f32(Shape shape, std::mt19937_64& rng, float amp = 1.0f) {
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  std::uniform_real_distribution<float> u(-amp, amp);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

TEST(CpuFp8, QuantizeRowsByTheirAmax) {
  std::mt19937_64 rng(3);
  Tensor w = random_f32({6, 37}, rng, 0.05f);
  for (int64_t i = 0; i < 37; ++i) w.data<float>()[2 * 37 + i] = 0.0f;  // a row of zeros
  w.data<float>()[4 * 37 + 5] = -9.0f;                                  // an outlier
  Tensor q, s;
  ops::quantize_fp8(w, q, s);
  ASSERT_EQ(q.dtype(), DType::kF8E4M3);
  ASSERT_EQ(q.shape(), w.shape());
  ASSERT_EQ(s.shape(), (Shape{6}));
  for (int64_t r = 0; r < 6; ++r) {
    float amax = 0.0f;
    for (int64_t i = 0; i < 37; ++i) amax = std::max(amax, std::fabs(w.data<float>()[r * 37 + i]));
    const float want = amax > 0 ? amax / 448.0f : 1.0f;
    EXPECT_EQ(s.data<float>()[r], want) << r;
    int at_max = 0;
    for (int64_t i = 0; i < 37; ++i) {
      const float v = w.data<float>()[r * 37 + i];
      const uint8_t code = q.data<uint8_t>()[r * 37 + i];
      EXPECT_EQ(code, f32_to_f8e4m3(v / want)) << r << "," << i;
      // Round to nearest: within half a quantum (1/16 relative for normals) of the value.
      const float back = f8e4m3_to_f32(code) * want;
      EXPECT_LE(std::fabs(back - v), std::max(std::fabs(v) / 16.0f, want * 0.001f)) << v;
      at_max += (code & 0x7f) == 0x7e;
    }
    EXPECT_GE(at_max, amax > 0 ? 1 : 0) << "the row's amax maps to 448";
  }
  EXPECT_EQ(f8e4m3_to_f32(q.data<uint8_t>()[4 * 37 + 5]) * s.data<float>()[4], -9.0f);
}

struct Case {
  bool gelu, accumulate, addend, per_tensor, round_x;
};

TEST(CpuFp8, LinearIsTheProductOfTheDequantizedWeights) {
  std::mt19937_64 rng(11);
  for (const auto& [T, in, n_out] : {std::array<int64_t, 3>{1, 19, 13}, {7, 64, 40}, {33, 8, 3}}) {
    for (const Case c :
         {Case{false, false, false, false, false}, Case{true, false, false, false, false},
          Case{false, true, true, false, false}, Case{true, true, false, true, false},
          Case{false, false, false, false, true}, Case{true, true, true, false, true}}) {
      Tensor x = random_f32({T, in}, rng), w = random_f32({n_out, in}, rng, 0.2f);
      Tensor b = random_f32({n_out}, rng), out = random_f32({T, n_out}, rng);
      Tensor add = random_f32({T, n_out}, rng);
      Tensor q, s;
      ops::quantize_fp8(w, q, s);
      if (c.per_tensor) {  // one scale for the tensor: the codes stay, their meaning changes
        Tensor one = Tensor::empty(DType::kF32, {1});
        one.data<float>()[0] = 0.01f;
        s = one;
      }
      const std::vector<float> start(out.data<float>(), out.data<float>() + out.numel());
      ops::linear(x, q, b, out,
                  {.gelu = c.gelu,
                   .accumulate = c.accumulate,
                   .addend = c.addend ? &add : nullptr,
                   .weight_scale = &s,
                   .fp8_activations = c.round_x});
      double worst = 0, mag = 0;
      for (int64_t t = 0; t < T; ++t) {
        float xs = 1.0f;  // the row's activation scale when rounded
        if (c.round_x) {
          float amax = 0;
          for (int64_t i = 0; i < in; ++i)
            amax = std::max(amax, std::fabs(x.data<float>()[t * in + i]));
          xs = amax / 448.0f;
        }
        for (int64_t o = 0; o < n_out; ++o) {
          const float so = s.data<float>()[c.per_tensor ? 0 : o];
          double y = b.data<float>()[o];
          for (int64_t i = 0; i < in; ++i) {
            double xv = x.data<float>()[t * in + i];
            if (c.round_x) xv = f8e4m3_to_f32(f32_to_f8e4m3(static_cast<float>(xv) / xs)) * xs;
            y += xv * (double{f8e4m3_to_f32(q.data<uint8_t>()[o * in + i])} * so);
          }
          if (c.gelu) y = 0.5 * y * (1.0 + std::erf(y / std::sqrt(2.0)));
          if (c.addend) y += add.data<float>()[t * n_out + o];
          if (c.accumulate) y += start[t * n_out + o];
          worst = std::max(worst, std::fabs(y - out.data<float>()[t * n_out + o]));
          mag = std::max(mag, std::fabs(y));
        }
      }
      EXPECT_LE(worst / mag, 1e-5) << T << "x" << in << "x" << n_out << " gelu " << c.gelu;
    }
  }
}

TEST(CpuFp8, RefusesMismatchedWeightsAndScales) {
  std::mt19937_64 rng(5);
  Tensor x = random_f32({2, 8}, rng), w = random_f32({4, 8}, rng), out = random_f32({2, 4}, rng);
  Tensor q, s;
  ops::quantize_fp8(w, q, s);
  EXPECT_THROW(ops::linear(x, q, Tensor(), out), Error);  // FP8 without scales
  Tensor wrong = Tensor::empty(DType::kF32, {3});
  EXPECT_THROW(ops::linear(x, q, Tensor(), out, {.weight_scale = &wrong}), Error);
  EXPECT_THROW(ops::linear(x, w, Tensor(), out, {.weight_scale = &s}), Error);  // F32 weight
  EXPECT_THROW(ops::linear(x, w, Tensor(), out, {.fp8_activations = true}), Error);
  EXPECT_THROW(ops::quantize_fp8(q, q, s), Error);  // already FP8
}

}  // namespace
}  // namespace kestrel
