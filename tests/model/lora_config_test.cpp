// LoraConfig::from_file: peft's adapter_config.json keys, and a clear error for what kestrel does
// not support.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "fixture_util.h"
#include "lora/lora_adapter.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;

std::string write_config(const std::string& body) {
  const fs::path dir =
      fs::temp_directory_path() /
      ("kestrel_lora_cfg_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
       "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::create_directories(dir);
  const std::string path = (dir / "adapter_config.json").string();
  std::ofstream(path) << body;
  return path;
}

std::string error_of(const std::string& body) {
  try {
    LoraConfig::from_file(write_config(body));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LoraConfig, ReadsTheFixtureConfigs) {
  const LoraConfig a = LoraConfig::from_file(
      test::fixture_dir("lora-falcon40b-gqa/adapters/a3-r16-all-rslora-f16/adapter_config.json"));
  EXPECT_EQ(a.r, 16);
  EXPECT_EQ(a.lora_alpha, 16);
  EXPECT_TRUE(a.use_rslora);
  EXPECT_EQ(a.target_modules.size(), 4u);
  EXPECT_FLOAT_EQ(a.scale_for(0, LoraModule::kDense), 4.0f);  // 16 / sqrt(16)
  const LoraConfig b = LoraConfig::from_file(
      test::fixture_dir("lora-falcon7b-mqa/adapters/b2-r2-qkv/adapter_config.json"));
  EXPECT_EQ(b.r, 2);
  EXPECT_FALSE(b.use_rslora);
  EXPECT_TRUE(b.targets(1, LoraModule::kQkv));
  EXPECT_FALSE(b.targets(1, LoraModule::kDense));
  EXPECT_FLOAT_EQ(b.scale_for(1, LoraModule::kQkv), 2.0f);  // 4 / 2
  EXPECT_EQ(b.base_model_name_or_path, "falcon7b-mqa-parallel");
}

TEST(LoraConfig, PatternsLayersAndTargets) {
  const LoraConfig c = LoraConfig::from_file(write_config(R"({
    "r": 8, "lora_alpha": 16, "use_rslora": false,
    "rank_pattern": {"dense_4h_to_h": 4, "transformer.h.1.self_attention.query_key_value": 2},
    "alpha_pattern": {"h.1.self_attention.query_key_value": 1},
    "layers_to_transform": [0, 1],
    "target_modules": ["query_key_value", "mlp.dense_4h_to_h", "self_attention.dense"]})"));
  EXPECT_EQ(c.rank_for(0, LoraModule::kQkv), 8);
  EXPECT_EQ(c.rank_for(1, LoraModule::kQkv), 2);
  EXPECT_EQ(c.rank_for(3, LoraModule::kFc2), 4);
  EXPECT_EQ(c.rank_for(0, LoraModule::kFc1), 8);
  EXPECT_FLOAT_EQ(c.scale_for(0, LoraModule::kQkv), 2.0f);  // 16 / 8
  EXPECT_FLOAT_EQ(c.scale_for(1, LoraModule::kQkv), 0.5f);  // 1 / 2
  EXPECT_FLOAT_EQ(c.scale_for(0, LoraModule::kFc2), 4.0f);  // 16 / 4
  EXPECT_TRUE(c.targets(1, LoraModule::kDense));
  EXPECT_FALSE(c.targets(2, LoraModule::kDense));  // layers_to_transform
  EXPECT_FALSE(c.targets(0, LoraModule::kFc1));    // "dense" does not name dense_h_to_4h

  const LoraConfig one = LoraConfig::from_file(
      write_config(R"({"r": 4, "layers_to_transform": 3, "target_modules": "dense_h_to_4h"})"));
  EXPECT_EQ(one.layers_to_transform, std::vector<int64_t>{3});
  ASSERT_EQ(one.target_modules.size(), 1u);
  EXPECT_EQ(one.target_modules[0], LoraModule::kFc1);
  EXPECT_EQ(one.lora_alpha, 8);  // peft's default
  const LoraConfig all =
      LoraConfig::from_file(write_config(R"({"r": 4, "target_modules": "all-linear"})"));
  EXPECT_EQ(all.target_modules.size(), 4u);
}

TEST(LoraConfig, RefusesWhatItCannotHonour) {
  const std::string base = R"("r": 8, "target_modules": ["query_key_value"])";
  auto has = [](const std::string& what, const std::string& part) {
    EXPECT_NE(what.find(part), std::string::npos) << what;
  };
  has(error_of("{" + base + R"(, "use_dora": true})"), "use_dora");
  has(error_of("{" + base + R"(, "fan_in_fan_out": true})"), "fan_in_fan_out");
  has(error_of("{" + base + R"(, "modules_to_save": ["lm_head"]})"), "modules_to_save");
  has(error_of("{" + base + R"(, "bias": "lora_only"})"), "bias");
  has(error_of(R"({"r": 8, "target_modules": ["q_proj"]})"), "q_proj");
  has(error_of(R"({"r": 8, "target_modules": ".*query_key_value"})"), "regular expression");
  has(error_of(R"({"target_modules": ["dense"]})"), "\"r\" is missing");
  has(error_of(R"({"r": 0, "target_modules": ["dense"]})"), "\"r\" must be positive");
  has(error_of("{" + base + R"(, "rank_pattern": {"h\\.[0-9]+\\.dense": 4}})"), "rank_pattern");
  has(error_of("{" + base + R"(, "peft_type": "IA3"})"), "peft_type");
  has(error_of("{not json"), "not valid JSON");
  has(error_of("{" + base + R"(, "layers_to_transform": [-1]})"), "layers_to_transform");
  try {
    LoraConfig::from_file("/nonexistent/adapter_config.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    has(e.what(), "/nonexistent/adapter_config.json");
  }
}

}  // namespace
}  // namespace kestrel
