// The GPU sampler (ops::sample_on_device, ops::greedy_rows and engine
// sample_rows on CUDA logits) against the CPU sampler, which is the reference:
// the same top_k / top_p / typical_p masks, the same seeded tokens, logprobs
// and alternatives, penalties, and the drawn distribution. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "engine/sampler.h"

namespace kestrel {
namespace {

#define REQUIRE_GPU()                                                            \
  do {                                                                           \
    if (ops::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible"; \
  } while (0)

Tensor random_logits(int64_t n, int64_t vocab, float spread, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, spread);
  Tensor t = Tensor::empty(DType::kF32, {n, vocab});
  for (int64_t i = 0; i < n * vocab; ++i) t.data<float>()[i] = d(g);
  return t;
}

std::vector<float> cpu_probs(const SamplingParams& p, const float* row, int64_t vocab) {
  std::vector<float> x(row, row + vocab);
  if (p.do_sample && p.temperature != 1.0f)
    for (float& v : x) v /= p.temperature;
  const float m = *std::max_element(x.begin(), x.end());
  std::vector<float> pr(vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += pr[i] = std::exp(x[i] - m);
  for (float& v : pr) v = static_cast<float>(v / sum);
  return pr;
}

std::vector<SamplingParams> param_cases() {
  std::vector<SamplingParams> out;
  auto add = [&](float t, int32_t k, float p, float typ) {
    SamplingParams s;
    s.do_sample = true;
    s.temperature = t;
    s.top_k = k;
    s.top_p = p;
    s.typical_p = typ;
    out.push_back(s);
  };
  add(1.0f, 0, 1.0f, 1.0f);   // plain sampling
  add(0.7f, 50, 1.0f, 1.0f);  // top_k
  add(1.3f, 0, 0.9f, 1.0f);   // top_p
  add(1.0f, 0, 1.0f, 0.8f);   // typical
  add(0.5f, 40, 0.95f, 1.0f);
  add(1.0f, 1000, 0.5f, 0.9f);  // all three
  add(2.0f, 1, 1.0f, 1.0f);     // top_k 1
  add(1.0f, 50, 0.9f, 0.5f);    // sequential: top_p and typical over the survivors
  add(1.0f, 1, 1.0f, 0.2f);     // typical over top_k's one survivor
  return out;
}

TEST(SamplerCuda, MasksAndSeededTokensMatchCpu) {
  REQUIRE_GPU();
  const std::vector<SamplingParams> cases = param_cases();
  for (int64_t vocab : {1000, 65024}) {
    const int64_t n = static_cast<int64_t>(cases.size()) * 3;
    const Tensor logits = random_logits(n, vocab, vocab > 1000 ? 3.0f : 2.0f, 11 + vocab);
    std::vector<ops::SampleSpec> specs;
    std::vector<SamplingParams> params;
    std::vector<uint64_t> seeds;
    std::unordered_map<int32_t, int32_t> none;
    for (int64_t r = 0; r < n; ++r) {
      SamplingParams p = cases[r % cases.size()];
      p.top_n_tokens = r % 4 == 0 ? 5 : 0;
      params.push_back(p);
      seeds.push_back(1000 + r);
      std::mt19937_64 g(seeds.back());
      specs.push_back(device_spec(p, none, none, g));
    }
    std::vector<uint8_t> masks;
    const std::vector<ops::SampleResult> got =
        ops::sample_on_device(ops::to_device(logits, Device::kCuda), specs, &masks);
    int same_ids = 0;
    for (int64_t r = 0; r < n; ++r) {
      const float* row = logits.data<float>() + r * vocab;
      const std::vector<float> probs = cpu_probs(params[r], row, vocab);
      const std::vector<bool> keep = sampling_mask(params[r], probs);
      int64_t diff = 0;
      for (int64_t i = 0; i < vocab; ++i) diff += (masks[r * vocab + i] != 0) != keep[i];
      EXPECT_EQ(diff, 0) << "mask of row " << r << " (vocab " << vocab << ")";
      std::mt19937_64 g(seeds[r]);
      const SampledToken want = sample_token(params[r], row, vocab, g);
      same_ids += got[r].id == want.id;
      EXPECT_TRUE(keep[got[r].id]) << "row " << r << " drew a masked token";
      EXPECT_NEAR(got[r].logprob, std::log(std::max(probs[got[r].id], 1e-38f)), 1e-4)
          << "row " << r;
      ASSERT_EQ(got[r].alternatives.size(), want.alternatives.size()) << "row " << r;
      for (size_t j = 0; j < want.alternatives.size(); ++j) {
        EXPECT_EQ(got[r].alternatives[j].first, want.alternatives[j].first) << "row " << r;
        EXPECT_NEAR(got[r].alternatives[j].second, want.alternatives[j].second, 1e-4);
      }
    }
    // The walk in id order over the same u: only a draw within rounding of a
    // boundary may differ.
    EXPECT_GE(same_ids, n - 1) << "vocab " << vocab;
  }
}

// The hand-computed sequential cases of sampler_test (and boundary ties): the
// device masks equal the CPU's, and those the hand-computed ones.
TEST(SamplerCuda, SequentialHandCasesMatchCpu) {
  REQUIRE_GPU();
  struct Case {
    std::vector<float> p;
    int32_t k;
    float top_p, typical;
    std::vector<bool> want;
  };
  const std::vector<Case> cases = {
      {{0.35f, 0.2f, 0.1f, 0.09f, 0.09f, 0.09f, 0.08f}, 3, 0.5f, 1.0f, {1, 0, 0, 0, 0, 0, 0}},
      {{0.5f, 0.2f, 0.15f, 0.1f, 0.05f}, 0, 0.9f, 0.5f, {1, 1, 0, 0, 0}},
      {{0.4f, 0.2f, 0.15f, 0.1f, 0.08f, 0.07f}, 3, 0.75f, 0.5f, {1, 0, 0, 0, 0, 0}},
      {{0.3f, 0.2f, 0.2f, 0.2f, 0.1f}, 2, 1.0f, 1.0f, {1, 1, 1, 1, 0}},
      {{0.25f, 0.25f, 0.25f, 0.25f}, 0, 1.0f, 0.3f, {1, 1, 1, 1}},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const int64_t vocab = static_cast<int64_t>(cases[c].p.size());
    Tensor logits = Tensor::empty(DType::kF32, {1, vocab});
    for (int64_t i = 0; i < vocab; ++i) logits.data<float>()[i] = std::log(cases[c].p[i]);
    SamplingParams sp;
    sp.do_sample = true;
    sp.top_k = cases[c].k;
    sp.top_p = cases[c].top_p;
    sp.typical_p = cases[c].typical;
    std::unordered_map<int32_t, int32_t> none;
    std::mt19937_64 g(3);
    const std::vector<ops::SampleSpec> specs{device_spec(sp, none, none, g)};
    std::vector<uint8_t> masks;
    const std::vector<ops::SampleResult> got =
        ops::sample_on_device(ops::to_device(logits, Device::kCuda), specs, &masks);
    const std::vector<bool> keep = sampling_mask(sp, cpu_probs(sp, logits.data<float>(), vocab));
    EXPECT_EQ(keep, cases[c].want) << "case " << c;
    for (int64_t i = 0; i < vocab; ++i)
      EXPECT_EQ(masks[i] != 0, keep[i]) << "case " << c << " token " << i;
    EXPECT_TRUE(keep[got[0].id]) << "case " << c;
  }
}

TEST(SamplerCuda, PenaltiesAndGreedyMatchCpu) {
  REQUIRE_GPU();
  const int64_t vocab = 65024, n = 6;
  const Tensor logits = random_logits(n, vocab, 2.0f, 5);
  std::unordered_map<int32_t, int32_t> seen, generated;
  for (int64_t r = 0; r < n; ++r) {
    // Make the penalised tokens the leaders, so that the penalty decides.
    for (int32_t id : {7, 123, 4000, 65000}) logits.data<float>()[r * vocab + id] = 12.0f - r;
  }
  seen = {{7, 2}, {123, 1}, {4000, 1}, {65000, 3}, {9, 1}};
  generated = {{7, 2}, {65000, 1}};
  std::vector<SampleRow> rows;
  std::vector<SamplingParams> params(n);
  std::vector<std::mt19937_64> rngs, rngs_cpu;
  for (int64_t r = 0; r < n; ++r) {
    params[r].repetition_penalty = r % 2 ? 1.3f : 1.0f;
    params[r].frequency_penalty = r % 3 == 1 ? 0.8f : 0.0f;
    params[r].presence_penalty = r % 3 == 2 ? 1.5f : 0.0f;
    params[r].do_sample = r >= 4;
    params[r].top_k = r >= 4 ? 20 : 0;
    rngs.emplace_back(77 + r);
    rngs_cpu.emplace_back(77 + r);
  }
  for (int64_t r = 0; r < n; ++r) rows.push_back({&params[r], &seen, &generated, &rngs[r]});
  const std::vector<SampledToken> got = sample_rows(ops::to_device(logits, Device::kCuda), rows);
  std::vector<SampleRow> cpu_rows;
  for (int64_t r = 0; r < n; ++r) cpu_rows.push_back({&params[r], &seen, &generated, &rngs_cpu[r]});
  const std::vector<SampledToken> want = sample_rows(logits, cpu_rows);
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_EQ(got[r].id, want[r].id) << "row " << r;
    EXPECT_NEAR(got[r].logprob, want[r].logprob, 1e-4) << "row " << r;
  }
  // Plain greedy rows take ops::greedy_rows: the same ids and logprobs.
  SamplingParams g;
  std::vector<SamplingParams> gp(n, g);
  std::vector<SampleRow> grows, grows_cpu;
  for (int64_t r = 0; r < n; ++r) {
    grows.push_back({&gp[r], &seen, &generated, &rngs[r]});
    grows_cpu.push_back({&gp[r], &seen, &generated, &rngs_cpu[r]});
  }
  const Tensor l2 = random_logits(n, vocab, 4.0f, 6);
  const std::vector<SampledToken> g_got = sample_rows(ops::to_device(l2, Device::kCuda), grows);
  const std::vector<SampledToken> g_want = sample_rows(l2, grows_cpu);
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_EQ(g_got[r].id, g_want[r].id) << "row " << r;
    EXPECT_NEAR(g_got[r].logprob, g_want[r].logprob, 1e-4) << "row " << r;
  }
}

// Many seeded draws from one small distribution: the frequencies follow the
// CPU's masked, renormalised probabilities (each within 5 sigma).
TEST(SamplerCuda, SeededDrawsFollowTheDistribution) {
  REQUIRE_GPU();
  const int64_t vocab = 12, n = 20000;
  const Tensor one = random_logits(1, vocab, 1.0f, 3);
  Tensor logits = Tensor::empty(DType::kF32, {n, vocab});
  for (int64_t r = 0; r < n; ++r)
    std::copy_n(one.data<float>(), vocab, logits.data<float>() + r * vocab);
  SamplingParams p;
  p.do_sample = true;
  p.temperature = 0.8f;
  p.top_k = 8;
  p.top_p = 0.9f;
  std::vector<ops::SampleSpec> specs;
  std::mt19937_64 g(2024);
  std::unordered_map<int32_t, int32_t> none;
  for (int64_t r = 0; r < n; ++r) specs.push_back(device_spec(p, none, none, g));
  const std::vector<ops::SampleResult> got =
      ops::sample_on_device(ops::to_device(logits, Device::kCuda), specs);
  const std::vector<float> probs = cpu_probs(p, one.data<float>(), vocab);
  const std::vector<bool> keep = sampling_mask(p, probs);
  double total = 0;
  for (int64_t i = 0; i < vocab; ++i) total += keep[i] ? probs[i] : 0.0;
  std::vector<int64_t> counts(vocab, 0);
  for (const auto& s : got) ++counts.at(s.id);
  for (int64_t i = 0; i < vocab; ++i) {
    const double q = keep[i] ? probs[i] / total : 0.0;
    const double sigma = std::sqrt(n * q * (1 - q)) + 1e-9;
    if (!keep[i]) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " is masked";
    }
    EXPECT_NEAR(static_cast<double>(counts[i]), n * q, 5 * sigma + 1) << "token " << i;
  }
}

}  // namespace
}  // namespace kestrel
