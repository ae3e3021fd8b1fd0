// Tensor parallelism on the CPU with the in-process communicator: every base fixture at N = 2, 3
// and 4 (uneven head, group, MLP and vocabulary splits, padded split groups) against N = 1 and
// transformers; falcon-7b-like 7-head multi-query models at N = 2 and 4; each rank's share of the
// weights and of the KV cache; clear errors before any weight is read.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "fixture_util.h"
#include "model/falcon_model.h"
#include "model/falcon_weights.h"
#include "model/runner.h"
#include "parallel/sharding.h"

namespace kestrel {
namespace {

using test::Expected;
using test::fixture_dir;
using test::rel_error;

constexpr double kVsSingle = 1e-5;  // max abs / max |N = 1|
constexpr double kVsRef = 1e-4;     // max abs / max |transformers|
constexpr int64_t kSteps = 12;

struct RunResult {
  Tensor prompt_logits;  // every prompt token's, or each prompt's last
  std::vector<std::vector<int32_t>> greedy;
  std::vector<Tensor> step_logits;
};

RunResult run(const FalconModel& model, const std::vector<std::vector<int32_t>>& prompts, bool all,
              RunnerOptions opt = {}) {
  RunResult r;
  BatchRunner runner(model, prompts, 0, opt);
  r.prompt_logits = runner.prefill(all);
  r.greedy = greedy_generate(model, prompts, kSteps, opt, /*stop_at_eos=*/false,
                             [&](int64_t, const Tensor& logits, const std::vector<int>&) {
                               Tensor copy = Tensor::empty(DType::kF32, logits.shape());
                               std::memcpy(copy.raw(), logits.raw(), logits.nbytes());
                               r.step_logits.push_back(copy);
                             });
  return r;
}

void expect_same(const RunResult& got, const RunResult& single) {
  ASSERT_EQ(got.prompt_logits.shape(), single.prompt_logits.shape());
  EXPECT_LE(rel_error(got.prompt_logits, single.prompt_logits), kVsSingle);
  EXPECT_EQ(got.greedy, single.greedy);
  ASSERT_EQ(got.step_logits.size(), single.step_logits.size());
  double worst = 0;
  for (size_t s = 0; s < got.step_logits.size(); ++s)
    worst = std::max(worst, rel_error(got.step_logits[s], single.step_logits[s]));
  EXPECT_LE(worst, kVsSingle);
}

class TpFixtureTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TpFixtureTest, MatchesSingleRankAndTransformers) {
  const auto& [name, n] = GetParam();
  const FalconConfig config = FalconConfig::from_model_dir(fixture_dir(name));
  if (n > config.n_heads) {  // falcon7b-hd128-mqa has 2 heads: N = 3, 4 must be refused
    EXPECT_THROW(FalconModel::load(fixture_dir(name), Device::kCpu, n), Error);
    return;
  }
  const Expected exp(name);
  const bool all = exp.store.contains("logits");
  const FalconModel single = FalconModel::load(fixture_dir(name));
  const FalconModel tp = FalconModel::load(fixture_dir(name), Device::kCpu, n);
  ASSERT_EQ(tp.tensor_parallel(), n);
  const RunResult want = run(single, exp.prompts, all);
  const RunResult got = run(tp, exp.prompts, all);
  expect_same(got, want);
  // Against transformers.
  const float* ref = exp.f32(all ? "logits" : "last_logits");
  EXPECT_LE(rel_error(got.prompt_logits.data<float>(), ref, got.prompt_logits.numel()), kVsRef);
  for (size_t p = 0; p < exp.prompts.size(); ++p) {
    std::vector<int32_t> ids(exp.i64("greedy_ids") + p * kSteps,
                             exp.i64("greedy_ids") + (p + 1) * kSteps);
    EXPECT_EQ(got.greedy[p], ids) << "prompt " << p;
  }
  if (exp.store.contains("greedy_logits")) {
    // Step s's rows are the prompts (none stops: no EOS stop).
    const int64_t vocab = config.vocab_size;
    double worst = 0;
    for (int64_t s = 0; s < kSteps; ++s) {
      for (size_t p = 0; p < exp.prompts.size(); ++p) {
        worst =
            std::max(worst, rel_error(got.step_logits[s].data<float>() + p * vocab,
                                      exp.f32("greedy_logits") + (p * kSteps + s) * vocab, vocab));
      }
    }
    EXPECT_LE(worst, kVsRef);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TpFixtureTest,
                         ::testing::Combine(::testing::ValuesIn(test::base_fixtures()),
                                            ::testing::Values(2, 3, 4)),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param);
                           for (char& c : s)
                             c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s + "_N" + std::to_string(std::get<1>(info.param));
                         });

TEST(TensorParallel, ChunkedPrefillAndBlockSizes) {
  const Expected exp("falcon40b-gqa");
  const FalconModel single = FalconModel::load(fixture_dir("falcon40b-gqa"));
  const FalconModel tp = FalconModel::load(fixture_dir("falcon40b-gqa"), Device::kCpu, 3);
  for (RunnerOptions opt : {RunnerOptions{1, 3}, RunnerOptions{32, 0}}) {
    expect_same(run(tp, exp.prompts, true, opt), run(single, exp.prompts, true, opt));
  }
}

// A model folder written by `kestrel random-model` under a fresh temporary directory.
std::string random_model(const std::string& tag, const std::string& args) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("kestrel-tp-" + tag)).string();
  std::filesystem::remove_all(dir);
  const std::string cmd =
      test::kestrel_binary() + " random-model " + args + " --out " + dir + " > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir;
}

