// ALiBi (falcon-rw): the slopes against values written out by hand from
// transformers' build_alibi_tensor, the CPU attention op's bias against a plain
// float64 reading of it, and the rw-alibi-mha fixture (12 heads: not a power of
// two) however the work is cut: block sizes, chunked prefill, a reused prefix.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "backend/ops.h"
#include "core/dtype.h"
#include "fixture_util.h"
#include "model/alibi.h"
#include "model/falcon_model.h"
#include "model/runner.h"

namespace kestrel {
namespace {

using test::Expected;
using test::fixture_dir;
using test::rel_error;

constexpr double kTolerance = 1e-4;
constexpr int64_t kGreedySteps = 12;
const char* const kFixture = "rw-alibi-mha";

void expect_slopes(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t h = 0; h < want.size(); ++h)
    EXPECT_NEAR(got[h], want[h], 1e-6 * want[h]) << "head " << h;
}

TEST(AlibiSlopes, TwelveHeadsTakeOddPowersOfTheNextBase) {
  // 8 = the nearest lower power of two: 2^-1 .. 2^-8; then 16's base 2^-0.5
  // to the powers 1, 3, 5, 7.
  expect_slopes(alibi_slopes(12, 0, 12), {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125,
                                          0.00390625, 0.70710678118654752, 0.35355339059327376,
                                          0.17677669529663688, 0.088388347648318441});
  // 6 heads: 4's base 2^-2 to 1..4, then 8's base 2^-1 to 1 and 3.
  expect_slopes(alibi_slopes(6, 0, 6), {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125});
}

TEST(AlibiSlopes, PowersOfTwo) {
  expect_slopes(alibi_slopes(8, 0, 8),
                {0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625});
  // falcon-rw-1b's 32 heads: 2^(-h/4); falcon-rw-7b's 64: 2^(-h/8).
  const std::vector<float> s32 = alibi_slopes(32, 0, 32);
  EXPECT_NEAR(s32[0], 0.84089641525371454, 1e-7);
  EXPECT_NEAR(s32[31], 0.00390625, 1e-6 * 0.00390625);  // float32 base^32, as torch
  const std::vector<float> s64 = alibi_slopes(64, 0, 64);
  EXPECT_NEAR(s64[0], 0.91700404320467123, 1e-7);
  EXPECT_NEAR(s64[63], 0.00390625, 1e-6 * 0.00390625);
  expect_slopes(alibi_slopes(1, 0, 1), {0.00390625});
}

// Tensor parallelism: a rank's range is the slice of the whole vector.
TEST(AlibiSlopes, RankRangesAreSlicesOfTheWhole) {
  const std::vector<float> all = alibi_slopes(12, 0, 12);
  for (int ranks : {2, 3, 5}) {
    std::vector<float> joined;
    int64_t first = 0;
    for (int r = 0; r < ranks; ++r) {
      const int64_t n = 12 / ranks + (r < 12 % ranks ? 1 : 0);
      const std::vector<float> part = alibi_slopes(12, first, n);
      joined.insert(joined.end(), part.begin(), part.end());
      first += n;
    }
    EXPECT_EQ(joined, all) << ranks << " ranks";
  }
  EXPECT_THROW(alibi_slopes(12, 8, 5), Error);
  EXPECT_THROW(alibi_slopes(0, 0, 0), Error);
}

double bf16_round(double x) {
  return bf16_to_f32(f32_to_bf16(static_cast<float>(x)));
}

// The CPU op against float64 attention with the bias of build_alibi_tensor:
// bf16(slope) * bf16(position), rounded to bf16 (positions past 256 round too).
TEST(AlibiAttention, CpuOpMatchesFloat64Reference) {
  const int64_t n_heads = 6, d = 32, bs = 16;
  const std::vector<std::pair<int32_t, int32_t>> seqs = {{1, 600}, {40, 300}, {5, 5}};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int64_t n_tokens = 0, max_blocks = 0;
  int32_t max_kv = 0;
  for (auto [ql, kl] : seqs) {
    n_tokens += ql;
    max_blocks = std::max<int64_t>(max_blocks, (kl + bs - 1) / bs);
    max_kv = std::max(max_kv, kl);
  }
  const int64_t n_seqs = static_cast<int64_t>(seqs.size()), num_blocks = n_seqs * max_blocks;
  Tensor kc = Tensor::empty(DType::kF32, {num_blocks, bs, n_heads, d});
  Tensor vc = Tensor::empty(DType::kF32, {num_blocks, bs, n_heads, d});
  Tensor q = Tensor::empty(DType::kF32, {n_tokens, n_heads, d});
  for (Tensor* t : {&kc, &vc, &q})
    for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = u(rng);
  // Sequence s owns blocks s, s + n_seqs, s + 2 n_seqs, ... (interleaved pages).
  Tensor tables = Tensor::empty(DType::kI32, {n_seqs, max_blocks});
  Tensor cu = Tensor::empty(DType::kI32, {n_seqs + 1});
  Tensor lens = Tensor::empty(DType::kI32, {n_seqs});
  cu.data<int32_t>()[0] = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    for (int64_t i = 0; i < max_blocks; ++i)
      tables.data<int32_t>()[s * max_blocks + i] = static_cast<int32_t>(s + i * n_seqs);
    cu.data<int32_t>()[s + 1] = cu.data<int32_t>()[s] + seqs[s].first;
    lens.data<int32_t>()[s] = seqs[s].second;
  }
  const std::vector<float> slopes_v = alibi_slopes(n_heads, 0, n_heads);
  Tensor slopes = Tensor::empty(DType::kF32, {n_heads});
  std::copy(slopes_v.begin(), slopes_v.end(), slopes.data<float>());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  Tensor out = Tensor::empty(DType::kF32, q.shape());
  ops::paged_attention(q, kc, vc, tables, cu, lens, max_kv, scale, out, 0, slopes);
  Tensor plain = Tensor::empty(DType::kF32, q.shape());
  ops::paged_attention(q, kc, vc, tables, cu, lens, max_kv, scale, plain);

