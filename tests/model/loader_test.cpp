// Model loading refuses checkpoints that do not match their config, with an
// error naming the tensor and the numbers.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fixture_util.h"
#include "io/safetensors.h"
#include "model/falcon_model.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using test::fixture_dir;

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kestrel_loader_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    fs::copy_file(fixture_dir("falcon7b-mqa-parallel") + "/config.json", dir_ / "config.json");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Rewrites the fixture's weights, dropping `drop` and reshaping `reshape`.
  void write_weights(const std::string& drop, const std::string& reshape = "") {
    static const WeightStore src = WeightStore::open_folder(fixture_dir("falcon7b-mqa-parallel"));
    std::vector<TensorSpec> specs;
    for (const std::string& name : src.names()) {
      if (name == drop) continue;
      const TensorInfo& info = src.get(name);
      Shape shape = info.shape;
      if (name == reshape) shape = {shape_numel(shape) / 2, 2};
      specs.push_back({name, info.dtype, shape, [&info](std::span<std::byte> out) {
                         std::memcpy(out.data(), info.data, out.size());
                       }});
    }
    write_safetensors((dir_ / "model.safetensors").string(), specs);
  }

  std::string load_error() {
    try {
      FalconModel::load(dir_.string());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

TEST_F(LoaderTest, IntactCopyLoads) {
  write_weights("");
  EXPECT_EQ(load_error(), "");
}

TEST_F(LoaderTest, MissingTensorIsNamed) {
  write_weights("transformer.h.1.mlp.dense_4h_to_h.weight");
  const std::string err = load_error();
  EXPECT_NE(err.find("transformer.h.1.mlp.dense_4h_to_h.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("not found"), std::string::npos) << err;
}

TEST_F(LoaderTest, ShapeInconsistentWithConfig) {
  write_weights("", "transformer.h.0.self_attention.query_key_value.weight");
  const std::string err = load_error();
  EXPECT_NE(err.find("query_key_value.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("[96, 64]"), std::string::npos) << err;  // what the config implies
}

TEST_F(LoaderTest, ConfigDisagreeingWithWeights) {
  write_weights("");
  nlohmann::json cfg;
  std::ifstream(dir_ / "config.json") >> cfg;
  cfg["multi_query"] = false;  // full multi-head: qkv would be [192, 64]
  std::ofstream(dir_ / "config.json") << cfg.dump();
  const std::string err = load_error();
  EXPECT_NE(err.find("[192, 64]"), std::string::npos) << err;
}

TEST_F(LoaderTest, BadConfigJson) {
  write_weights("");
  std::ofstream(dir_ / "config.json") << "{\"hidden_size\": 64,";
  const std::string err = load_error();
  EXPECT_NE(err.find("config.json: not valid JSON"), std::string::npos) << err;
}

TEST_F(LoaderTest, UntiedWithoutLmHead) {
  write_weights("");
  nlohmann::json cfg;
  std::ifstream(dir_ / "config.json") >> cfg;
  cfg["tie_word_embeddings"] = false;
  std::ofstream(dir_ / "config.json") << cfg.dump();
  EXPECT_NE(load_error().find("no lm_head.weight"), std::string::npos);
}

TEST_F(LoaderTest, TruncatedWeightsFile) {
  write_weights("");
  fs::resize_file(dir_ / "model.safetensors", fs::file_size(dir_ / "model.safetensors") - 100);
  const std::string err = load_error();
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
}

TEST_F(LoaderTest, OnlyPytorchBin) {
  std::ofstream(dir_ / "pytorch_model.bin") << "not really";
  const std::string err = load_error();
  EXPECT_NE(err.find("Convert the folder"), std::string::npos) << err;
}

// ALiBi checkpoints load (tests/model/alibi_test.cpp checks their numerics);
// slopes that do not fit the model are refused.
TEST(Loader, AlibiSlopesMustFitTheModel) {
  FalconModel alibi = FalconModel::load(fixture_dir("rw-alibi-mha"));
  EXPECT_TRUE(alibi.config().alibi);
  try {
    alibi.set_alibi_slopes(std::vector<float>(8, 0.5f));
    FAIL() << "8 slopes accepted for 12 heads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("8 slopes for 12"), std::string::npos) << e.what();
  }
  FalconModel rotary = FalconModel::load(fixture_dir("falcon7b-mqa-parallel"));
  EXPECT_THROW(rotary.set_alibi_slopes(std::vector<float>(rotary.config().n_heads, 0.5f)), Error);
}

TEST(Forward, BadTokenIdIsAnError) {
  const FalconModel model = FalconModel::load(fixture_dir("falcon7b-mqa-parallel"));
  KvCache cache = model.make_kv_cache(4, 16);
  ForwardBatch b;
  b.input_ids = {5, 5000};
  b.positions = {0, 1};
  b.cu_seqlens = {0, 2};
  b.kv_lens = {2};
  b.block_tables = {0};
  b.max_blocks = 1;
  b.slots = {0, 1};
  EXPECT_THROW(model.forward(b, cache), Error);
  b.input_ids = {5, 6};
  b.slots = {0, 4 * 16};  // outside the cache
  EXPECT_THROW(model.forward(b, cache), Error);
  b.slots = {0, 1};
  b.kv_lens = {40};  // more context than one block holds
  EXPECT_THROW(model.forward(b, cache), Error);
}

}  // namespace
}  // namespace kestrel
