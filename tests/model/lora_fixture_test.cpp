// LoRA on the CPU against transformers + peft: every adapter of every lora-* fixture alone and in
// ONE mixed batch interleaving prompts of every adapter and of the base model, at N = 1, 2 and 3
// tensor-parallel ranks; clear errors for broken adapter folders.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "fixture_util.h"
#include "model/falcon_model.h"
#include "model/runner.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using test::Expected;
using test::fixture_dir;
using test::rel_error;

constexpr double kTolerance = 1e-4;  // max abs / max |ref|
constexpr int64_t kSteps = 12;

struct LoraFixture {
  std::string name, base;
  std::vector<std::string> adapters;
};

LoraFixture read_fixture(const std::string& name) {
  std::ifstream in(fixture_dir(name) + "/fixture.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  LoraFixture f{name, fs::path(j.at("base").get<std::string>()).filename().string(), {}};
  for (const auto& [k, v] : j.at("adapters").items()) f.adapters.push_back(k);
  return f;
}

FalconModel load_model(const std::string& base, int n) {
  return n == 1 ? FalconModel::load(fixture_dir(base))
                : FalconModel::load(fixture_dir(base), Device::kCpu, n);
}

// The reference of one prompt: its logits rows (every token, or the last only) and greedy ids.
struct Ref {
  const Expected* exp;
  std::string prefix;  // "NAME." for an adapter, "" for the base model
  bool all_tokens() const { return exp->store.contains(prefix + "logits"); }
  const float* logits(int64_t p, int64_t vocab) const {
    if (!all_tokens()) return exp->f32(prefix + "last_logits") + p * vocab;
    int64_t row = 0;
    for (int64_t q = 0; q < p; ++q) row += static_cast<int64_t>(exp->prompts[q].size());
    return exp->f32(prefix + "logits") + row * vocab;
  }
  std::vector<int32_t> greedy(int64_t p) const {
    const int64_t* g = exp->i64(prefix + "greedy_ids") + p * kSteps;
    return std::vector<int32_t>(g, g + kSteps);
  }
};

// Runs (prompt, adapter) pairs as ONE batch and checks each against its reference.
void run_and_check(const FalconModel& model, const std::vector<int64_t>& prompt_of,
                   const std::vector<const LoraAdapter*>& adapters, const std::vector<Ref>& refs,
                   const Expected& exp) {
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t p : prompt_of) prompts.push_back(exp.prompts[p]);
  RunnerOptions opt;
  opt.adapters = adapters;
  const int64_t vocab = model.config().vocab_size;
  const bool all = refs[0].all_tokens();
  BatchRunner runner(model, prompts, 0, opt);
  const Tensor logits = runner.prefill(all);
  int64_t row = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t n = all ? static_cast<int64_t>(prompts[i].size()) : 1;
    const float* ref = refs[i].all_tokens() ? refs[i].logits(prompt_of[i], vocab)
                                            : refs[i].exp->f32(refs[i].prefix + "last_logits") +
                                                  prompt_of[i] * vocab;
    const float* got = logits.data<float>() + (all ? row : static_cast<int64_t>(i)) * vocab;
    if (all && !refs[i].all_tokens()) {  // base given as last rows only: compare the last row
      got += (n - 1) * vocab;
      EXPECT_LE(rel_error(got, ref, vocab), kTolerance) << "entry " << i;
    } else {
      EXPECT_LE(rel_error(got, ref, static_cast<size_t>(n * vocab)), kTolerance)
          << "entry " << i << " (prompt " << prompt_of[i] << ", " << refs[i].prefix << ")";
    }
    row += n;
  }
  const auto greedy = greedy_generate(model, prompts, kSteps, opt, /*stop_at_eos=*/false);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(greedy[i], refs[i].greedy(prompt_of[i]))
        << "entry " << i << " (prompt " << prompt_of[i] << ", " << refs[i].prefix << ")";
}

class LoraFixtureTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(LoraFixtureTest, EveryAdapterAloneAndInOneMixedBatch) {
  const auto& [name, n] = GetParam();
  const LoraFixture f = read_fixture(name);
  const FalconModel model = load_model(f.base, n);
  const Expected exp(name), base_exp(f.base);
  const int64_t n_prompts = static_cast<int64_t>(exp.prompts.size());
  ASSERT_EQ(exp.prompts, base_exp.prompts);
  std::vector<std::shared_ptr<const LoraAdapter>> loaded;
  for (const std::string& a : f.adapters)
    loaded.push_back(model.load_adapter(fixture_dir(name) + "/adapters/" + a, a));

