// Decode steps replayed as CUDA graphs against the same steps run eagerly, on two KV caches
// fed the same tokens: logits within bf16 error (a graph pads the batch to its bucket, so
// cuBLASLt may pick another kernel) and equal argmax wherever the margin is clear. The batch
// changes between replays: sequences finish and join, contexts grow past a block-table width
// bucket, batch sizes move between buckets. Also: the graphs really replay (capture and replay
// counts), --cuda-graphs off runs eagerly; LoRA steps replay too (cuda_lora_graph_test.cpp).
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <thread>

#include "backend/ops.h"
#include "fixture_util.h"
#include "model/decode_graphs.h"
#include "model/falcon_model.h"
#include "seq_batch.h"

namespace kestrel {
namespace {

constexpr int64_t kBlockSize = 16;
constexpr int64_t kBlocksPerSeq = 40;  // 640 tokens of room per sequence

using test::Seq;

ForwardBatch make_batch(const std::vector<Seq*>& seqs) {
  return test::make_batch(seqs, kBlockSize, kBlocksPerSeq);
}

int64_t argmax(const float* row, int64_t n) {
  return std::max_element(row, row + n) - row;
}

// Runs the same schedule with graphs (cache g) and without (cache e), checking every decode
// step; returns the number of decode steps.
class GraphVsEager {
 public:
  explicit GraphVsEager(FalconModel& model)
      : model_(model),
        g_(model.make_kv_cache(12 * kBlocksPerSeq, kBlockSize)),
        e_(model.make_kv_cache(12 * kBlocksPerSeq, kBlockSize)) {}

  // A new sequence of `len` random prompt tokens, prefilled (eagerly) on both caches.
  Seq* join(int64_t len) {
    seqs_.push_back(std::make_unique<Seq>());
    Seq* s = seqs_.back().get();
    s->id = static_cast<int64_t>(seqs_.size()) - 1;
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab() - 1));
    for (int64_t i = 0; i < len; ++i) s->tokens.push_back(tok(rng_));
    step({s}, /*decode=*/false);
    return s;
  }

  // One step of `seqs` on both caches; its eager argmax becomes each sequence's next token.
  void step(const std::vector<Seq*>& seqs, bool decode = true) {
    const ForwardBatch b = make_batch(seqs);
    // One new token per sequence replays a graph, a 1-token prompt's prefill too.
    const int64_t expect = b.n_tokens() == b.n_seqs() ? 1 : 0;
    const int64_t replays = model_.graph_stats().replays;
    const Tensor lg = model_.forward(b, g_);
    EXPECT_EQ(model_.graph_stats().replays - replays, expect)
        << "a step of " << seqs.size() << " sequences, " << b.n_tokens() << " tokens";
    model_.set_cuda_graphs(false);
    const Tensor le = model_.forward(b, e_);
    model_.set_cuda_graphs(true);
    EXPECT_EQ(model_.graph_stats().replays - replays, expect) << "graphs off replayed";
    ASSERT_EQ(lg.shape(), le.shape());
    const int64_t v = vocab();
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < lg.numel(); ++i) {
      max_err = std::max(max_err, std::abs(double{lg.data<float>()[i]} - le.data<float>()[i]));
      max_ref = std::max(max_ref, std::abs(double{le.data<float>()[i]}));
    }
    EXPECT_LE(max_err / max_ref, 1e-2) << "step of " << seqs.size() << " sequences";
    worst_ = std::max(worst_, max_err / max_ref);
    for (size_t r = 0; r < seqs.size(); ++r) {
      const float* ge = lg.data<float>() + r * v;
      const float* ee = le.data<float>() + r * v;
      const int64_t best = argmax(ee, v);
      float second = -INFINITY;
      for (int64_t i = 0; i < v; ++i)
        if (i != best) second = std::max(second, ee[i]);
      if (ee[best] - second > 2 * max_err) {
        EXPECT_EQ(argmax(ge, v), best) << "row " << r;
        ++checked_;
      }
      seqs[r]->computed = static_cast<int64_t>(seqs[r]->tokens.size());
      seqs[r]->tokens.push_back(static_cast<int32_t>(best));
    }
    if (decode) ++steps_;
  }

  int64_t vocab() const { return model_.config().vocab_size; }
  int64_t steps() const { return steps_; }
  int64_t checked() const { return checked_; }
  double worst() const { return worst_; }

 private:
  FalconModel& model_;
  KvCache g_, e_;
  std::vector<std::unique_ptr<Seq>> seqs_;
  std::mt19937 rng_{7};
  int64_t steps_ = 0, checked_ = 0;
  double worst_ = 0;
};

// Finishing, joining, crossing the 256-token width bucket (16 blocks), buckets 1 to 16.
void run_schedule(FalconModel& model) {
  GraphVsEager t(model);
  const int64_t captures0 = model.graph_stats().captures;
  Seq* a = t.join(5);
  Seq* b = t.join(37);
  Seq* c = t.join(250);                           // crosses 256 during the first steps
  for (int i = 0; i < 8; ++i) t.step({a, b, c});  // bucket 4, widths 16 then 32
  Seq* d = t.join(17);                            // b finishes, d joins
  for (int i = 0; i < 4; ++i) t.step({a, c, d});
  std::vector<Seq*> many = {d, a, c};
  for (int64_t len : {3, 64, 129, 300, 31, 90, 400, 8, 2, 1}) many.push_back(t.join(len));
  for (int i = 0; i < 3; ++i) t.step(many);  // 13 sequences: bucket 16
  many.resize(9);                            // four finish: bucket 16 still, 9 rows real
  for (int i = 0; i < 3; ++i) t.step(many);
  for (int i = 0; i < 3; ++i) t.step({d});  // bucket 1
  for (int i = 0; i < 2; ++i) t.step({c, d});
  const FalconModel::GraphStats st = model.graph_stats();
  EXPECT_GE(st.captures - captures0, 5);  // (4,16) (4,32) (16,32) (1,16) (2,32) at least
  EXPECT_GT(t.checked(), t.steps());
  std::printf(
      "[ graphs ] %lld decode steps, %lld captures, worst rel error %.3g, %lld argmax "
      "checked, pool %.1f MiB\n",
      static_cast<long long>(t.steps()), static_cast<long long>(st.captures - captures0), t.worst(),
      static_cast<long long>(t.checked()), st.pool_bytes / 1048576.0);
}

class CudaGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (ops::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  }
};

TEST_F(CudaGraphTest, Hd128FixtureGraphsMatchEager) {
  FalconModel model = FalconModel::load(test::fixture_dir("falcon7b-hd128-mqa"), Device::kCuda);
  ASSERT_TRUE(model.cuda_graphs());
  run_schedule(model);
}

TEST_F(CudaGraphTest, Hd64GqaFixtureGraphsMatchEager) {
  FalconModel model = FalconModel::load(test::fixture_dir("falcon40b-hd64-gqa"), Device::kCuda);
  run_schedule(model);
}

// falcon-7b's shapes (71 query heads on one K/V head, head_dim 64, vocab 65,024), 2 layers.
TEST_F(CudaGraphTest, Falcon7bShapesGraphsMatchEager) {
  FalconModel model = FalconModel::random(test::falcon7b_shapes(2), Device::kCuda, 3);
  run_schedule(model);
}

// Another thread uploading weights (as the adapter store's loader does) while graphs are
// captured: its work must stay out of the captures, and both sides stay right.
TEST_F(CudaGraphTest, UploadsOnAnotherThreadDuringCaptures) {
  FalconModel model = FalconModel::load(test::fixture_dir("falcon7b-hd128-mqa"), Device::kCuda);
  std::atomic<bool> stop{false};
  int64_t uploads = 0, wrong = 0;
  std::thread loader([&] {
    std::vector<float> host(1 << 16);
    while (!stop.load()) {
      for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((i + uploads) % 251);
      const Tensor dev =
          ops::upload_weight(host.data(), DType::kF32, {static_cast<int64_t>(host.size())},
                             DType::kF32, Device::kCuda);
      const Tensor back = ops::to_host_f32(dev);
      for (size_t i = 0; i < host.size(); ++i) wrong += back.data<float>()[i] != host[i];
      ++uploads;
    }
  });
  run_schedule(model);
  stop = true;
  loader.join();
  EXPECT_GT(uploads, 0);
  EXPECT_EQ(wrong, 0);
}

// Off: every step eager. Steps graphs do not take (prefill, skip_lm_head) run eagerly too; a
// LoRA decode step replays (the graph of rank bound 16).
TEST_F(CudaGraphTest, OffAndIneligibleStepsRunEagerly) {
  FalconModel model = FalconModel::load(test::fixture_dir("falcon7b-hd128-mqa"), Device::kCuda);
  KvCache cache = model.make_kv_cache(64, kBlockSize);
  Seq s;
  s.tokens = {1, 2, 3, 4, 5};
  ForwardBatch b = make_batch({&s});
  EXPECT_FALSE(DecodeGraphs::eligible(model, b));  // a 5-token prefill
  model.forward(b, cache);
  s.computed = 5;
  s.tokens.push_back(6);
  b = make_batch({&s});
  EXPECT_TRUE(DecodeGraphs::eligible(model, b));
  model.set_cuda_graphs(false);
  model.forward(b, cache);
  EXPECT_EQ(model.graph_stats().replays, 0);
  model.set_cuda_graphs(true);
  model.forward(b, cache);
  EXPECT_EQ(model.graph_stats().replays, 1);
  auto adapter = model.random_adapter("x", 4, {LoraModule::kQkv}, 1);
  b.adapters = {adapter.get()};
  EXPECT_TRUE(DecodeGraphs::eligible(model, b));
  EXPECT_EQ(DecodeGraphs::lora_bound(b), 16);
  b.adapters.clear();
  b.lm_head_indices.clear();
  EXPECT_TRUE(DecodeGraphs::eligible(model, b));
  b.skip_lm_head = true;
  EXPECT_FALSE(DecodeGraphs::eligible(model, b));
}

TEST(DecodeGraphBuckets, PadToTheNextBucket) {
  EXPECT_EQ(DecodeGraphs::batch_bucket(1), 1);
  EXPECT_EQ(DecodeGraphs::batch_bucket(3), 4);
  EXPECT_EQ(DecodeGraphs::batch_bucket(17), 24);
  EXPECT_EQ(DecodeGraphs::batch_bucket(33), 48);
  EXPECT_EQ(DecodeGraphs::batch_bucket(65), 96);
  EXPECT_EQ(DecodeGraphs::batch_bucket(128), 128);
  EXPECT_EQ(DecodeGraphs::batch_bucket(129), 160);
  EXPECT_EQ(DecodeGraphs::width_bucket(1), 16);
  EXPECT_EQ(DecodeGraphs::width_bucket(17), 32);
  EXPECT_EQ(DecodeGraphs::width_bucket(64), 64);
}

}  // namespace
}  // namespace kestrel
