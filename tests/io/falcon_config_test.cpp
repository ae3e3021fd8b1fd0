// FalconConfig: every dialect of the fixtures and of published Falcon configs
// normalised the way transformers reads them, and impossible configs refused.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../test_data.h"
#include "core/error.h"
#include "io/falcon_config.h"

namespace kestrel {
namespace {

using nlohmann::json;

std::string data(const std::string& name) {
  return test::test_data_dir() + "/" + name;
}

void expect_error(const json& j, const std::string& fragment) {
  try {
    FalconConfig::from_json(j, "cfg");
    FAIL() << "expected an error containing \"" << fragment << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(FalconConfig, Falcon7bMultiQueryIgnoresNumKvHeads) {
  FalconConfig c = FalconConfig::from_model_dir(data("falcon7b-mqa-parallel"));
  EXPECT_FALSE(c.new_decoder_architecture);
  EXPECT_TRUE(c.multi_query);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 1);  // the config says num_kv_heads: 4
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_TRUE(c.parallel_attn);
  EXPECT_FALSE(c.two_layer_norms());
  EXPECT_EQ(c.qkv_out_dim(), (4 + 2) * 16);
  EXPECT_EQ(c.ffn_hidden_size, 256);
  EXPECT_EQ(c.dtype, DType::kBF16);
}

TEST(FalconConfig, LegacyRefinedWebModelKeys) {
  FalconConfig c = FalconConfig::from_model_dir(data("legacy-rw-7b-config"));
  EXPECT_EQ(c.model_type, "RefinedWebModel");
  EXPECT_FALSE(c.new_decoder_architecture);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.ffn_hidden_size, 4 * 64);
}

TEST(FalconConfig, LegacyRefinedWebImpliesNewArchitecture) {
  FalconConfig c = FalconConfig::from_model_dir(data("legacy-rw-40b-config"));
  EXPECT_TRUE(c.new_decoder_architecture);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 2);  // n_head_kv
  EXPECT_TRUE(c.two_layer_norms());
}

TEST(FalconConfig, GroupedQueryAndUntied) {
  FalconConfig c = FalconConfig::from_model_dir(data("falcon180b-gqa-untied"));
  EXPECT_TRUE(c.new_decoder_architecture);
  EXPECT_EQ(c.n_heads, 12);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, DType::kF16);
  EXPECT_EQ(c.qkv_out_dim(), (12 + 4) * 16);
}

TEST(FalconConfig, Falcon2RopeParametersAndOneLayerNorm) {
  FalconConfig c = FalconConfig::from_model_dir(data("falcon2-11b-style"));
  EXPECT_DOUBLE_EQ(c.rope_theta, 500042.0);
  EXPECT_EQ(c.num_ln_in_parallel_attn, 1);
  EXPECT_FALSE(c.two_layer_norms());
  EXPECT_EQ(c.ffn_hidden_size, 384);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::kNone);
}

TEST(FalconConfig, SequentialWithBias) {
  FalconConfig c = FalconConfig::from_model_dir(data("rw-mha-sequential-bias"));
  EXPECT_FALSE(c.parallel_attn);
  EXPECT_TRUE(c.bias);
  EXPECT_EQ(c.n_kv_heads, 4);  // full multi-head
  EXPECT_EQ(c.dtype, DType::kF32);
}

TEST(FalconConfig, TopLevelRopeThetaWins) {
  json j = {{"model_type", "falcon"},
            {"hidden_size", 64},
            {"num_attention_heads", 4},
            {"rope_theta", 500042.0},
            {"rope_parameters", {{"rope_theta", 10.0}}}};
  EXPECT_DOUBLE_EQ(FalconConfig::from_json(j, "cfg").rope_theta, 500042.0);
}

TEST(FalconConfig, RopeScalingDialects) {
  json j = {{"hidden_size", 64},
            {"num_attention_heads", 4},
            {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}};
  FalconConfig c = FalconConfig::from_json(j, "cfg");
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 2.0);
  j = {{"hidden_size", 64},
       {"num_attention_heads", 4},
       {"rope_parameters", {{"rope_type", "dynamic"}, {"factor", 4.0}, {"rope_theta", 1e4}}}};
  c = FalconConfig::from_json(j, "cfg");
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::kDynamic);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);
  j["rope_parameters"]["rope_type"] = "yarn";
  expect_error(j, "rope scaling type \"yarn\"");
  j = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"rope_scaling", {{"type", "linear"}}}};
  expect_error(j, "factor");
}

TEST(FalconConfig, NewArchitectureKvHeadDefaultsToHeads) {
  json j = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"new_decoder_architecture", true}};
  FalconConfig c = FalconConfig::from_json(j, "cfg");
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_TRUE(c.parallel_attn);
  EXPECT_EQ(c.num_ln_in_parallel_attn, 2);
  j["parallel_attn"] = false;  // ignored by the new architecture, as in transformers
  EXPECT_TRUE(FalconConfig::from_json(j, "cfg").parallel_attn);
}

TEST(FalconConfig, ImpossibleShapesAreErrors) {
  expect_error({{"hidden_size", 65}, {"num_attention_heads", 4}}, "not divisible");
  expect_error({{"hidden_size", 64},
                {"num_attention_heads", 4},
                {"new_decoder_architecture", true},
                {"num_kv_heads", 3}},
               "not divisible by the number of K/V heads");
  expect_error({{"hidden_size", 0}, {"num_attention_heads", 4}}, "hidden_size");
  expect_error({{"hidden_size", 64}, {"num_attention_heads", 0}}, "num_attention_heads");
  expect_error({{"hidden_size", 64}, {"num_attention_heads", 4}, {"vocab_size", -5}}, "vocab_size");
  expect_error({{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_hidden_layers", 1000000}},
               "num_hidden_layers");
  expect_error({{"hidden_size", 60}, {"num_attention_heads", 4}}, "must be even");
}

TEST(FalconConfig, WrongTypesAndUnknownModels) {
  expect_error({{"hidden_size", "64"}, {"num_attention_heads", 4}},
               "\"hidden_size\" must be an integer");
  expect_error({{"hidden_size", 64}, {"num_attention_heads", 4}, {"bias", "yes"}}, "\"bias\"");
  expect_error({{"model_type", "llama"}}, "model_type \"llama\" is not a Falcon model");
  expect_error({{"hidden_size", 64}, {"num_attention_heads", 4}, {"activation", "relu"}},
               "activation");
  expect_error({{"hidden_size", 64},
                {"num_attention_heads", 4},
                {"new_decoder_architecture", true},
                {"num_ln_in_parallel_attn", 3}},
               "num_ln_in_parallel_attn");
  expect_error(json::array(), "JSON object");
}

TEST(FalconConfig, AlibiIsParsed) {
  FalconConfig c = FalconConfig::from_model_dir(data("rw-alibi-mha"));
  EXPECT_TRUE(c.alibi);
}

TEST(FalconConfig, ToJsonRoundTrips) {
  FalconConfig c = FalconConfig::from_model_dir(data("falcon2-11b-style"));
  FalconConfig d = FalconConfig::from_json(c.to_json(), "round trip");
  EXPECT_EQ(d.summary(), c.summary());
  EXPECT_DOUBLE_EQ(d.rope_theta, c.rope_theta);
  EXPECT_EQ(d.num_ln_in_parallel_attn, 1);
}

TEST(FalconConfig, FileErrors) {
  EXPECT_THROW(FalconConfig::from_file("/nonexistent/config.json"), Error);
  EXPECT_THROW(FalconConfig::from_model_dir(data("tokenizer")), Error);
}

}  // namespace
}  // namespace kestrel