  for (size_t a = 0; a < f.adapters.size(); ++a) {  // each alone
    SCOPED_TRACE(f.adapters[a]);
    std::vector<int64_t> prompt_of;
    for (int64_t p = 0; p < n_prompts; ++p) prompt_of.push_back(p);
    run_and_check(model, prompt_of, std::vector<const LoraAdapter*>(n_prompts, loaded[a].get()),
                  std::vector<Ref>(n_prompts, Ref{&exp, f.adapters[a] + "."}), exp);
  }
  // Mixed: every prompt under the base model and under every adapter, interleaved, plus one more
  // entry with the previous entry's adapter (two sequences of one segment).
  SCOPED_TRACE("mixed batch");
  std::vector<int64_t> prompt_of;
  std::vector<const LoraAdapter*> adapters;
  std::vector<Ref> refs;
  for (int64_t p = 0; p < n_prompts; ++p) {
    prompt_of.push_back(p);
    adapters.push_back(nullptr);
    refs.push_back({&base_exp, ""});
    for (size_t a = 0; a < loaded.size(); ++a) {
      prompt_of.push_back((p + static_cast<int64_t>(a) + 1) % n_prompts);
      adapters.push_back(loaded[a].get());
      refs.push_back({&exp, f.adapters[a] + "."});
    }
  }
  prompt_of.push_back(0);
  adapters.push_back(adapters.back());
  refs.push_back(refs.back());
  run_and_check(model, prompt_of, adapters, refs, exp);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraFixtureTest,
                         ::testing::Combine(::testing::Values("lora-falcon40b-gqa",
                                                              "lora-falcon7b-mqa",
                                                              "lora-e2e-falcon7b-fullvocab"),
                                            ::testing::Values(1, 2, 3)),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + "_tp" +
                                           std::to_string(std::get<1>(info.param));
                           for (char& c : s)
                             c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s;
                         });

// A copy of a fixture adapter in a fresh temporary folder.
std::string copy_adapter(const std::string& from, const std::string& tag) {
  const fs::path dir = fs::temp_directory_path() / ("kestrel_lora_" + tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(fixture_dir(from)))
    fs::copy_file(e.path(), dir / e.path().filename());
  return dir.string();
}

void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  const std::string path = dir + "/adapter_config.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  edit(j);
  std::ofstream(path) << j.dump(2);
}

std::string load_error(const FalconModel& model, const std::string& dir) {
  try {
    model.load_adapter(dir, "x");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(what, part) EXPECT_NE((what).find(part), std::string::npos) << (what)

TEST(LoraAdapterErrors, EachNamesTheProblem) {
  const FalconModel model = FalconModel::load(fixture_dir("falcon40b-gqa"));
  const std::string good = "lora-falcon40b-gqa/adapters/a1-r8-attn";

  EXPECT_HAS(load_error(model, "/nonexistent/adapter"), "/nonexistent/adapter does not exist");

  std::string dir = copy_adapter(good, "corrupt");
  fs::resize_file(dir + "/adapter_model.safetensors", 100);
  EXPECT_HAS(load_error(model, dir), "adapter_model.safetensors");

  dir = copy_adapter(good, "bin_only");
  fs::rename(dir + "/adapter_model.safetensors", dir + "/adapter_model.bin");
  EXPECT_HAS(load_error(model, dir), "only adapter_model.bin");

  dir = copy_adapter(good, "rank");
  edit_config(dir, [](nlohmann::json& j) { j["r"] = 4; });
  std::string e = load_error(model, dir);
  EXPECT_HAS(e, "rank 4");
  EXPECT_HAS(e, "[8, 128]");

  dir = copy_adapter(good, "dora");
  edit_config(dir, [](nlohmann::json& j) { j["use_dora"] = true; });
  EXPECT_HAS(load_error(model, dir), "use_dora");

  dir = copy_adapter(good, "target");
  edit_config(dir, [](nlohmann::json& j) { j["target_modules"] = {"query_key_value"}; });
  EXPECT_HAS(load_error(model, dir), "self_attention.dense.lora_A.weight");  // unexpected key

  // falcon7b-mqa's adapter on the falcon40b-gqa model: hidden 64 vs 128.
  e = load_error(model, fixture_dir("lora-falcon7b-mqa/adapters/b2-r2-qkv"));
  EXPECT_HAS(e, "transformer.h.0.self_attention.query_key_value.lora_");
  EXPECT_HAS(e, "the base model needs");

  // A batch whose adapters do not match its sequences.
  const auto ad = model.load_adapter(fixture_dir(good), "a1");
  RunnerOptions opt;
  opt.adapters = {ad.get()};
  EXPECT_THROW(BatchRunner(model, {{1, 2}, {3}}, 0, opt), Error);
}

TEST(LoraAdapter, RandomAdapterMovesLogitsAndShardsConsistently) {
  const FalconModel one = FalconModel::load(fixture_dir("falcon40b-gqa"));
  const FalconModel three = FalconModel::load(fixture_dir("falcon40b-gqa"), Device::kCpu, 3);
  const std::vector<LoraModule> all = {LoraModule::kQkv, LoraModule::kDense, LoraModule::kFc1,
                                       LoraModule::kFc2};
  const auto a1 = one.random_adapter("r", 16, all, 7);
  const auto a3 = three.random_adapter("r", 16, all, 7);
  EXPECT_EQ(a1->max_rank(), 16);
  EXPECT_EQ(a3->n_ranks(), 3);
  const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7, 8}, {9, 10}};
  auto logits = [&](const FalconModel& m, const LoraAdapter* a) {
    RunnerOptions opt;
    if (a) opt.adapters = {a, a};
    BatchRunner r(m, prompts, 0, opt);
    return r.prefill(true);
  };
  const Tensor base = logits(one, nullptr), l1 = logits(one, a1.get()),
               l3 = logits(three, a3.get());
  EXPECT_GT(rel_error(l1, base), 1e-3);  // the delta is visible
  EXPECT_LE(rel_error(l3, l1), 1e-5);    // the same adapter, sharded over 3 ranks
}

}  // namespace
}  // namespace kestrel
