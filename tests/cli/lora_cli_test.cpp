// `kestrel logits --adapters`: one batch of prompts under different LoRA adapters and the base
// model, against transformers + peft (tests/data/lora-falcon40b-gqa).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../model/fixture_util.h"
#include "io/safetensors.h"
#include "run_kestrel.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using test::Expected;
using test::fixture_dir;

TEST(LoraCli, LogitsWithOneAdapterPerPrompt) {
  const fs::path dir = fs::temp_directory_path() / ("kestrel_lora_cli_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const Expected base("falcon40b-gqa"), lora("lora-falcon40b-gqa");
  const std::string prompts = (dir / "prompts.json").string();
  std::ofstream(prompts) << nlohmann::json(base.prompts).dump();
  const std::string a1 = fixture_dir("lora-falcon40b-gqa/adapters/a1-r8-attn");
  const std::string a3 = fixture_dir("lora-falcon40b-gqa/adapters/a3-r16-all-rslora-f16");
  const std::vector<std::string> names = {"a1-r8-attn", "", "a3-r16-all-rslora-f16"};
  const std::string adapters = (dir / "adapters.json").string();
  std::ofstream(adapters) << nlohmann::json::array({a1, nullptr, a3}).dump();
  const std::string out = (dir / "logits.safetensors").string();
  const test::CmdResult r =
      test::run_kestrel("logits --model " + fixture_dir("falcon40b-gqa") + " --token-ids " +
                            prompts + " --adapters " + adapters + " --out " + out,
                        false);
  ASSERT_EQ(r.status, 0);
  WeightStore got = WeightStore::open_file(out);
  const TensorInfo& logits = got.get("logits", base.store.get("logits").shape);
  const int64_t vocab = logits.shape[1];
  int64_t row = 0;
  for (size_t p = 0; p < base.prompts.size(); ++p) {
    const int64_t n = static_cast<int64_t>(base.prompts[p].size());
    const float* ref = names[p].empty() ? base.f32("logits") : lora.f32(names[p] + ".logits");
    EXPECT_LE(test::rel_error(reinterpret_cast<const float*>(logits.data) + row * vocab,
                              ref + row * vocab, static_cast<size_t>(n * vocab)),
              1e-4)
        << "prompt " << p;
    row += n;
  }
  // One entry too few: an error naming the flag.
  std::ofstream(adapters) << nlohmann::json::array({a1}).dump();
  const test::CmdResult bad =
      test::run_kestrel("logits --model " + fixture_dir("falcon40b-gqa") + " --token-ids " +
                            prompts + " --adapters " + adapters + " --out " + out,
                        true);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("--adapters"), std::string::npos) << bad.out;
  fs::remove_all(dir);
}

// generate on the engine: one request per prompt, each with its adapter, all in one batch; the
// same long prompt under two adapters and the base model.
TEST(LoraCli, GenerateWithOneAdapterPerPrompt) {
  const fs::path dir =
      fs::temp_directory_path() / ("kestrel_lora_cli_gen_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const Expected base("falcon40b-gqa"), lora("lora-falcon40b-gqa");
  const std::vector<int64_t> prompt_of = {0, 1, 2, 2, 2};
  const std::vector<std::string> names = {"a1-r8-attn", "", "a3-r16-all-rslora-f16", "",
                                          "a1-r8-attn"};
  std::vector<std::vector<int32_t>> prompts;
  nlohmann::json adapters = nlohmann::json::array();
  for (size_t i = 0; i < prompt_of.size(); ++i) {
    prompts.push_back(base.prompts[prompt_of[i]]);
    if (names[i].empty()) {
      adapters.push_back(nullptr);
    } else {
      adapters.push_back(fixture_dir("lora-falcon40b-gqa/adapters/" + names[i]));
    }
  }
  const std::string prompts_path = (dir / "prompts.json").string();
  std::ofstream(prompts_path) << nlohmann::json(prompts).dump();
  const std::string adapters_path = (dir / "adapters.json").string();
  std::ofstream(adapters_path) << adapters.dump();
  const test::CmdResult r = test::run_kestrel(
      "generate --model " + fixture_dir("falcon40b-gqa") + " --token-ids " + prompts_path +
          " --adapters " + adapters_path + " --max-new-tokens 12 --greedy --json --ignore-eos",
      false);
  ASSERT_EQ(r.status, 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["outputs"].size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t* g =
        names[i].empty() ? base.i64("greedy_ids") : lora.i64(names[i] + ".greedy_ids");
    const std::vector<int64_t> want(g + prompt_of[i] * 12, g + (prompt_of[i] + 1) * 12);
    EXPECT_EQ(j["outputs"][i]["token_ids"].get<std::vector<int64_t>>(), want) << "entry " << i;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kestrel
