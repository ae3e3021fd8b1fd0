// Every base-model fixture on CUDA (bf16 weights and activations) against the
// fp32 transformers reference: max |error| / max |reference| <= 2e-2 for the
// prompt logits and for each greedy step's logits. Decode is teacher-forced
// with the reference's greedy ids, so one near-tie cannot derail the rest; our
// argmax must equal the reference id at every step whose reference margin
// (best minus second-best logit) exceeds twice our measured absolute error
// there. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "fixture_util.h"
#include "model/falcon_model.h"
#include "model/runner.h"

namespace kestrel {
namespace {

using test::Expected;
using test::fixture_dir;
using test::rel_error;

constexpr double kTolerance = 2e-2;
constexpr int64_t kGreedySteps = 12;

double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// (best - second best, index of best) of a row.
std::pair<double, int64_t> margin(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  double second = -INFINITY;
  for (int64_t i = 0; i < n; ++i)
    if (i != best) second = std::max(second, static_cast<double>(row[i]));
  return {row[best] - second, best};
}

class CudaFixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (ops::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_P(CudaFixtureTest, PromptLogitsMatchTransformers) {
  const FalconModel model = FalconModel::load(fixture_dir(GetParam()), Device::kCuda);
  const Expected exp(GetParam());
  for (int64_t block_size : {16, 32}) {
    BatchRunner runner(model, exp.prompts, 0, {block_size, 0});
    if (exp.store.contains("logits")) {
      Tensor logits = runner.prefill(/*all_logits=*/true);
      ASSERT_EQ(logits.shape(), exp.store.get("logits").shape);
      const double err = rel_error(logits.data<float>(), exp.f32("logits"), logits.numel());
      RecordProperty("rel_error_bs" + std::to_string(block_size), std::to_string(err));
      EXPECT_LE(err, kTolerance) << "block size " << block_size;
    } else {
      Tensor last = runner.prefill(/*all_logits=*/false);
      const double err = rel_error(last.data<float>(), exp.f32("last_logits"), last.numel());
      EXPECT_LE(err, kTolerance) << "block size " << block_size;
    }
  }
}

// Chunked prefill (16 tokens per step through the cache) gives the same logits.
TEST_P(CudaFixtureTest, ChunkedPrefillMatchesTransformers) {
  const FalconModel model = FalconModel::load(fixture_dir(GetParam()), Device::kCuda);
  const Expected exp(GetParam());
  BatchRunner runner(model, exp.prompts, 0, {16, 16});
  Tensor last = runner.prefill(/*all_logits=*/false);
  EXPECT_LE(rel_error(last.data<float>(), exp.f32("last_logits"), last.numel()), kTolerance);
}

TEST_P(CudaFixtureTest, TeacherForcedDecodeMatchesTransformers) {
  const FalconModel model = FalconModel::load(fixture_dir(GetParam()), Device::kCuda);
  const Expected exp(GetParam());
  const int64_t vocab = model.config().vocab_size;
  const int64_t n_prompts = static_cast<int64_t>(exp.prompts.size());
  const bool has_step_logits = exp.store.contains("greedy_logits");
  const int64_t* ref_ids = exp.i64("greedy_ids");
  BatchRunner runner(model, exp.prompts, kGreedySteps, {16, 0});
  Tensor logits = runner.prefill(/*all_logits=*/false);
  std::vector<int> seqs(n_prompts);
  for (int64_t p = 0; p < n_prompts; ++p) seqs[p] = static_cast<int>(p);
  double worst = 0.0;
  int checked = 0, skipped = 0;
  for (int64_t step = 0; step < kGreedySteps; ++step) {
    for (int64_t p = 0; p < n_prompts; ++p) {
      const float* got = logits.data<float>() + p * vocab;
      const int32_t want = static_cast<int32_t>(ref_ids[p * kGreedySteps + step]);
      if (has_step_logits) {
        const float* ref = exp.f32("greedy_logits") + (p * kGreedySteps + step) * vocab;
        worst = std::max(worst, rel_error(got, ref, vocab));
        const double abs_err = max_abs_diff(got, ref, vocab);
        if (margin(ref, vocab).first > 2.0 * abs_err) {
          EXPECT_EQ(argmax_row(logits, p), want) << "prompt " << p << " step " << step;
          ++checked;
        } else {
          ++skipped;
        }
      } else {
        // No per-step reference: greedy ids are checked where our own margin is clear.
        if (margin(got, vocab).first > 0.05) {
          EXPECT_EQ(argmax_row(logits, p), want) << "prompt " << p << " step " << step;
          ++checked;
        } else {
          ++skipped;
        }
      }
    }
    if (step + 1 == kGreedySteps) break;
    std::vector<int32_t> next(n_prompts);
    for (int64_t p = 0; p < n_prompts; ++p)
      next[p] = static_cast<int32_t>(ref_ids[p * kGreedySteps + step]);
    logits = runner.decode(seqs, next);
  }
  RecordProperty("greedy_checked", checked);
  RecordProperty("greedy_skipped_near_ties", skipped);
  std::printf("[ %s ] decode rel error %.3g, greedy ids checked %d, skipped (near ties) %d\n",
              GetParam().c_str(), worst, checked, skipped);
  EXPECT_LE(worst, kTolerance);
  EXPECT_GT(checked, 0);
}

// Free-running greedy decoding on the GPU equals the reference ids wherever the
// fixture's min_greedy_margin is clear of the bf16 error (0.05 here).
TEST_P(CudaFixtureTest, GreedyIdsWhereMarginIsClear) {
  std::ifstream f(fixture_dir(GetParam()) + "/fixture.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  const double min_margin = j.value("min_greedy_margin", 0.0);
  if (min_margin < 0.05) GTEST_SKIP() << "min_greedy_margin " << min_margin << " below 0.05";
  const FalconModel model = FalconModel::load(fixture_dir(GetParam()), Device::kCuda);
  const Expected exp(GetParam());
  auto out = greedy_generate(model, exp.prompts, kGreedySteps, {}, /*stop_at_eos=*/false);
  for (size_t p = 0; p < out.size(); ++p) {
    std::vector<int32_t> want(exp.i64("greedy_ids") + p * kGreedySteps,
                              exp.i64("greedy_ids") + (p + 1) * kGreedySteps);
    EXPECT_EQ(out[p], want) << "prompt " << p;
  }
}

// Where CUDA rounds to FP8 what it holds in BF16 (activations before the FP8 GEMM, K/V before
// the cache) and the CPU what it holds in F32, a value near the middle of two E4M3 codes takes
// the other code on the other side (one E4M3 step, 6-12%, where BF16 and F32 differ by
// 0.4%), and the fixtures' small widths (hidden 64-256) average few such flips away: on the
// H100 these runs stood at 0.021-0.029 (K/V only) and 0.04-0.085 (activations) of the CPU's
// logits. The CPU alone shows the same: rounding its activations to BF16 before the same FP8
// rounding moves its logits by 0.042-0.065 on five fixtures (docs/fp8.md). The op tests hold
// the same kernels to 1e-2 on identical inputs.
constexpr double kFp8RoundingTolerance = 0.1;

// CUDA against the CPU computing the same thing (the same FP8 codes and scales, activations
// rounded alike, K/V stored alike): the prompt logits, and with steps each greedy step's logits
// up to the first step where the two runs chose differently, within bound; with CUDA graphs
// (decode replays) and without. Prints the errors.
void expect_matches_cpu(const std::string& fixture, const WeightQuant& cpu_quant,
                        const WeightQuant& gpu_quant, bool kv_fp8, bool steps, double bound,
                        std::vector<std::vector<int32_t>> prompts = {}) {
  FalconModel cpu = FalconModel::load(fixture_dir(fixture), Device::kCpu, 1, cpu_quant);
  FalconModel gpu = FalconModel::load(fixture_dir(fixture), Device::kCuda, 1, gpu_quant);
  EXPECT_EQ(gpu.linear_weight_dtype(), gpu_quant.fp8 ? DType::kF8E4M3 : DType::kBF16);
  if (kv_fp8) {
    cpu.set_kv_cache_dtype(DType::kF8E4M3);
    gpu.set_kv_cache_dtype(DType::kF8E4M3);
  }
  if (prompts.empty()) prompts = Expected(fixture).prompts;
  const int64_t vocab = cpu.config().vocab_size;
  {
    BatchRunner rc(cpu, prompts, 0, {}), rg(gpu, prompts, 0, {});
    const Tensor a = rc.prefill(false), b = rg.prefill(false);
    const double e = rel_error(b.data<float>(), a.data<float>(), a.numel());
    std::printf("%s: prompt logits %.4f of the CPU's\n", fixture.c_str(), e);
    EXPECT_LE(e, bound) << "prompt";
  }
  if (!steps) return;
  using Steps = std::vector<std::vector<std::vector<float>>>;  // [prompt][step] -> logits
  auto run = [&](const FalconModel& m, Steps& out) {
    out.assign(prompts.size(), {});
    return greedy_generate(m, prompts, kGreedySteps, {}, false,
                           [&](int64_t, const Tensor& logits, const std::vector<int>& seqs) {
                             const Tensor h = ops::to_host_f32(logits);
                             for (size_t r = 0; r < seqs.size(); ++r)
                               out[seqs[r]].emplace_back(h.data<float>() + r * vocab,
                                                         h.data<float>() + (r + 1) * vocab);
                           });
  };
  Steps want, got;
  const auto ids_cpu = run(cpu, want);
  for (bool graphs : {false, true}) {
    gpu.set_cuda_graphs(graphs);
    const auto ids_gpu = run(gpu, got);
    double worst = 0;
    for (size_t p = 0; p < prompts.size(); ++p)
      for (int64_t s = 0; s < kGreedySteps; ++s) {
        worst = std::max(worst, rel_error(got[p][s].data(), want[p][s].data(), vocab));
        if (ids_gpu[p][s] != ids_cpu[p][s]) break;  // later steps see different contexts
      }
    std::printf("%s: greedy steps' logits %.4f of the CPU's (graphs %d)\n", fixture.c_str(), worst,
                graphs);
    EXPECT_LE(worst, bound) << "graphs " << graphs;
  }
}

// --quantize fp8 --fp8-activations: the FP8 tensor-core GEMM at every row count, prefill and
// decode, against the CPU rounding activations the same way.
TEST_P(CudaFixtureTest, Fp8MatchesTheCpuFp8Path) {
  const WeightQuant fp8{.fp8 = true, .fp8_activations = true};
  expect_matches_cpu(GetParam(), fp8, fp8, false, true, kFp8RoundingTolerance);
}

// --quantize fp8 as CUDA runs it by default: the prompt's 55 rows through the tensor-core GEMM
// (activations rounded), against the CPU rounding them too. (Its decode rows take the weight-only
// GEMV, which the op tests check against the CPU's weight-only linear.)
TEST_P(CudaFixtureTest, Fp8DefaultPrefillMatchesTheCpu) {
  expect_matches_cpu(GetParam(), {.fp8 = true, .fp8_activations = true}, {.fp8 = true}, false,
                     false, kFp8RoundingTolerance);
}

// --quantize fp8 weight-only: every linear of at most 2 rows takes the FP8 GEMV with BF16
// activations, as the CPU's FP8 linear keeps them; each prompt cut to its first 2 tokens and run
// alone, so that prefill and decode stay at 1-2 rows. Nothing rounds BF16 to FP8 here: 2e-2.
TEST_P(CudaFixtureTest, Fp8WeightOnlyGemvMatchesTheCpu) {
  for (const std::vector<int32_t>& p : Expected(GetParam()).prompts) {
    const std::vector<int32_t> head(p.begin(), p.begin() + std::min<size_t>(p.size(), 2));
    expect_matches_cpu(GetParam(), {.fp8 = true}, {.fp8 = true}, false, true, kTolerance, {head});
  }
}

// --kv-cache-dtype fp8: K/V written as E4M3 and read by the attention kernels, with BF16 weights
// and with FP8 ones.
TEST_P(CudaFixtureTest, Fp8KvCacheMatchesTheCpu) {
  expect_matches_cpu(GetParam(), {}, {}, true, true, kFp8RoundingTolerance);
  const WeightQuant fp8{.fp8 = true, .fp8_activations = true};
  expect_matches_cpu(GetParam(), fp8, fp8, true, true, kFp8RoundingTolerance);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaFixtureTest, ::testing::ValuesIn(test::base_fixtures()),
                         [](const auto& info) { return test::fixture_test_name(info.param); });

}  // namespace
}  // namespace kestrel
