// The `kestrel` binary as outside checks call it: logits, generate --json and
// random-model, on the fixtures.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include "run_kestrel.h"

#include "../model/fixture_util.h"
#include "io/safetensors.h"
#include "model/falcon_model.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using test::Expected;
using test::fixture_dir;

using test::CmdResult;

// Runs the kestrel binary with args; stdout captured, stderr discarded.
CmdResult kestrel(const std::string& args) {
  return test::run_kestrel(args, false);
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kestrel_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write_prompts(const std::vector<std::vector<int32_t>>& prompts) {
    const std::string path = (dir_ / "prompts.json").string();
    std::ofstream(path) << nlohmann::json(prompts).dump();
    return path;
  }
  fs::path dir_;
};

TEST_F(CliTest, LogitsWritesTheRaggedBatch) {
  const Expected exp("falcon40b-gqa");
  const std::string prompts = write_prompts(exp.prompts);
  const std::string out = (dir_ / "logits.safetensors").string();
  CmdResult r = kestrel("logits --model " + fixture_dir("falcon40b-gqa") + " --token-ids " +
                        prompts + " --out " + out + " --block-size 1 --prefill-chunk 7");
  ASSERT_EQ(r.status, 0);
  WeightStore got = WeightStore::open_file(out);
  const TensorInfo& logits = got.get("logits", exp.store.get("logits").shape);
  EXPECT_EQ(logits.dtype, DType::kF32);
  EXPECT_LE(test::rel_error(reinterpret_cast<const float*>(logits.data), exp.f32("logits"),
                            logits.nbytes / 4),
            1e-4);
  const TensorInfo& cu = got.get("cu_seqlens", exp.store.get("cu_seqlens").shape);
  EXPECT_EQ(std::memcmp(cu.data, exp.store.get("cu_seqlens").data, cu.nbytes), 0);
}

TEST_F(CliTest, GenerateJsonGivesGreedyIds) {
  const Expected exp("falcon7b-mqa-parallel");
  CmdResult r =
      kestrel("generate --model " + fixture_dir("falcon7b-mqa-parallel") + " --token-ids " +
              write_prompts(exp.prompts) + " --max-new-tokens 12 --greedy --json --ignore-eos");
  ASSERT_EQ(r.status, 0);
  nlohmann::json j = nlohmann::json::parse(r.out);  // stdout holds only the JSON
  ASSERT_EQ(j["outputs"].size(), exp.prompts.size());
  for (size_t p = 0; p < exp.prompts.size(); ++p) {
    std::vector<int64_t> want(exp.i64("greedy_ids") + p * 12, exp.i64("greedy_ids") + (p + 1) * 12);
    EXPECT_EQ(j["outputs"][p]["token_ids"].get<std::vector<int64_t>>(), want);
  }
}

TEST_F(CliTest, GeneratePrintsTextWithATokenizer) {
  CmdResult r =
      kestrel("generate --model " + fixture_dir("e2e-falcon7b-fullvocab") +
              " --prompt 'The capital of France is' --max-new-tokens 12 --greedy --ignore-eos");
  ASSERT_EQ(r.status, 0);
  std::ifstream f(fixture_dir("e2e-falcon7b-fullvocab") + "/fixture.json");
  nlohmann::json fx = nlohmann::json::parse(f);
  EXPECT_EQ(r.out, "The capital of France is" + fx["greedy_text"][0].get<std::string>() + "\n");
}

// Seeded sampling through the engine: the same seed gives the same ids, and
// --json carries one logprob per token and the finish reason.
TEST_F(CliTest, GenerateSamplesReproduciblyWithSeed) {
  const std::string base = "generate --model " + fixture_dir("falcon7b-mqa-parallel") +
                           " --token-ids " + write_prompts({{5, 6, 7}, {8, 9}}) +
                           " --max-new-tokens 10 --ignore-eos --json --temperature 1.5 --top-k 50"
                           " --top-p 0.95 --repetition-penalty 1.1 --presence-penalty 0.5";
  CmdResult a = kestrel(base + " --seed 1234");
  CmdResult b = kestrel(base + " --seed 1234");
  CmdResult c = kestrel(base + " --seed 99");
  ASSERT_EQ(a.status, 0);
  ASSERT_EQ(b.status, 0);
  ASSERT_EQ(c.status, 0);
  nlohmann::json ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out),
                 jc = nlohmann::json::parse(c.out);
  ASSERT_EQ(ja["outputs"].size(), 2u);
  EXPECT_EQ(ja, jb);
  EXPECT_NE(ja["outputs"][0]["token_ids"], jc["outputs"][0]["token_ids"]);
  for (const auto& o : ja["outputs"]) {
    EXPECT_EQ(o["token_ids"].size(), 10u);
    ASSERT_EQ(o["logprobs"].size(), 10u);
    for (const auto& lp : o["logprobs"]) EXPECT_LE(lp.get<double>(), 0.0);
    EXPECT_EQ(o["finish_reason"], "length");
  }
  EXPECT_EQ(ja["outputs"][0]["seed"], 1234);
  EXPECT_EQ(ja["outputs"][1]["seed"], 1235);
}

