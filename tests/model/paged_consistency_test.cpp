// The paged path gives the same logits however the work is cut: prompts one by
// one or batched, prefilled in two or three chunks through the cache, and over
// KV blocks of 1, 16 or 32 tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "fixture_util.h"
#include "model/falcon_model.h"
#include "model/runner.h"

namespace kestrel {
namespace {

using test::Expected;
using test::fixture_dir;
using test::rel_error;

constexpr double kTolerance = 1e-5;

Tensor prompt_logits(const FalconModel& model, const std::vector<std::vector<int32_t>>& prompts,
                     RunnerOptions options) {
  BatchRunner runner(model, prompts, 0, options);
  return runner.prefill(/*all_logits=*/true);
}

class PagedConsistencyTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_ = std::make_unique<FalconModel>(FalconModel::load(fixture_dir(GetParam())));
    exp_ = std::make_unique<Expected>(GetParam());
    batched_ = prompt_logits(*model_, exp_->prompts, {});
  }
  std::unique_ptr<FalconModel> model_;
  std::unique_ptr<Expected> exp_;
  Tensor batched_;
};

TEST_P(PagedConsistencyTest, OneByOneEqualsBatched) {
  const int64_t vocab = model_->config().vocab_size;
  int64_t row = 0;
  for (const auto& prompt : exp_->prompts) {
    Tensor alone = prompt_logits(*model_, {prompt}, {});
    const int64_t n = static_cast<int64_t>(prompt.size());
    EXPECT_LE(rel_error(alone.data<float>(), batched_.data<float>() + row * vocab, n * vocab),
              kTolerance)
        << "prompt of " << n << " tokens";
    row += n;
  }
}

TEST_P(PagedConsistencyTest, ChunkedPrefillEqualsWholePrompts) {
  int64_t longest = 0;
  for (const auto& p : exp_->prompts) longest = std::max<int64_t>(longest, p.size());
  for (int64_t pieces : {2, 3}) {
    const int64_t chunk = std::max<int64_t>(1, (longest + pieces - 1) / pieces);
    Tensor chunked = prompt_logits(*model_, exp_->prompts, {16, chunk});
    EXPECT_LE(rel_error(chunked, batched_), kTolerance) << pieces << " chunks of " << chunk;
  }
}

TEST_P(PagedConsistencyTest, BlockSizeDoesNotChangeLogits) {
  for (int64_t block_size : {1, 32}) {
    Tensor other = prompt_logits(*model_, exp_->prompts, {block_size, 0});
    EXPECT_LE(rel_error(other, batched_), kTolerance) << "block size " << block_size;
  }
  // Chunks that straddle block boundaries, with one-token blocks.
  Tensor mixed = prompt_logits(*model_, exp_->prompts, {1, 7});
  EXPECT_LE(rel_error(mixed, batched_), kTolerance);
}

TEST_P(PagedConsistencyTest, GreedyDecodeIndependentOfBlockSizeAndChunks) {
  const auto base = greedy_generate(*model_, exp_->prompts, 6, {}, false);
  EXPECT_EQ(greedy_generate(*model_, exp_->prompts, 6, {1, 0}, false), base);
  EXPECT_EQ(greedy_generate(*model_, exp_->prompts, 6, {32, 5}, false), base);
  for (size_t p = 0; p < exp_->prompts.size(); ++p) {
    EXPECT_EQ(greedy_generate(*model_, {exp_->prompts[p]}, 6, {}, false)[0], base[p]);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PagedConsistencyTest,
                         ::testing::Values("falcon7b-mqa-parallel", "falcon40b-gqa",
                                           "rw-mha-sequential-bias", "falcon180b-gqa-untied",
                                           "falcon2-11b-style", "falcon40b-hd64-gqa",
                                           "falcon7b-hd128-mqa", "rw-alibi-mha"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s;
                         });

}  // namespace
}  // namespace kestrel
