// ops::lora_add on the CPU against a direct double-precision sum, and its input checks.
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

TEST(LoraAdd, SegmentsWithDifferentRanksMatchDirectSum) {
  std::mt19937_64 rng(7);
  const int64_t T = 11, in = 37, out_dim = 29;
  Tensor x = random_f32({T, in}, rng);
  Tensor out = random_f32({T, out_dim}, rng);
  std::vector<float> base(out.data<float>(), out.data<float>() + out.numel());
  Tensor a1 = random_f32({4, in}, rng), b1 = random_f32({out_dim, 4}, rng);
  Tensor a2 = random_f32({1, in}, rng), b2 = random_f32({out_dim, 1}, rng);
  // rows 0-1 untouched, 2-6 adapter 1, 7 untouched, 8-10 adapter 2
  std::vector<ops::LoraSegment> segs = {{2, 7, &a1, &b1, 0.5f}, {8, 11, &a2, &b2, 2.0f}};
  ops::lora_add(x, segs, out);
  for (int64_t t = 0; t < T; ++t) {
    const ops::LoraSegment* g = nullptr;
    for (const auto& s : segs)
      if (t >= s.begin && t < s.end) g = &s;
    for (int64_t o = 0; o < out_dim; ++o) {
      double want = base[t * out_dim + o];
      if (g) {
        const int64_t r = g->a->dim(0);
        for (int64_t j = 0; j < r; ++j) {
          double shrink = 0;
          for (int64_t k = 0; k < in; ++k)
            shrink += double(x.data<float>()[t * in + k]) * g->a->data<float>()[j * in + k];
          want += g->scale * shrink * g->b->data<float>()[o * r + j];
        }
      }
      EXPECT_NEAR(out.data<float>()[t * out_dim + o], want, 1e-4) << "row " << t << " col " << o;
    }
  }
}

TEST(LoraAdd, RejectsOverlapAndWrongShapes) {
  std::mt19937_64 rng(8);
  Tensor x = random_f32({6, 8}, rng), out = random_f32({6, 5}, rng);
  Tensor a = random_f32({2, 8}, rng), b = random_f32({5, 2}, rng);
  Tensor bad_b = random_f32({4, 2}, rng);
  std::vector<ops::LoraSegment> overlap = {{0, 4, &a, &b, 1.0f}, {3, 6, &a, &b, 1.0f}};
  EXPECT_THROW(ops::lora_add(x, overlap, out), Error);
  std::vector<ops::LoraSegment> beyond = {{0, 7, &a, &b, 1.0f}};
  EXPECT_THROW(ops::lora_add(x, beyond, out), Error);
  std::vector<ops::LoraSegment> shape = {{0, 6, &a, &bad_b, 1.0f}};
  try {
    ops::lora_add(x, shape, out);
    FAIL() << "no error for b [4, 2] against out [6, 5]";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 2]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kestrel