TEST(TensorParallel, SevenHeadMultiQuery) {
  const std::string dir = random_model("h7", "--preset tiny --heads 7 --kv-heads 1 --seed 3");
  const FalconModel single = FalconModel::load(dir);
  ASSERT_EQ(single.config().n_heads, 7);
  ASSERT_EQ(single.config().n_kv_heads, 1);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6, 7, 8, 9}, {42, 17}, {5}};
  const RunResult want = run(single, prompts, true);
  for (int n : {2, 4}) {
    SCOPED_TRACE("N=" + std::to_string(n));
    const FalconModel tp = FalconModel::load(dir, Device::kCpu, n);
    expect_same(run(tp, prompts, true), want);
  }
  std::filesystem::remove_all(dir);
}

// --quantize fp8 sharded: every rank's codes and scales are the single-rank model's (a
// row-parallel slice takes its whole rows' scales), so N ranks compute what one does; with an FP8
// KV cache too. Fixtures of every layout, N up to their heads.
TEST(TensorParallel, Fp8MatchesSingleRank) {
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6, 7, 8, 9}, {42, 17}, {5}};
  for (const char* name : {"falcon40b-gqa", "falcon7b-mqa-parallel", "rw-mha-sequential-bias",
                           "falcon180b-gqa-untied"}) {
    SCOPED_TRACE(name);
    const WeightQuant fp8{.fp8 = true};
    FalconModel single = FalconModel::load(fixture_dir(name), Device::kCpu, 1, fp8);
    single.set_kv_cache_dtype(DType::kF8E4M3);
    const RunResult want = run(single, prompts, true);
    for (int n : {2, 3}) {
      SCOPED_TRACE("N=" + std::to_string(n));
      FalconModel tp = FalconModel::load(fixture_dir(name), Device::kCpu, n, fp8);
      EXPECT_EQ(tp.linear_weight_dtype(), DType::kF8E4M3);
      tp.set_kv_cache_dtype(DType::kF8E4M3);
      expect_same(run(tp, prompts, true), want);
    }
  }
}

TEST(TensorParallel, EachRankReadsItsShareAndCachesItsKvHeads) {
  const std::string name = "falcon40b-gqa";  // 8 heads, 2 K/V heads, biases off
  const FalconConfig c = FalconConfig::from_model_dir(fixture_dir(name));
  const int64_t es = static_cast<int64_t>(dtype_size(c.dtype));
  const ShardDims dims{c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_hidden_size, c.vocab_size};
  for (int n : {1, 2, 3}) {
    SCOPED_TRACE("N=" + std::to_string(n));
    const FalconModel tp = FalconModel::load_parallel(fixture_dir(name), Device::kCpu, n);
    const std::vector<int64_t> bytes = tp.rank_weight_bytes();
    ASSERT_EQ(static_cast<int>(bytes.size()), n);
    KvCache cache = tp.make_kv_cache(4, 16);
    ASSERT_EQ(cache.n_shards(), n);
    for (int r = 0; r < n; ++r) {
      const RankShard s = shard_rank(dims, n, r);
      // Replicated: the norms. Sharded: vocabulary rows, qkv rows of its heads and K/V heads,
      // dense columns of its heads, MLP rows / columns.
      const int64_t h = c.hidden_size, d = c.head_dim;
      const int64_t norms = (2 * c.n_layers * 2 + 2) * h;
      const int64_t per_layer = (s.heads.size() + 2 * s.n_local_kv_heads()) * d * h +
                                h * s.heads.size() * d + 2 * s.ffn.size() * h;
      EXPECT_EQ(bytes[r], (norms + s.vocab.size() * h + c.n_layers * per_layer) * es) << r;
      EXPECT_EQ(cache.shard(r).shape().n_kv_heads, s.n_local_kv_heads());
    }
    EXPECT_EQ(tp.kv_bytes_per_block(16), cache.shape().bytes_per_block(tp.act_dtype()));
  }
}

TEST(TensorParallel, ClearErrorsBeforeAnyWeightIsRead) {
  // A folder whose weights file is garbage: the N checks must fire before it is opened.
  const std::string dir =
      (std::filesystem::temp_directory_path() / "kestrel-tp-badweights").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(fixture_dir("falcon7b-mqa-parallel") + "/config.json",
                             dir + "/config.json");
  { std::ofstream(dir + "/model.safetensors") << "not a safetensors file"; }
  auto message = [&](int n, Device dev) -> std::string {
    try {
      FalconModel::load(dir, dev, n);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(0, Device::kCpu).find("--tensor-parallel must be >= 1"), std::string::npos);
  EXPECT_NE(message(5, Device::kCpu).find("more than the model's 4 query heads"),
            std::string::npos);
  EXPECT_NE(message(-1, Device::kCpu).find(">= 1"), std::string::npos);
  EXPECT_NE(message(3, Device::kCuda).find("GPUs"), std::string::npos) << message(3, Device::kCuda);
  // A good N gets as far as the weights file.
  EXPECT_NE(message(2, Device::kCpu).find("model.safetensors"), std::string::npos)
      << message(2, Device::kCpu);
  std::filesystem::remove_all(dir);
}

TEST(TensorParallel, CacheFromAnotherModelIsRefused) {
  const FalconModel tp = FalconModel::load(fixture_dir("falcon40b-gqa"), Device::kCpu, 2);
  const FalconModel single = FalconModel::load(fixture_dir("falcon40b-gqa"));
  KvCache plain = single.make_kv_cache(4, 16);
  ForwardBatch b;
  b.input_ids = {1, 2};
  b.positions = {0, 1};
  b.cu_seqlens = {0, 2};
  b.kv_lens = {2};
  b.block_tables = {0};
  b.max_blocks = 1;
  b.slots = {0, 1};
  EXPECT_THROW(tp.forward(b, plain), Error);
}

}  // namespace
}  // namespace kestrel
