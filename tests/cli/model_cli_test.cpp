// The `kestrel` binary as outside checks call it: logits, generate --json and
// random-model, on the fixtures.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../model/fixture_util.h"
#include "io/safetensors.h"
#include "model/falcon_model.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using test::Expected;
using test::fixture_dir;

struct CmdResult {
  int status = -1;
  std::string out;
};

// Runs the kestrel binary with args; stdout captured, stderr discarded.
CmdResult kestrel(const std::string& args) {
  const std::string cmd = std::string(KESTREL_BINARY) + " " + args + " 2>/dev/null";
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
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
  r = kestrel("logits --model /nonexistent --token-ids x --out y");
  EXPECT_EQ(r.status, 1);
  r = kestrel("random-model --preset falcon-9b --out " + (dir_ / "x").string());
  EXPECT_EQ(r.status, 1);
}

}  // namespace
}  // namespace kestrel
