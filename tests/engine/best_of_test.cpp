// best_of (candidates forked at the first token, sharing the prompt's full
// blocks, the best by cumulative logprob returned) and prompt logprobs
// (decoder_input_details) against the fixtures' transformers logits.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine_test_util.h"

namespace kestrel {
namespace {

using namespace test;

GenerationRequest sampled(std::vector<int32_t> prompt, int64_t n, uint64_t seed) {
  GenerationRequest r = greedy_request(std::move(prompt), n);
  r.params.do_sample = true;
  r.params.temperature = 1.3f;
  r.params.top_k = 40;
  r.params.seed = seed;
  return r;
}

double cumulative(const GenerationResult& r) {
  double s = 0;
  for (const TokenInfo& t : r.tokens) s += t.logprob;
  return s;
}

TEST(BestOf, CandidatesAreSeededRequestsAndTheBestIsReturned) {
  auto model = load_fixture("falcon7b-mqa-parallel");
  Expected exp("falcon7b-mqa-parallel");
  EngineOptions o;
  o.prefix_caching = false;  // sharing below is the fork's, not the cache's
  Engine engine(model, nullptr, o);
  const std::vector<int32_t> prompt(exp.prompts[2].begin(), exp.prompts[2].begin() + 32);
  GenerationRequest r = sampled(prompt, 16, 42);
  r.params.best_of = 3;
  auto h = engine.submit(r);
  const GenerationResult best = h->wait();
  const EngineStats st = stats_when_idle(engine);
  // 32 prompt tokens = 2 full blocks: the two forks share them and compute none.
  EXPECT_EQ(st.computed_prompt_tokens, 32);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
  ASSERT_EQ(best.best_of_sequences.size(), 2u);
  std::vector<const GenerationResult*> all{&best};
  for (const auto& b : best.best_of_sequences) all.push_back(&b);
  for (size_t i = 1; i < all.size(); ++i) EXPECT_GE(cumulative(*all[i - 1]), cumulative(*all[i]));
  // Each candidate is exactly what a plain request with its seed gives.
  std::set<uint64_t> seeds;
  for (const GenerationResult* c : all) {
    seeds.insert(c->seed);
    EXPECT_GE(c->seed, 42u);
    EXPECT_LE(c->seed, 44u);
    const GenerationResult alone = engine.submit(sampled(prompt, 16, c->seed))->wait();
    EXPECT_EQ(c->token_ids, alone.token_ids) << "seed " << c->seed;
    ASSERT_EQ(c->tokens.size(), alone.tokens.size());
    for (size_t k = 0; k < alone.tokens.size(); ++k)
      EXPECT_NEAR(c->tokens[k].logprob, alone.tokens[k].logprob, 1e-5);
  }
  EXPECT_EQ(seeds.size(), 3u);
}

TEST(BestOf, PartialLastBlockIsRecomputedNotShared) {
  auto model = load_fixture("falcon7b-mqa-parallel");
  Expected exp("falcon7b-mqa-parallel");
  EngineOptions o;
  o.prefix_caching = false;
  Engine engine(model, nullptr, o);
  GenerationRequest r = sampled(exp.prompts[2], 8, 7);  // 33 tokens: 2 full blocks + 1
  r.params.best_of = 4;
  const GenerationResult best = engine.submit(r)->wait();
  EXPECT_EQ(best.best_of_sequences.size(), 3u);
  const EngineStats st = stats_when_idle(engine);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
  const GenerationResult alone = engine.submit(sampled(exp.prompts[2], 8, best.seed))->wait();
  EXPECT_EQ(best.token_ids, alone.token_ids);
}

TEST(BestOf, CancelEndsEveryCandidate) {
  auto model = load_fixture("falcon7b-mqa-parallel");
  Engine engine(model, nullptr, {});
  GenerationRequest r =
      sampled({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}, 400, 3);
  r.params.best_of = 3;
  auto h = engine.submit(r);
  while (engine.stats().running < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine.cancel(h->id());
  const GenerationResult res = h->wait();
  EXPECT_EQ(res.finish_reason, FinishReason::kCancelled);
  const EngineStats st = stats_when_idle(engine);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

TEST(BestOf, NeedsSampling) {
  auto model = load_fixture("falcon7b-mqa-parallel");
  Engine engine(model, nullptr, {});
  GenerationRequest r = greedy_request({1, 2, 3}, 4);
  r.params.best_of = 2;
  try {
    engine.submit(r);
    FAIL();
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "best_of");
  }
}

// log_softmax(logits[p])[prompt[p + 1]] from the fixture.
float reference_logprob(const Expected& exp, int64_t row, int32_t token, int64_t vocab) {
  const float* l = exp.f32("logits") + row * vocab;
  double mx = l[0], sum = 0;
  for (int64_t i = 0; i < vocab; ++i) mx = std::max<double>(mx, l[i]);
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(l[i] - mx);
  return static_cast<float>(l[token] - mx - std::log(sum));
}

TEST(PromptLogprobs, MatchTransformersThroughChunkedPrefill) {
  auto model = load_fixture("falcon40b-hd64-gqa");
  Expected exp("falcon40b-hd64-gqa");
  const int64_t vocab = model->config().vocab_size;
  EngineOptions o;
  o.max_batch_prefill_tokens = 37;  // every long prompt in several chunks
  Engine engine(model, nullptr, o);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (const auto& p : exp.prompts) {
    GenerationRequest r = greedy_request(p, 12);
    r.params.prompt_logprobs = true;
    hs.push_back(engine.submit(r));
  }
  int64_t row0 = 0;
  for (size_t i = 0; i < hs.size(); ++i) {
    const GenerationResult r = hs[i]->wait();
    const auto& p = exp.prompts[i];
    EXPECT_EQ(r.token_ids, fixture_greedy_ids(exp, i));
    ASSERT_EQ(r.prompt_tokens.size(), p.size());
    EXPECT_TRUE(std::isnan(r.prompt_tokens[0].logprob));
    for (size_t k = 0; k < p.size(); ++k) EXPECT_EQ(r.prompt_tokens[k].id, p[k]);
    for (size_t k = 1; k < p.size(); ++k) {
      EXPECT_NEAR(r.prompt_tokens[k].logprob, reference_logprob(exp, row0 + k - 1, p[k], vocab),
                  1e-4)
          << "prompt " << i << " token " << k;
    }
    row0 += static_cast<int64_t>(p.size());
  }
  // The same prompt again: nothing may come from the prefix cache, all rows are needed.
  GenerationRequest again = greedy_request(exp.prompts[2], 2);
  again.params.prompt_logprobs = true;
  const GenerationResult r = engine.submit(again)->wait();
  ASSERT_EQ(r.prompt_tokens.size(), exp.prompts[2].size());
  EXPECT_NEAR(r.prompt_tokens.back().logprob,
              reference_logprob(exp, row0 - 2, exp.prompts[2].back(), vocab), 1e-4);
}

}  // namespace
}  // namespace kestrel
