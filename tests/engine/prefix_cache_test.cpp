// Prefix caching: a repeated prompt computes only its uncached tail and gives
// the same logprobs and greedy output; shared prefixes under preemption and
// cancellation leak no block; the switch turns it off.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine_test_util.h"

namespace kestrel {
namespace {

using namespace test;

GenerationRequest with_alternatives(std::vector<int32_t> prompt, int64_t n) {
  GenerationRequest r = greedy_request(std::move(prompt), n);
  r.params.top_n_tokens = 20;  // the 20 best logprobs of every step, to compare
  return r;
}

TEST(PrefixCache, SecondRequestComputesOnlyTheTail) {
  auto model = load_fixture("falcon40b-hd64-gqa");
  Expected exp("falcon40b-hd64-gqa");
  const std::vector<int32_t>& prompt = exp.prompts[2];  // 200 tokens
  Engine engine(model, nullptr, {});
  const GenerationResult first = engine.submit(with_alternatives(prompt, 12))->wait();
  const EngineStats st1 = stats_when_idle(engine);
  EXPECT_EQ(st1.prefix_cache_hit_tokens, 0);
  EXPECT_EQ(st1.computed_prompt_tokens, 200);
  EXPECT_GT(st1.kv_blocks_cached, 0);

  const GenerationResult second = engine.submit(with_alternatives(prompt, 12))->wait();
  const EngineStats st2 = stats_when_idle(engine);
  // 12 full blocks of 16 (192 tokens) come from the cache; 8 are computed.
  EXPECT_EQ(st2.prefix_cache_hits, 1);
  EXPECT_EQ(st2.prefix_cache_hit_tokens, 192);
  EXPECT_EQ(st2.computed_prompt_tokens - st1.computed_prompt_tokens, 8);
  EXPECT_EQ(second.token_ids, fixture_greedy_ids(exp, 2));
  EXPECT_EQ(second.token_ids, first.token_ids);
  ASSERT_EQ(second.tokens.size(), first.tokens.size());
  for (size_t i = 0; i < first.tokens.size(); ++i) {
    EXPECT_NEAR(second.tokens[i].logprob, first.tokens[i].logprob, 1e-5) << i;
    ASSERT_EQ(second.tokens[i].alternatives.size(), 20u);
    for (size_t k = 0; k < 20; ++k) {
      EXPECT_EQ(second.tokens[i].alternatives[k].id, first.tokens[i].alternatives[k].id);
      EXPECT_NEAR(second.tokens[i].alternatives[k].logprob, first.tokens[i].alternatives[k].logprob,
                  1e-5);
    }
  }
  EXPECT_EQ(st2.kv_blocks_free, st2.kv_blocks_total);
  EXPECT_EQ(st2.kv_blocks_used, 0);
}

TEST(PrefixCache, WholePromptCachedStillComputesItsLastToken) {
  auto model = load_fixture("falcon7b-mqa-parallel");
  Expected exp("falcon7b-mqa-parallel");
  EngineOptions o;
  o.block_size = 1;  // every token is a full block: the whole prompt could match
  Engine engine(model, nullptr, o);
  const std::vector<int32_t>& prompt = exp.prompts[2];  // 33 tokens
  engine.submit(greedy_request(prompt, 12))->wait();
  const EngineStats st1 = stats_when_idle(engine);
  const GenerationResult r = engine.submit(greedy_request(prompt, 12))->wait();
  const EngineStats st2 = stats_when_idle(engine);
  EXPECT_EQ(st2.prefix_cache_hit_tokens, 32);
  EXPECT_EQ(st2.computed_prompt_tokens - st1.computed_prompt_tokens, 1);
  EXPECT_EQ(r.token_ids, fixture_greedy_ids(exp, 2));
}

TEST(PrefixCache, OffMeansNoSharing) {
  auto model = load_fixture("falcon40b-hd64-gqa");
  Expected exp("falcon40b-hd64-gqa");
  EngineOptions o;
  o.prefix_caching = false;
  Engine engine(model, nullptr, o);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(engine.submit(greedy_request(exp.prompts[1], 12))->wait().token_ids,
              fixture_greedy_ids(exp, 1));
  }
  const EngineStats st = stats_when_idle(engine);
  EXPECT_EQ(st.prefix_cache_hit_tokens, 0);
  EXPECT_EQ(st.computed_prompt_tokens, 180);
  EXPECT_EQ(st.kv_blocks_cached, 0);
}

// Requests sharing a 48-token prefix with distinct tails.
std::vector<std::vector<int32_t>> shared_prefix_prompts(int n, int64_t vocab) {
  std::mt19937 rng(11);
  std::vector<int32_t> prefix(48);
  for (auto& t : prefix) t = static_cast<int32_t>(rng() % vocab);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = prefix;
    for (int k = 0; k < 3 + i % 20; ++k) p.push_back(static_cast<int32_t>(rng() % vocab));
    out.push_back(std::move(p));
  }
  return out;
}

TEST(PrefixCache, PreemptionWithSharedPrefixesLosesNothing) {
  auto model = load_fixture("falcon40b-hd64-gqa");
  const auto prompts = shared_prefix_prompts(16, model->config().vocab_size);
  std::vector<std::vector<int32_t>> alone;
  {
    EngineOptions o;
    o.prefix_caching = false;
    Engine engine(model, nullptr, o);
    for (const auto& p : prompts) {
      alone.push_back(engine.submit(greedy_request(p, 24))->wait().token_ids);
    }
  }
  EngineOptions o;
  o.num_blocks = 20;  // 320 tokens for 16 requests of ~80
  o.max_input_length = 128;
  o.max_total_tokens = 160;
  // Admission bounded by blocks only (not by prompt + max_new_tokens per
  // request), so the sequences outgrow the cache while decoding and preemption
  // happens however the submissions and the steps interleave.
  o.max_batch_total_tokens = 1 << 20;
  Engine engine(model, nullptr, o);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (const auto& p : prompts) hs.push_back(engine.submit(greedy_request(p, 24)));
  for (size_t i = 0; i < hs.size(); ++i) EXPECT_EQ(hs[i]->wait().token_ids, alone[i]) << i;
  const EngineStats st = stats_when_idle(engine);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.prefix_cache_hit_tokens, 0);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

TEST(PrefixCache, CancelWithSharedPrefixesFreesBlocks) {
  auto model = load_fixture("falcon40b-hd64-gqa");
  const auto prompts = shared_prefix_prompts(16, model->config().vocab_size);
  EngineOptions o;
  o.num_blocks = 24;  // a few requests at a time: later ones find the prefix cached
  o.max_input_length = 128;
  o.max_total_tokens = 200;
  Engine engine(model, nullptr, o);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (const auto& p : prompts) hs.push_back(engine.submit(greedy_request(p, 64)));
  ASSERT_TRUE(hs[0]->next().has_value());
  for (size_t i = 0; i < hs.size(); i += 2) engine.cancel(hs[i]->id());
  for (size_t i = 0; i < hs.size(); ++i) {
    const GenerationResult r = hs[i]->wait();
    EXPECT_EQ(r.finish_reason, i % 2 ? FinishReason::kLength : FinishReason::kCancelled) << i;
  }
  const EngineStats st = stats_when_idle(engine);
  EXPECT_GT(st.prefix_cache_hit_tokens, 0);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

}  // namespace
}  // namespace kestrel
