// The merge of LoRA adapters (src/lora/merge.h) against peft's add_weighted_adapter: the fixtures
// of tests/data/merge-falcon7b (made by tests/data/make_merge_references.py), the statistics of
// DARE's random pruning, seeds, and the refusals.
#include "lora/merge.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "../model/fixture_util.h"
#include "../test_data.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "merge_fixture.h"
#include "model/falcon_model.h"
#include "model/runner.h"

namespace kestrel {
namespace {

using nlohmann::json;

constexpr int64_t kLayers = 2;  // falcon7b-mqa-parallel

std::string merge_dir() {
  return test::test_data_dir() + "/merge-falcon7b";
}

const json& fixture() {
  static const json j = [] {
    std::ifstream in(merge_dir() + "/fixture.json");
    return json::parse(in);
  }();
  return j;
}

// Copies a stored F32 tensor into one of its own.
Tensor copy_f32(const WeightStore& store, const std::string& key) {
  const Tensor src = store.borrow(key);
  EXPECT_EQ(src.dtype(), DType::kF32) << key;
  Tensor t = Tensor::empty(DType::kF32, src.shape());
  std::memcpy(t.raw(), src.raw(), t.nbytes());
  return t;
}

// An adapter folder of the fixture on the host, as a caller of merge_adapters reads it.
const HostLoraAdapter& host_adapter(const std::string& name) {
  static std::map<std::string, HostLoraAdapter> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const std::string dir = merge_dir() + "/adapters/" + name;
  HostLoraAdapter a;
  a.config = LoraConfig::from_file(dir + "/adapter_config.json");
  const WeightStore store = WeightStore::open_file(dir + "/adapter_model.safetensors");
  a.layers.resize(kLayers);
  for (int64_t layer = 0; layer < kLayers; ++layer)
    for (int m = 0; m < kLoraModules; ++m) {
      const auto mod = static_cast<LoraModule>(m);
      if (!a.config.targets(layer, mod)) continue;
      const std::string key = "base_model.model." + lora_module_key(layer, mod);
      LoraFactors& f = a.layers[layer][m];
      f.a = copy_f32(store, key + ".lora_A.weight");
      f.b = copy_f32(store, key + ".lora_B.weight");
      f.scale = a.config.scale_for(layer, mod);
    }
  return cache.emplace(name, std::move(a)).first->second;
}

std::vector<const HostLoraAdapter*> adapters_of(const json& ids) {
  std::vector<const HostLoraAdapter*> out;
  for (const auto& id : ids) out.push_back(&host_adapter(id.get<std::string>()));
  return out;
}

MergeSpec spec_of(const json& merge) {
  return test::merge_spec_of(merge);
}

MergedLora run_merge(const MergeSpec& spec, const json& ids) {
  const auto adapters = adapters_of(ids);
  return merge_adapters(spec, adapters);
}

float max_abs_diff(const Tensor& x, const Tensor& y) {
  EXPECT_EQ(shape_str(x.shape()), shape_str(y.shape()));
  if (x.shape() != y.shape()) return INFINITY;
  float d = 0.0f;
  for (int64_t i = 0; i < x.numel(); ++i)
    d = std::max(d, std::fabs(x.data<float>()[i] - y.data<float>()[i]));
  return d;
}

bool same_bytes(const Tensor& x, const Tensor& y) {
  return x.shape() == y.shape() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

bool same_merge(const MergedLora& x, const MergedLora& y) {
  for (int64_t l = 0; l < kLayers; ++l)
    for (int m = 0; m < kLoraModules; ++m) {
      const LoraFactors &p = x.layers[l][m], &q = y.layers[l][m];
      if (p.defined() != q.defined()) return false;
      if (p.defined() && !(same_bytes(p.a, q.a) && same_bytes(p.b, q.b))) return false;
    }
  return true;
}

// Every merge of the fixture: rank, scale, the modules and every A and B within 1e-5 of peft's
// (DARE at density 0.5 too: the references drew peft's mask from kestrel's stream).
TEST(MergeFixture, EveryMergeMatchesPeft) {
  int checked = 0;
  float worst = 0.0f;
  for (const auto& [name, merge] : fixture().at("merges").items()) {
    SCOPED_TRACE(name);
    const MergeSpec spec = spec_of(merge);
    const MergedLora got = run_merge(spec, merge.at("adapters"));
    EXPECT_EQ(got.rank, merge.at("rank").get<int64_t>());
    EXPECT_NEAR(got.scale, merge.at("scale").get<double>(), 1e-12);
    EXPECT_EQ(got.use_rslora, merge.at("use_rslora").get<bool>());
    if (spec.ids.size() == 1) {
      EXPECT_EQ(got.strategy, MergeStrategy::kLinear);
    }
    const auto expected_modules = merge.at("modules").get<std::set<std::string>>();
    const WeightStore want =
        WeightStore::open_file(merge_dir() + "/expected_" + name + ".safetensors");
    std::set<std::string> got_modules;
    for (int64_t layer = 0; layer < kLayers; ++layer)
      for (int m = 0; m < kLoraModules; ++m) {
        const LoraFactors& f = got.layers[layer][m];
        if (!f.defined()) continue;
        const std::string key = lora_module_key(layer, static_cast<LoraModule>(m));
        got_modules.insert(key);
        if (!expected_modules.count(key)) continue;
        EXPECT_EQ(f.scale, got.scale);
        const float da = max_abs_diff(f.a, want.borrow(key + ".lora_A"));
        const float db = max_abs_diff(f.b, want.borrow(key + ".lora_B"));
        EXPECT_LE(da, 1e-5f) << key << " A";
        EXPECT_LE(db, 1e-5f) << key << " B";
        worst = std::max({worst, da, db});
        ++checked;
      }
    EXPECT_EQ(got_modules, expected_modules);
  }
  EXPECT_GE(checked, 100);
  std::printf("%d modules of %zu merges, largest |kestrel - peft| %g\n", checked,
              fixture().at("merges").size(), worst);
}

// Density 1 makes DARE deterministic: dare_linear is linear, dare_ties is ties without pruning;
// and its result does not depend on the seed.
TEST(MergeFixture, DareAtDensityOneIsDeterministic) {
  const json& merges = fixture().at("merges");
  for (const char* name : {"dare_linear_d1", "dare_ties_total_d1", "dare_ties_frequency_d1"}) {
    SCOPED_TRACE(name);
    MergeSpec spec = spec_of(merges.at(name));
    const MergedLora one = run_merge(spec, merges.at(name).at("adapters"));
    spec.seed = 987654321;
    EXPECT_TRUE(same_merge(one, run_merge(spec, merges.at(name).at("adapters"))));
  }
  MergeSpec linear = spec_of(merges.at("dare_linear_d1"));
  const MergedLora dare = run_merge(linear, merges.at("dare_linear_d1").at("adapters"));
  linear.strategy = MergeStrategy::kLinear;
  EXPECT_TRUE(same_merge(dare, run_merge(linear, merges.at("dare_linear_d1").at("adapters"))));
}

// At density 0.5 a merged entry is zero only when every adapter's entry was dropped: the
// fraction of non-zero entries of a module with n adapters is 1 - 0.5^n, within sampling error,
// over seeds; and close to what peft drew with torch's own generator.
TEST(MergeFixture, DareKeptFractionIsTheDensity) {
  const json& torchrng = fixture().at("dare_linear_d05_torchrng");
  MergeSpec spec;
  spec.ids = torchrng.at("adapters").get<std::vector<std::string>>();
  spec.weights = torchrng.at("weights").get<std::vector<double>>();
  spec.strategy = MergeStrategy::kDareLinear;
  spec.density = torchrng.at("density").get<double>();
  for (uint64_t seed : {1u, 2u, 3u}) {
    spec.seed = seed;
    const MergedLora got = run_merge(spec, torchrng.at("adapters"));
    std::map<int, std::pair<int64_t, int64_t>> counts;  // adapters -> (non-zero, entries)
    for (int64_t layer = 0; layer < kLayers; ++layer)
      for (int m = 0; m < kLoraModules; ++m) {
        if (!got.layers[layer][m].defined()) continue;
        int n = 0;
        for (const auto& id : spec.ids) n += host_adapter(id).layers[layer][m].defined();
        for (const Tensor* t : {&got.layers[layer][m].a, &got.layers[layer][m].b}) {
          auto& c = counts[n];
          for (int64_t i = 0; i < t->numel(); ++i) c.first += t->data<float>()[i] != 0.0f;
          c.second += t->numel();
        }
      }
    ASSERT_EQ(counts.size(), 3u);
    for (const auto& [n, c] : counts) {
      SCOPED_TRACE(testing::Message() << "seed " << seed << ", " << n << " adapters");
      const double p = 1.0 - std::pow(1.0 - spec.density, n);
      const double frac = static_cast<double>(c.first) / static_cast<double>(c.second);
      const double sigma = std::sqrt(p * (1 - p) / static_cast<double>(c.second));
      EXPECT_NEAR(frac, p, 5 * sigma);
      const std::string key = std::to_string(n);
      EXPECT_EQ(c.second, torchrng.at("entries_by_adapter_count").at(key).get<int64_t>());
      const double peft = torchrng.at("nonzero_fraction_by_adapter_count").at(key).get<double>();
      EXPECT_NEAR(frac, peft, 5 * std::sqrt(2.0) * sigma);
    }
  }
}

TEST(MergeOps, RandomPruneKeepsTheDensityAndRescales) {
  for (double density : {0.1, 0.3, 0.5, 0.9}) {
    SCOPED_TRACE(density);
    std::vector<float> t(100000, 1.0f);
    std::mt19937_64 rng(42);
    merge_ops::random_prune(t, density, /*rescale=*/true, rng);
    int64_t kept = 0;
    for (float x : t) {
      if (x != 0.0f) {
        ++kept;
        EXPECT_EQ(x, 1.0f / static_cast<float>(density));
      }
    }
    const double sigma = std::sqrt(density * (1 - density) / 1e5);
    EXPECT_NEAR(static_cast<double>(kept) / 1e5, density, 5 * sigma);
  }
  std::vector<float> t = {1, -2, 3};
  std::mt19937_64 rng(1);
  merge_ops::random_prune(t, 1.0, true, rng);
  EXPECT_EQ(t, (std::vector<float>{1, -2, 3}));
}

TEST(MergeOps, MagnitudePruneKeepsIntOfDensityTimesSize) {
  std::vector<float> t = {0.5f, -3.0f, 1.0f, 2.0f, -0.25f};
  merge_ops::magnitude_prune(t, 0.5);  // int(2.5) = 2: -3 and 2
  EXPECT_EQ(t, (std::vector<float>{0, -3, 0, 2, 0}));
  std::vector<float> u = {0.5f, -3.0f};
  merge_ops::magnitude_prune(u, 0.0);
  EXPECT_EQ(u, (std::vector<float>{0, 0}));
}

// ties by hand: pruned tasks {2, -1}, {-3, 0}, {1, 4}; total elects sign(0) = + for entry 0
// (2 - 3 + 1 = 0), frequency + (two of three); entry 1: -1 + 0 + 4 > 0.
TEST(MergeOps, TiesElectsOnUnweightedTasks) {
  const std::vector<std::vector<float>> tasks = {{2, -1}, {-3, 0}, {1, 4}};
  const std::vector<float> w = {1.0f, 2.0f, -1.0f};
  const auto total =
      merge_ops::combine(MergeStrategy::kTies, tasks, w, 1.0, MajoritySignMethod::kTotal, nullptr);
  EXPECT_FLOAT_EQ(total[0], (2 * 1 + 1 * -1) / 2.0f);
  EXPECT_FLOAT_EQ(total[1], 4 * -1 / 1.0f);
  const auto freq = merge_ops::combine(MergeStrategy::kTies, {{2}, {-3}, {-1}}, w, 1.0,
                                       MajoritySignMethod::kFrequency, nullptr);
  EXPECT_FLOAT_EQ(freq[0], (-3 * 2 + -1 * -1) / 2.0f);
  const auto lin = merge_ops::combine(MergeStrategy::kLinear, tasks, w, 1.0,
                                      MajoritySignMethod::kTotal, nullptr);
  EXPECT_FLOAT_EQ(lin[0], 2 - 6 - 1);
}

TEST(MergeFixture, SameSeedSameMergeOtherSeedOther) {
  const json& merges = fixture().at("merges");
  for (const char* name : {"dare_linear_d05", "dare_ties_total_d05", "dare_ties_frequency_d05"}) {
    SCOPED_TRACE(name);
    MergeSpec spec = spec_of(merges.at(name));
    const json& ids = merges.at(name).at("adapters");
    const MergedLora a = run_merge(spec, ids);
    EXPECT_TRUE(same_merge(a, run_merge(spec, ids)));
    spec.seed += 1;
    EXPECT_FALSE(same_merge(a, run_merge(spec, ids)));
  }
  // Without randomness the seed does not matter.
  MergeSpec ties = spec_of(merges.at("ties_total"));
  const MergedLora a = run_merge(ties, merges.at("ties_total").at("adapters"));
  ties.seed = 77;
  EXPECT_TRUE(same_merge(a, run_merge(ties, merges.at("ties_total").at("adapters"))));
}

// The merged adapter in the CPU forward pass: the logits transformers + peft compute for the base
// model plus peft's merged adapter (float32) on the fixture's prompt.
TEST(MergeFixture, MergedAdapterGivesPeftLogits) {
  const json& fx = fixture();
  const FalconModel model = FalconModel::load(merge_dir() + "/" + fx.at("base").get<std::string>());
  ASSERT_EQ(model.config().n_layers, kLayers);
  const std::vector<int32_t> prompt = fx.at("prompt_ids").get<std::vector<int32_t>>();
  const int64_t vocab = model.config().vocab_size;
  for (const auto& [name, change] : fx.at("max_logit_change_vs_base").items()) {
    SCOPED_TRACE(name);
    const json& merge = fx.at("merges").at(name);
    const MergedLora merged = run_merge(spec_of(merge), merge.at("adapters"));
    LoraAdapter adapter("merged-" + name, "", 1, kLayers);
    for (int64_t layer = 0; layer < kLayers; ++layer)
      for (int m = 0; m < kLoraModules; ++m) {
        const LoraFactors& f = merged.layers[layer][m];
        if (!f.defined()) continue;
        LoraLinear& l = adapter.mutable_linear(0, layer, static_cast<LoraModule>(m));
        l.a = f.a;
        l.b = f.b;
        l.scale = static_cast<float>(f.scale);
      }
    RunnerOptions opt;
    opt.adapters = {&adapter};
    BatchRunner runner(model, {prompt}, 0, opt);
    const Tensor logits = runner.prefill(/*all_logits=*/true);
    const WeightStore want =
        WeightStore::open_file(merge_dir() + "/expected_logits_" + name + ".safetensors");
    const Tensor ref = want.borrow("logits");
    ASSERT_EQ(shape_str(logits.shape()), shape_str(ref.shape()));
    ASSERT_EQ(ref.dim(1), vocab);
    const double err = test::rel_error(logits, ref);
    EXPECT_LE(err, 1e-4);
    std::printf("%s: logits within %.3g (relative) of peft's\n", name.c_str(), err);
    EXPECT_GT(change.get<double>(), 0.5);  // the merge moved the logits far from the base's
  }
}

// Expects a ValidationError on `field` whose message holds every one of `parts`.
template <typename F>
void expect_refused(F&& f, const std::string& field, std::vector<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "not refused; expected " << field;
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "\"" << p << "\" not in: " << e.what();
  }
}

TEST(MergeSpec, Refusals) {
  MergeSpec ok;
  ok.ids = {"a", "b"};
  ok.weights = {0.5, 0.5};
  EXPECT_NO_THROW(ok.validate());

  MergeSpec s = ok;
  s.ids.clear();
  s.weights.clear();
  expect_refused([&] { s.validate(); }, "merged_adapters.ids", {"at least one"});
  s = ok;
  s.weights = {1.0};
  expect_refused([&] { s.validate(); }, "merged_adapters.weights", {"1 values for 2"});
  s = ok;
  s.weights = {1.0, NAN};
  expect_refused([&] { s.validate(); }, "merged_adapters.weights", {"not finite"});
  for (double d : {-0.1, 1.5, static_cast<double>(NAN)}) {
    s = ok;
    s.strategy = MergeStrategy::kTies;
    s.density = d;
    expect_refused([&] { s.validate(); }, "merged_adapters.density", {"outside [0, 1]"});
  }
  s = ok;
  s.strategy = MergeStrategy::kDareTies;
  s.density = 0.0;
  expect_refused([&] { s.validate(); }, "merged_adapters.density", {"dare_ties", "NaN"});
  s.strategy = MergeStrategy::kTies;  // prunes everything: allowed, as peft
  EXPECT_NO_THROW(s.validate());
  s.density = 1.0;
  EXPECT_NO_THROW(s.validate());

  expect_refused([] { parse_merge_strategy("svd"); }, "merged_adapters.merge_strategy",
                 {"\"svd\"", "linear, ties, dare_linear, dare_ties, cat"});
  expect_refused([] { parse_majority_sign_method("mean"); }, "merged_adapters.majority_sign_method",
                 {"\"mean\"", "total, frequency"});
  for (const char* n : {"linear", "ties", "dare_linear", "dare_ties", "cat"})
    EXPECT_STREQ(merge_strategy_name(parse_merge_strategy(n)), n);

  // Equal ranks: one adapter alone is linear, so any rank; cat takes any.
  s = ok;
  s.strategy = MergeStrategy::kTies;
  const std::vector<int64_t> ranks = {4, 2};
  expect_refused([&] { s.validate_ranks(ranks); }, "merged_adapters.ids",
                 {"\"a\" has rank 4", "\"b\" rank 2", "equal ranks", "ties"});
  s.strategy = MergeStrategy::kCat;
  EXPECT_NO_THROW(s.validate_ranks(ranks));
}

// The fixture's refusals: what peft refuses, kestrel refuses with the field named.
TEST(MergeFixture, PeftRefusalsAreRefused) {
  const json& refused = fixture().at("refused");
  for (const char* name : {"linear_unequal_ranks", "ties_unequal_ranks"}) {
    SCOPED_TRACE(name);
    const MergeSpec spec = spec_of(refused.at(name));
    expect_refused([&] { run_merge(spec, refused.at(name).at("adapters")); }, "merged_adapters.ids",
                   {"rank 4", "rank 2", "equal ranks"});
    MergeSpec cat = spec;
    cat.strategy = MergeStrategy::kCat;
    EXPECT_EQ(run_merge(cat, refused.at(name).at("adapters")).rank, 6);
  }
  for (const char* name : {"linear_module_nobody_has", "cat_module_nobody_has"}) {
    SCOPED_TRACE(name);
    const MergeSpec spec = spec_of(refused.at(name));
    expect_refused([&] { run_merge(spec, refused.at(name).at("adapters")); }, "merged_adapters.ids",
                   {"layer 0's dense_4h_to_h", "none of the adapters"});
  }
  // A single adapter of any rank merges (as linear), whatever the strategy asked.
  MergeSpec one;
  one.ids = {"m4-r2-qkv"};
  one.weights = {2.0};
  one.strategy = MergeStrategy::kDareTies;
  one.density = 0.5;
  const MergedLora m = run_merge(one, json::array({"m4-r2-qkv"}));
  EXPECT_EQ(m.strategy, MergeStrategy::kLinear);
  EXPECT_EQ(m.rank, 2);
}

}  // namespace
}  // namespace kestrel
