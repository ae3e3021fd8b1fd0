// Every base-model fixture: kestrel's logits and greedy decoding against what
// transformers computed (tests/data/*/expected.safetensors).
#include <gtest/gtest.h>

#include <cstring>

#include "fixture_util.h"
#include "model/falcon_model.h"
#include "model/runner.h"

namespace kestrel {
namespace {

using test::Expected;
using test::fixture_dir;
using test::rel_error;

constexpr double kTolerance = 1e-4;
constexpr int64_t kGreedySteps = 12;

class FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, PromptLogitsMatchTransformers) {
  const FalconModel model = FalconModel::load(fixture_dir(GetParam()));
  const Expected exp(GetParam());
  const int64_t vocab = model.config().vocab_size;
  BatchRunner runner(model, exp.prompts, 0, {});
  if (exp.store.contains("logits")) {
    Tensor logits = runner.prefill(/*all_logits=*/true);
    ASSERT_EQ(logits.shape(), exp.store.get("logits").shape);
    EXPECT_LE(rel_error(logits.data<float>(), exp.f32("logits"), logits.numel()), kTolerance);
  } else {
    Tensor last = runner.prefill(/*all_logits=*/false);
    ASSERT_EQ(last.shape(), (Shape{static_cast<int64_t>(exp.prompts.size()), vocab}));
    EXPECT_LE(rel_error(last.data<float>(), exp.f32("last_logits"), last.numel()), kTolerance);
  }
}

TEST_P(FixtureTest, GreedyDecodeMatchesTransformers) {
  const FalconModel model = FalconModel::load(fixture_dir(GetParam()));
  const Expected exp(GetParam());
  const int64_t vocab = model.config().vocab_size;
  const int64_t n_prompts = static_cast<int64_t>(exp.prompts.size());
  const bool has_step_logits = exp.store.contains("greedy_logits");
  double worst = 0.0;
  auto observe = [&](int64_t step, const Tensor& logits, const std::vector<int>& seqs) {
    if (!has_step_logits) return;
    for (size_t r = 0; r < seqs.size(); ++r) {
      const float* ref = exp.f32("greedy_logits") + (seqs[r] * kGreedySteps + step) * vocab;
      worst = std::max(worst, rel_error(logits.data<float>() + r * vocab, ref, vocab));
    }
  };
  auto out = greedy_generate(model, exp.prompts, kGreedySteps, {}, /*stop_at_eos=*/false, observe);
  ASSERT_EQ(static_cast<int64_t>(out.size()), n_prompts);
  for (int64_t p = 0; p < n_prompts; ++p) {
    std::vector<int32_t> want(exp.i64("greedy_ids") + p * kGreedySteps,
                              exp.i64("greedy_ids") + (p + 1) * kGreedySteps);
    EXPECT_EQ(out[p], want) << "prompt " << p;
  }
  EXPECT_LE(worst, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTest, ::testing::ValuesIn(test::base_fixtures()),
                         [](const auto& info) { return test::fixture_test_name(info.param); });

}  // namespace
}  // namespace kestrel
