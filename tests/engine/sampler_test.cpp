// Sampler: masks against a plain reference, draws against softmax(logits / T).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/sampler.h"

namespace kestrel {
namespace {

std::vector<float> softmax(const std::vector<float>& x) {
  float m = *std::max_element(x.begin(), x.end());
  std::vector<float> p(x.size());
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += p[i] = std::exp(x[i] - m);
  for (auto& v : p) v /= s;
  return p;
}

// Reference: sort once, walk the sorted list (transformers' warpers).
std::vector<bool> reference_mask(const SamplingParams& sp, const std::vector<float>& p) {
  const size_t n = p.size();
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  std::vector<bool> keep(n, false);
  size_t k = sp.top_k > 0 ? std::min<size_t>(sp.top_k, n) : n;
  double cum = 0;
  for (size_t r = 0; r < k; ++r) {
    if (r > 0 && cum >= sp.top_p) break;
    keep[idx[r]] = true;
    cum += p[idx[r]];
  }
  return keep;
}

TEST(Sampler, TopKTopPMasksEqualReference) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 2);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(50 + trial % 13);
    for (auto& v : x) v = nd(rng);
    SamplingParams sp;
    sp.top_k = trial % 3 == 0 ? 0 : 1 + trial % 17;
    sp.top_p = trial % 4 == 0 ? 1.0f : 0.3f + 0.1f * (trial % 7);
    auto p = softmax(x);
    EXPECT_EQ(sampling_mask(sp, p), reference_mask(sp, p)) << trial;
  }
}

TEST(Sampler, TypicalMaskKeepsSmallestTypicalSet) {
  std::vector<float> p{0.5f, 0.2f, 0.15f, 0.1f, 0.05f};
  SamplingParams sp;
  sp.typical_p = 0.5f;
  double h = 0;
  for (float v : p) h -= v * std::log(v);
  std::vector<size_t> idx(p.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    return std::abs(-std::log(p[a]) - h) < std::abs(-std::log(p[b]) - h);
  });
  std::vector<bool> want(p.size(), false);
  double mass = 0;
  for (size_t i : idx) {
    want[i] = true;
    mass += p[i];
    if (mass >= 0.5) break;
  }
  EXPECT_EQ(sampling_mask(sp, p), want);
}

// top_k 1 keeps the most likely token; typical_p 0.2 keeps only middle ones
// (closest to the entropy): nothing survives both. A token is still drawn
// (the most likely, as on CUDA), never -1 (schemathesis found it as a 500).
TEST(Sampler, DisjointTopKAndTypicalStillGiveAToken) {
  std::vector<float> logits;
  logits.push_back(std::log(0.4f));
  for (int i = 0; i < 10; ++i) logits.push_back(std::log(0.03f));
  for (int i = 0; i < 3000; ++i) logits.push_back(std::log(1e-4f));
  SamplingParams sp;
  sp.do_sample = true;
  sp.top_k = 1;
  sp.typical_p = 0.2f;
  const std::vector<bool> keep = sampling_mask(sp, softmax(logits));
  EXPECT_EQ(std::count(keep.begin(), keep.end(), true), 0);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(sp, logits.data(), logits.size(), rng).id, 0);
}

TEST(Sampler, FrequenciesFollowSoftmaxOverTemperature) {
  std::vector<float> logits{1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 0.2f};
  SamplingParams sp;
  sp.do_sample = true;
  sp.temperature = 0.7f;
  std::vector<float> scaled(logits);
  for (auto& v : scaled) v /= sp.temperature;
  auto p = softmax(scaled);
  std::mt19937_64 rng(42);
  const int n = 60000;
  std::vector<int> count(logits.size());
  for (int i = 0; i < n; ++i) ++count[sample_token(sp, logits.data(), logits.size(), rng).id];
  double chi2 = 0;
  for (size_t i = 0; i < p.size(); ++i) chi2 += std::pow(count[i] - n * p[i], 2) / (n * p[i]);
  EXPECT_LT(chi2, 20.5);  // chi-square, 5 dof, p = 0.001
}

TEST(Sampler, GreedyAndPenalties) {
  std::vector<float> logits{1.0f, 3.0f, -2.0f, 2.9f};
  SamplingParams sp;
  std::mt19937_64 rng(0);
  EXPECT_EQ(sample_token(sp, logits.data(), 4, rng).id, 1);
  sp.repetition_penalty = 2.0f;
  std::unordered_map<int32_t, int32_t> seen{{1, 1}, {2, 1}};
  apply_penalties(sp, seen, {}, logits.data(), 4);
  EXPECT_FLOAT_EQ(logits[1], 1.5f);   // positive: divided
  EXPECT_FLOAT_EQ(logits[2], -4.0f);  // negative: multiplied
  EXPECT_EQ(sample_token(sp, logits.data(), 4, rng).id, 3);
  SamplingParams fp;
  fp.frequency_penalty = 0.5f;
  fp.presence_penalty = 0.25f;
  apply_penalties(fp, {}, {{3, 2}}, logits.data(), 4);
  EXPECT_FLOAT_EQ(logits[3], 2.9f - 1.0f - 0.25f);
}

TEST(Sampler, ValidationNamesTheField) {
  SamplingParams sp;
  sp.temperature = -1;
  try {
    validate(sp);
    FAIL();
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "temperature");
  }
}

}  // namespace
}  // namespace kestrel