// A stop sequence split across tokens ends the text before it, streamed or in
// JSON; one that never occurs changes nothing, chunked or not.
TEST_F(CliTest, GenerateStopsAtAStopSequence) {
  const std::string base =
      "generate --model " + fixture_dir("e2e-falcon7b-fullvocab") +
      " --prompt 'The capital of France is' --max-new-tokens 12 --greedy --ignore-eos";
  std::ifstream f(fixture_dir("e2e-falcon7b-fullvocab") + "/fixture.json");
  const std::string full = nlohmann::json::parse(f)["greedy_text"][0].get<std::string>();
  const std::string stop = "al dol";
  const size_t at = full.find(stop);
  ASSERT_NE(at, std::string::npos) << full;
  CmdResult r = kestrel(base + " --stop '" + stop + "' --json");
  ASSERT_EQ(r.status, 0);
  nlohmann::json o = nlohmann::json::parse(r.out)["outputs"][0];
  EXPECT_EQ(o["text"], full.substr(0, at));
  EXPECT_EQ(o["finish_reason"], "stop_sequence");
  EXPECT_LT(o["token_ids"].size(), 12u);
  r = kestrel(base + " --stop '" + stop + "'");
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "The capital of France is" + full.substr(0, at) + "\n");
  r = kestrel(base + " --stop QQQ --no-prefix-caching --prefill-chunk 3 --json");
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(nlohmann::json::parse(r.out)["outputs"][0]["text"], full);
}

TEST_F(CliTest, RandomModelLoadsAndRuns) {
  const std::string out = (dir_ / "tiny").string();
  ASSERT_EQ(kestrel("random-model --preset falcon-40b --layers 2 --hidden 128 --heads 8 "
                    "--kv-heads 2 --vocab 8192 --dtype f16 --seed 3 --shard-size-mb 1 --out " +
                    out)
                .status,
            0);
  EXPECT_TRUE(fs::exists(fs::path(out) / "model.safetensors.index.json"));
  FalconModel model = FalconModel::load(out);
  EXPECT_TRUE(model.config().new_decoder_architecture);
  EXPECT_EQ(model.config().n_kv_heads, 2);
  EXPECT_EQ(model.config().dtype, DType::kF16);
  CmdResult r = kestrel("generate --model " + out + " --token-ids " + write_prompts({{1, 2, 3}}) +
                        " --max-new-tokens 4 --greedy --json --ignore-eos");
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(nlohmann::json::parse(r.out)["outputs"][0]["token_ids"].size(), 4u);
}

TEST_F(CliTest, RandomModelPresetsHaveRealShapes) {
  const std::string out = (dir_ / "f7b").string();
  ASSERT_EQ(kestrel("random-model --preset falcon-7b --layers 1 --vocab 256 --out " + out).status,
            0);
  FalconConfig c = FalconConfig::from_model_dir(out);
  EXPECT_EQ(c.hidden_size, 4544);
  EXPECT_EQ(c.n_heads, 71);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.ffn_hidden_size, 18176);
  EXPECT_NO_THROW(FalconModel::load(out));
}

TEST_F(CliTest, BadInputGivesAClearErrorAndStatus1) {
  std::ofstream(dir_ / "bad.json") << "[[1, 2], \"x\"]";
  CmdResult r = kestrel("generate --model " + fixture_dir("falcon7b-mqa-parallel") +
                        " --token-ids " + (dir_ / "bad.json").string() + " --json");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(r.out.empty());
  r = kestrel("generate --model " + fixture_dir("falcon7b-mqa-parallel") + " --token-ids " +
              write_prompts({{1, 99999}}) + " --json");
  EXPECT_EQ(r.status, 1);
  r = kestrel("generate --model " + fixture_dir("falcon7b-mqa-parallel") + " --token-ids " +
              write_prompts({{1, 2}}) + " --top-p 1.5 --json");
  EXPECT_EQ(r.status, 1);
  r = kestrel("logits --model /nonexistent --token-ids x --out y");
  EXPECT_EQ(r.status, 1);
  r = kestrel("random-model --preset falcon-9b --out " + (dir_ / "x").string());
  EXPECT_EQ(r.status, 1);
}

}  // namespace
}  // namespace kestrel