  double worst = 0.0, moved = 0.0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const auto [ql, kl] = seqs[s];
    for (int64_t j = 0; j < ql; ++j) {
      const int64_t row = cu.data<int32_t>()[s] + j, ctx = kl - ql + j + 1;
      for (int64_t h = 0; h < n_heads; ++h) {
        const float* qv = q.data<float>() + (row * n_heads + h) * d;
        std::vector<double> sc(ctx);
        double mx = -INFINITY;
        for (int64_t p = 0; p < ctx; ++p) {
          const int64_t slot = tables.data<int32_t>()[s * max_blocks + p / bs] * bs + p % bs;
          const float* kv = kc.data<float>() + (slot * n_heads + h) * d;
          double dot = 0.0;
          for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(qv[i]) * kv[i];
          const double bias = bf16_round(bf16_round(slopes_v[h]) * bf16_round(p));
          sc[p] = (dot + bias) * scale;
          mx = std::max(mx, sc[p]);
        }
        double denom = 0.0;
        for (double& x : sc) denom += (x = std::exp(x - mx));
        for (int64_t i = 0; i < d; ++i) {
          double o = 0.0;
          for (int64_t p = 0; p < ctx; ++p) {
            const int64_t slot = tables.data<int32_t>()[s * max_blocks + p / bs] * bs + p % bs;
            o += sc[p] * vc.data<float>()[(slot * n_heads + h) * d + i];
          }
          const int64_t at = (row * n_heads + h) * d + i;
          worst = std::max(worst, std::abs(o / denom - out.data<float>()[at]));
          moved = std::max(moved, std::abs(static_cast<double>(plain.data<float>()[at]) -
                                           out.data<float>()[at]));
        }
      }
    }
  }
  EXPECT_LE(worst, 1e-5);
  EXPECT_GT(moved, 0.1);  // the bias matters at these lengths
}

class AlibiFixture : public ::testing::Test {
 protected:
  AlibiFixture() : model_(FalconModel::load(fixture_dir(kFixture))), exp_(kFixture) {}
  double prompt_error(const RunnerOptions& options) {
    BatchRunner runner(model_, exp_.prompts, 0, options);
    Tensor logits = runner.prefill(/*all_logits=*/true);
    return rel_error(logits.data<float>(), exp_.f32("logits"), logits.numel());
  }
  std::vector<int32_t> want_greedy(size_t p) const {
    return {exp_.i64("greedy_ids") + p * kGreedySteps,
            exp_.i64("greedy_ids") + (p + 1) * kGreedySteps};
  }
  FalconModel model_;
  Expected exp_;
};

TEST_F(AlibiFixture, LogitsMatchAtEveryBlockSizeAndChunking) {
  int64_t longest = 0;
  for (const auto& p : exp_.prompts) longest = std::max<int64_t>(longest, p.size());
  ASSERT_EQ(longest, 75);
  for (RunnerOptions o :
       {RunnerOptions{16, 0}, RunnerOptions{1, 0}, RunnerOptions{16, 38}, RunnerOptions{16, 25},
        RunnerOptions{1, 38}, RunnerOptions{1, 25}, RunnerOptions{16, 7}}) {
    const double err = prompt_error(o);
    EXPECT_LE(err, kTolerance) << "block size " << o.block_size << ", chunk " << o.prefill_chunk;
    std::printf("block size %lld, chunk %lld: logits error %.3g\n",
                static_cast<long long>(o.block_size), static_cast<long long>(o.prefill_chunk), err);
  }
}

