// Engine: greedy output equals transformers' alone and inside a busy batch,
// preemption under a small cache loses nothing, cancellation frees blocks,
// seeded sampling is batch-invariant, stop sequences across tokens.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "../model/fixture_util.h"
#include "engine/engine.h"
#include "model/falcon_model.h"
#include "text/tokenizer.h"

namespace kestrel {
namespace {

using test::Expected;
using test::fixture_dir;

std::shared_ptr<const FalconModel> load(const std::string& name) {
  return std::make_shared<const FalconModel>(FalconModel::load(fixture_dir(name)));
}

GenerationRequest greedy(std::vector<int32_t> prompt, int64_t n) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.max_new_tokens = n;
  r.params.ignore_eos = true;
  return r;
}

// Stats are published at step boundaries: wait for the step that ended the
// last request to publish them.
EngineStats idle_stats(const Engine& engine) {
  for (int i = 0; i < 500; ++i) {
    EngineStats st = engine.stats();
    if (st.running == 0 && st.queue_length == 0) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return engine.stats();
}

std::vector<int32_t> expected_ids(const Expected& exp, size_t p) {
  return {exp.i64("greedy_ids") + p * 12, exp.i64("greedy_ids") + (p + 1) * 12};
}

TEST(Engine, GreedyMatchesTransformersAlone) {
  for (const char* name : {"falcon7b-mqa-parallel", "falcon40b-gqa", "rw-mha-sequential-bias"}) {
    auto model = load(name);
    Expected exp(name);
    Engine engine(model, nullptr, {});
    for (size_t p = 0; p < exp.prompts.size(); ++p) {
      GenerationResult r = engine.submit(greedy(exp.prompts[p], 12))->wait();
      EXPECT_EQ(r.token_ids, expected_ids(exp, p)) << name << " prompt " << p;
      EXPECT_EQ(r.finish_reason, FinishReason::kLength);
    }
  }
}

// Fixture prompts among 30 random requests arriving at different steps.
void run_busy(Engine& engine, const Expected& exp, int64_t vocab) {
  std::mt19937 rng(7);
  std::vector<std::shared_ptr<RequestHandle>> noise, mine;
  for (int i = 0; i < 30; ++i) {
    std::vector<int32_t> prompt(1 + rng() % 40);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % vocab);
    noise.push_back(engine.submit(greedy(prompt, 1 + rng() % 20)));
    if (i % 10 == 3) {
      for (size_t p = 0; p < exp.prompts.size(); ++p) {
        mine.push_back(engine.submit(greedy(exp.prompts[p], 12)));
      }
    }
    if (i % 4 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  for (size_t k = 0; k < mine.size(); ++k) {
    EXPECT_EQ(mine[k]->wait().token_ids, expected_ids(exp, k % exp.prompts.size())) << k;
  }
  for (auto& h : noise) EXPECT_NO_THROW(h->wait());
}

TEST(Engine, GreedyIsBatchInvariant) {
  auto model = load("falcon40b-hd64-gqa");
  Expected exp("falcon40b-hd64-gqa");
  EngineOptions o;
  o.max_batch_prefill_tokens = 64;  // chunked prefill of the long prompts
  Engine engine(model, nullptr, o);
  run_busy(engine, exp, model->config().vocab_size);
  EngineStats st = idle_stats(engine);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
}

TEST(Engine, SmallCachePreemptsAndLosesNothing) {
  auto model = load("falcon40b-hd64-gqa");
  Expected exp("falcon40b-hd64-gqa");
  EngineOptions o;
  o.num_blocks = 24;  // 384 tokens: far less than all requests at once
  o.max_input_length = 256;
  o.max_total_tokens = 300;
  Engine engine(model, nullptr, o);
  run_busy(engine, exp, model->config().vocab_size);
  EngineStats st = idle_stats(engine);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
}

TEST(Engine, CancelFreesBlocks) {
  auto model = load("falcon7b-mqa-parallel");
  Engine engine(model, nullptr, {});
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 16; ++i) hs.push_back(engine.submit(greedy({1, 2, 3, 4, 5, 6}, 120)));
  for (auto& h : hs) ASSERT_TRUE(h->next().has_value());  // each has started
  for (int i = 0; i < 16; i += 2) engine.cancel(hs[i]->id());
  for (int i = 0; i < 16; ++i) {
    GenerationResult r = hs[i]->wait();
    EXPECT_EQ(r.finish_reason, i % 2 ? FinishReason::kLength : FinishReason::kCancelled);
  }
  EngineStats st = idle_stats(engine);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
  EXPECT_EQ(st.running, 0);
}

TEST(Engine, RejectsWhatCannotBeServed) {
  auto model = load("falcon7b-mqa-parallel");
  EngineOptions o;
  o.max_input_length = 8;
  o.max_total_tokens = 16;
  Engine engine(model, nullptr, o);
  EXPECT_THROW(engine.submit(greedy(std::vector<int32_t>(9, 1), 2)), ValidationError);
  EXPECT_THROW(engine.submit(greedy({1, 2}, 15)), ValidationError);
  EXPECT_THROW(engine.submit(greedy({1, 5000}, 2)), ValidationError);
  GenerationRequest bad = greedy({1, 2}, 2);
  bad.params.top_p = 1.5f;
  try {
    engine.submit(bad);
    FAIL();
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "top_p");
  }
}

TEST(Engine, SeededSamplingIsBatchInvariant) {
  auto model = load("falcon7b-mqa-parallel");
  Engine engine(model, nullptr, {});
  GenerationRequest r = greedy({5, 6, 7}, 16);
  r.params.do_sample = true;
  r.params.temperature = 1.5f;
  r.params.top_k = 50;
  r.params.top_p = 0.95f;
  r.params.seed = 1234;
  const auto alone = engine.submit(r)->wait().token_ids;
  std::vector<std::shared_ptr<RequestHandle>> others;
  for (int i = 0; i < 8; ++i) others.push_back(engine.submit(greedy({9, 9, i}, 10)));
  auto in_batch = engine.submit(r);
  EXPECT_EQ(in_batch->wait().token_ids, alone);
  for (auto& h : others) h->wait();
  r.params.seed = 99;
  EXPECT_NE(engine.submit(r)->wait().token_ids, alone);
}

TEST(Engine, StopSequenceAcrossTokens) {
  auto model = load("e2e-falcon7b-fullvocab");
  auto tok = std::make_shared<const text::Tokenizer>(
      text::Tokenizer::from_model_dir(fixture_dir("e2e-falcon7b-fullvocab")));
  Engine engine(model, tok, {});
  GenerationRequest r = greedy(tok->encode("The capital of France is"), 12);
  GenerationResult full = engine.submit(r)->wait();
  // " fp Traditional dolphin rej device ...": a stop spanning two tokens.
  const std::string stop = "al dol";
  ASSERT_NE(full.text.find(stop), std::string::npos) << full.text;
  r.params.stop = {stop};
  GenerationResult cut = engine.submit(r)->wait();
  EXPECT_EQ(cut.finish_reason, FinishReason::kStopSequence);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_LT(cut.token_ids.size(), full.token_ids.size());
}

}  // namespace
}  // namespace kestrel
