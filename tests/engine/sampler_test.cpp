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
  // top_p sees the top-k survivors renormalised.
  double mass = 0;
  for (size_t r = 0; r < k; ++r) mass += p[idx[r]];
  double cum = 0;
  for (size_t r = 0; r < k; ++r) {
    if (r > 0 && cum / mass >= sp.top_p) break;
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

// top_k 1 keeps the most likely token; typical_p 0.2 alone would keep only
// middle ones (closest to the entropy). In sequence typical runs over top_k's
// one survivor, so that token stays and is drawn (the intersected masks of
// 1058ff0 were disjoint here: -1 was returned, a 500).
TEST(Sampler, TopKThenTypicalKeepsTheTopKSurvivor) {
  std::vector<float> logits;
  logits.push_back(std::log(0.4f));
  for (int i = 0; i < 10; ++i) logits.push_back(std::log(0.03f));
  for (int i = 0; i < 3000; ++i) logits.push_back(std::log(1e-4f));
  SamplingParams sp;
  sp.do_sample = true;
  sp.typical_p = 0.2f;
  const std::vector<bool> typical_alone = sampling_mask(sp, softmax(logits));
  EXPECT_FALSE(typical_alone[0]);
  sp.top_k = 1;
  const std::vector<bool> keep = sampling_mask(sp, softmax(logits));
  EXPECT_EQ(std::count(keep.begin(), keep.end(), true), 1);
  EXPECT_TRUE(keep[0]);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(sp, logits.data(), logits.size(), rng).id, 0);
}

// Cases where the sequential warpers (transformers / TGI) and masks computed
// on the unfiltered softmax and intersected differ; the expected masks are
// worked out by hand in the comments.
TEST(Sampler, SequentialWarpersHandComputed) {
  const std::vector<float> p1{0.35f, 0.2f, 0.1f, 0.09f, 0.09f, 0.09f, 0.08f};
  SamplingParams a;
  a.top_k = 3;     // survivors 0,1,2: mass 0.65, q0 = 0.538 >= 0.5: only 0 stays
  a.top_p = 0.5f;  // (intersected: mass before 1 is 0.35 < 0.5, {0, 1})
  EXPECT_EQ(sampling_mask(a, p1), (std::vector<bool>{1, 0, 0, 0, 0, 0, 0}));

  const std::vector<float> p2{0.5f, 0.2f, 0.15f, 0.1f, 0.05f};
  SamplingParams b;
  b.top_p = 0.9f;      // survivors 0..3 (mass before 3 is 0.85), q = .526 .211 .158 .105
  b.typical_p = 0.5f;  // H(q) = 1.194, deviations .552 .364 .652 1.057: ranks 1, 0 reach .737
  // (intersected: typical over p keeps 1, 2, 0, so {0, 1, 2})
  EXPECT_EQ(sampling_mask(b, p2), (std::vector<bool>{1, 1, 0, 0, 0}));

  const std::vector<float> p3{0.4f, 0.2f, 0.15f, 0.1f, 0.08f, 0.07f};
  SamplingParams c;
  c.top_k = 3;         // survivors 0,1,2: q = .533 .267 .2
  c.top_p = 0.75f;     // mass before 2 is .8 >= .75: survivors 0, 1, q = .667 .333
  c.typical_p = 0.5f;  // H = .637, deviations .231 .462: rank 0 alone reaches .667
  // (intersected: top_k {0,1,2}, top_p {0,1,2}, typical {1,2,0}: {0, 1, 2})
  EXPECT_EQ(sampling_mask(c, p3), (std::vector<bool>{1, 0, 0, 0, 0, 0}));
}

// transformers' top_k keeps every token tied with the k-th score; typical keeps
// every token whose deviation ties the boundary one.
TEST(Sampler, TiesAtTheBoundaryStay) {
  SamplingParams k;
  k.top_k = 2;
  EXPECT_EQ(sampling_mask(k, {0.3f, 0.2f, 0.2f, 0.2f, 0.1f}), (std::vector<bool>{1, 1, 1, 1, 0}));
  SamplingParams t;
  t.typical_p = 0.3f;  // four equal tokens: all deviate 0 from H, all tie
  EXPECT_EQ(sampling_mask(t, {0.25f, 0.25f, 0.25f, 0.25f}), (std::vector<bool>{1, 1, 1, 1}));
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