TEST_F(AlibiFixture, GreedyIdsMatchAtBlockSizes1And16Chunked) {
  for (RunnerOptions o :
       {RunnerOptions{1, 0}, RunnerOptions{16, 0}, RunnerOptions{16, 25}, RunnerOptions{1, 38}}) {
    const auto out = greedy_generate(model_, exp_.prompts, kGreedySteps, o, false);
    for (size_t p = 0; p < exp_.prompts.size(); ++p)
      EXPECT_EQ(out[p], want_greedy(p))
          << "prompt " << p << ", block size " << o.block_size << ", chunk " << o.prefill_chunk;
  }
}

// Slopes for a power-of-two head count (2^(-8h/12), the paper's formula
// applied to 12 heads) instead of build_alibi_tensor's: the logits miss.
TEST_F(AlibiFixture, PowerOfTwoSlopesMissTheFixture) {
  std::vector<float> wrong(12);
  for (int h = 0; h < 12; ++h) wrong[h] = static_cast<float>(std::pow(2.0, -8.0 * (h + 1) / 12));
  model_.set_alibi_slopes(wrong);
  const double err = prompt_error({16, 0});
  EXPECT_GT(err, 100 * kTolerance);
  std::printf("power-of-two slopes for 12 heads: logits error %.3g\n", err);
  // And without the last four (odd-power) slopes only: still a miss.
  std::vector<float> first8 = alibi_slopes(12, 0, 12);
  for (int h = 8; h < 12; ++h) first8[h] = static_cast<float>(std::pow(2.0, -(h + 1)));
  model_.set_alibi_slopes(first8);
  EXPECT_GT(prompt_error({16, 0}), 100 * kTolerance);
  model_.set_alibi_slopes(alibi_slopes(12, 0, 12));
  EXPECT_LE(prompt_error({16, 0}), kTolerance);
}

// A sequence that reuses another's first three 16-token blocks (a cached
// prefix) prefills only its tail, then decodes over the shared pages: the bias
// of every key comes from its absolute position.
TEST_F(AlibiFixture, ReusedPrefixThenDecode) {
  const int64_t vocab = model_.config().vocab_size, bs = 16, prefix = 48;
  const std::vector<int32_t>& prompt = exp_.prompts[2];
  const int64_t row0 = static_cast<int64_t>(exp_.prompts[0].size() + exp_.prompts[1].size());
  const int64_t len = static_cast<int64_t>(prompt.size());
  KvCache cache = model_.make_kv_cache(8, bs);
  auto run = [&](const std::vector<int32_t>& blocks, int64_t begin, int64_t end,
                 const std::vector<int32_t>& ids) {
    ForwardBatch b;
    for (int64_t p = begin; p < end; ++p) {
      b.input_ids.push_back(ids[p - begin]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slots.push_back(kv_slot(blocks, bs, p));
    }
    b.cu_seqlens = {0, static_cast<int32_t>(end - begin)};
    b.kv_lens = {static_cast<int32_t>(end)};
    b.block_tables = blocks;
    b.max_blocks = static_cast<int32_t>(blocks.size());
    return model_.forward(b, cache);
  };
  // The first sequence: the prompt's first 48 tokens in blocks 5, 2, 7.
  Tensor first = run({5, 2, 7}, 0, prefix, {prompt.begin(), prompt.begin() + prefix});
  EXPECT_LE(rel_error(first.data<float>(), exp_.f32("logits") + row0 * vocab, prefix * vocab),
            kTolerance);
  // The second: the same three blocks, then its own 0 and 3 for the tail.
  const std::vector<int32_t> blocks = {5, 2, 7, 0, 3, 6};
  Tensor tail = run(blocks, prefix, len, {prompt.begin() + prefix, prompt.end()});
  EXPECT_LE(rel_error(tail.data<float>(), exp_.f32("logits") + (row0 + prefix) * vocab,
                      (len - prefix) * vocab),
            kTolerance);
  const int64_t* ids = exp_.i64("greedy_ids") + 2 * kGreedySteps;
  for (int64_t step = 1; step < kGreedySteps; ++step) {
    Tensor next = run(blocks, len + step - 1, len + step, {static_cast<int32_t>(ids[step - 1])});
    const float* ref = exp_.f32("greedy_logits") + (2 * kGreedySteps + step) * vocab;
    EXPECT_LE(rel_error(next.data<float>(), ref, vocab), kTolerance) << "step " << step;
    EXPECT_EQ(argmax_row(next, 0), ids[step]) << "step " << step;
  }
}

}  // namespace
}  // namespace kestrel
