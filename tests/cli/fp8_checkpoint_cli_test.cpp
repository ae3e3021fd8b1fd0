// Pre-quantized FP8 checkpoints through `kestrel logits`: compressed-tensors and TGI/vLLM `fp8`
// folders made here from the falcon40b-gqa fixture (its four linears as F8_E4M3 codes with
// weight_scale per channel or per tensor). Per-channel F32 scales are what --quantize fp8
// computes, so their logits equal `--quantize fp8` on the original bit for bit; per-tensor ones
// stay within 8e-2 of the fp32 reference. A corrupt scale, a scale of the wrong shape, a missing
// scale, E5M2 or block-wise weights and unsupported quantization_configs fail with exit 1 and a
// message naming the tensor or key. With tensor parallelism each rank reads its slice of the
// codes and scales, and the logits are the single-rank ones.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "../model/fixture_util.h"
#include "backend/ops.h"
#include "io/safetensors.h"
#include "run_kestrel.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::fixture_dir;

const char* const kFixture = "falcon40b-gqa";

bool is_linear(const std::string& name) {
  for (const char* m : {"query_key_value.weight", "self_attention.dense.weight",
                        "dense_h_to_4h.weight", "dense_4h_to_h.weight"})
    if (name.ends_with(m)) return true;
  return false;
}

struct Options {
  std::string scale_layout = "channel";  // channel [out], column [out, 1], tensor [1]
  DType scale_dtype = DType::kF32;
  json quantization_config = {
      {"quant_method", "compressed-tensors"},
      {"format", "float-quantized"},
      {"config_groups",
       {{"group_0",
         {{"targets", {"Linear"}},
          {"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}}},
          {"input_activations",
           {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}}}}}}},
      {"ignore", {"lm_head"}}};
  // Edits of the tensors to write (name -> tensor), after quantization.
  std::function<void(std::vector<std::pair<std::string, Tensor>>&)> edit;
};

// A folder like the fixture with its linears quantized; returns its path.
std::string make_checkpoint(const std::string& name, const Options& o) {
  const fs::path dir =
      fs::temp_directory_path() / ("kestrel_fp8_ckpt_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string src = fixture_dir(kFixture);
  json config = json::parse(std::ifstream(src + "/config.json"));
  config["quantization_config"] = o.quantization_config;
  std::ofstream(dir / "config.json") << config.dump(1);
  WeightStore store = WeightStore::open_folder(src);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const std::string& n : store.names()) {
    const TensorInfo& info = store.get(n);
    Tensor f32 = Tensor::empty(DType::kF32, info.shape);
    convert_to_f32(info.data, info.dtype, static_cast<size_t>(f32.numel()), f32.data<float>());
    if (!is_linear(n)) {
      out.emplace_back(n, f32);
      continue;
    }
    Tensor q, s;
    if (o.scale_layout == "tensor") {  // one scale: the tensor's amax / 448
      float amax = 0;
      for (int64_t i = 0; i < f32.numel(); ++i)
        amax = std::max(amax, std::fabs(f32.data<float>()[i]));
      s = Tensor::empty(DType::kF32, {1});
      s.data<float>()[0] = amax / 448.0f;
      q = Tensor::empty(DType::kF8E4M3, f32.shape());
      for (int64_t i = 0; i < f32.numel(); ++i)
        q.data<uint8_t>()[i] = f32_to_f8e4m3(f32.data<float>()[i] / s.data<float>()[0]);
    } else {
      ops::quantize_fp8(f32, q, s);
      if (o.scale_layout == "column") s = s.view({s.dim(0), 1});
    }
    if (o.scale_dtype == DType::kBF16) {
      Tensor b = Tensor::empty(DType::kBF16, s.shape());
      for (int64_t i = 0; i < s.numel(); ++i)
        b.data<uint16_t>()[i] = f32_to_bf16(s.data<float>()[i]);
      s = b;
    }
    out.emplace_back(n, q);
    out.emplace_back(n.substr(0, n.size() - 7) + ".weight_scale", s);
  }
  if (o.edit) o.edit(out);
  write_safetensors((dir / "model.safetensors").string(), out);
  return dir.string();
}

Tensor& tensor(std::vector<std::pair<std::string, Tensor>>& t, const std::string& name) {
  for (auto& [n, x] : t)
    if (n == name) return x;
  throw std::runtime_error("no tensor " + name);
}

std::string prompts_file() {
  const fs::path p =
      fs::temp_directory_path() / ("kestrel_fp8_prompts_" + std::to_string(getpid()));
  std::ofstream(p) << "[[1, 5, 9, 200, 17], [3, 4]]";
  return p.string();
}

// `kestrel logits` of `dir` (extra flags appended): the F32 logits, or the exit status and output.
test::CmdResult logits(const std::string& dir, const std::string& out,
                       const std::string& extra = "") {
  return test::run_kestrel(
      "logits --model " + dir + " --token-ids " + prompts_file() + " --out " + out + " " + extra,
      true);
}

std::vector<float> read_logits(const std::string& path) {
  WeightStore s = WeightStore::open_file(path);
  const TensorInfo& t = s.get("logits");
  const float* p = reinterpret_cast<const float*>(t.data);
  return {p, p + shape_numel(t.shape)};
}

TEST(Fp8Checkpoint, PerChannelScalesEqualQuantizeFp8) {
  const std::string tmp =
      fs::temp_directory_path() / ("kestrel_fp8_out_" + std::to_string(getpid()));
  auto r = logits(fixture_dir(kFixture), tmp + "_q.safetensors", "--quantize fp8");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<float> want = read_logits(tmp + "_q.safetensors");
  for (const char* layout : {"channel", "column"}) {
    Options o;
    o.scale_layout = layout;
    const std::string dir = make_checkpoint(std::string("ct_") + layout, o);
    r = logits(dir, tmp + "_ct.safetensors");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("checkpoint quantization: compressed-tensors"), std::string::npos)
        << r.out;
    EXPECT_EQ(read_logits(tmp + "_ct.safetensors"), want) << layout;
    // --quantize fp8 on an FP8 checkpoint changes nothing.
    r = logits(dir, tmp + "_ct2.safetensors", "--quantize fp8");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(read_logits(tmp + "_ct2.safetensors"), want);
    fs::remove_all(dir);
  }
}

TEST(Fp8Checkpoint, TgiFp8PerTensorAndBf16Scales) {
  const std::string tmp =
      fs::temp_directory_path() / ("kestrel_fp8_out2_" + std::to_string(getpid()));
  auto r = logits(fixture_dir(kFixture), tmp + "_ref.safetensors");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<float> ref = read_logits(tmp + "_ref.safetensors");
  for (const char* layout : {"tensor", "column"}) {
    Options o;
    o.scale_layout = layout;
    o.scale_dtype = DType::kBF16;
    o.quantization_config = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}};
    const std::string dir = make_checkpoint(std::string("tgi_") + layout, o);
    r = logits(dir, tmp + "_tgi.safetensors");
    ASSERT_EQ(r.status, 0) << r.out;
    const std::vector<float> got = read_logits(tmp + "_tgi.safetensors");
    EXPECT_LE(test::rel_error(got.data(), ref.data(), got.size()), 8e-2) << layout;
    EXPECT_GT(test::rel_error(got.data(), ref.data(), got.size()), 0.0) << "not quantized?";
    fs::remove_all(dir);
  }
}

// `random-model --dtype fp8` writes the FP8 checkpoint of the values `--dtype bf16` writes with the
// same seed: loaded, the two are the same model (with --quantize fp8 for the BF16 one).
TEST(Fp8Checkpoint, RandomModelWritesFp8) {
  const std::string base =
      fs::temp_directory_path() / ("kestrel_fp8_rand_" + std::to_string(getpid()));
  for (const char* dt : {"bf16", "fp8"}) {
    const auto r = test::run_kestrel("random-model --preset tiny --layers 2 --seed 7 --dtype " +
                                         std::string(dt) + " --out " + base + "_" + dt,
                                     true);
    ASSERT_EQ(r.status, 0) << r.out;
  }
  const json cfg = json::parse(std::ifstream(base + "_fp8/config.json"));
  EXPECT_EQ(cfg["quantization_config"]["quant_method"], "compressed-tensors");
  WeightStore fp8(WeightStore::open_folder(base + "_fp8"));
  EXPECT_EQ(fp8.get("transformer.h.0.mlp.dense_h_to_4h.weight").dtype, DType::kF8E4M3);
  EXPECT_EQ(fp8.get("transformer.h.0.mlp.dense_h_to_4h.weight_scale").dtype, DType::kF32);
  EXPECT_EQ(fp8.get("transformer.word_embeddings.weight").dtype, DType::kBF16);
  auto r = logits(base + "_bf16", base + "_a.safetensors", "--quantize fp8");
  ASSERT_EQ(r.status, 0) << r.out;
  r = logits(base + "_fp8", base + "_b.safetensors");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_logits(base + "_a.safetensors"), read_logits(base + "_b.safetensors"));
  for (const char* dt : {"_bf16", "_fp8"}) fs::remove_all(base + dt);
}

struct Bad {
  std::string name;
  Options options;
  std::string needle;
};

TEST(Fp8Checkpoint, BadCheckpointsFailNamingTheTensorOrKey) {
  const std::string qkv = "transformer.h.1.self_attention.query_key_value.weight";
  const std::string qkv_scale = "transformer.h.1.self_attention.query_key_value.weight_scale";
  std::vector<Bad> cases;
  for (float v : {NAN, 0.0f, -1.0f, INFINITY}) {
    Bad b{"corrupt", {}, qkv_scale};
    b.options.edit = [&, v](auto& t) { tensor(t, qkv_scale).template data<float>()[3] = v; };
    cases.push_back(b);
  }
  {
    Bad b{"shape", {}, qkv_scale};
    b.options.edit = [&](auto& t) { tensor(t, qkv_scale) = Tensor::zeros(DType::kF32, {2, 3}); };
    cases.push_back(b);
  }
  {
    Bad b{"missing", {}, qkv_scale};
    b.options.edit = [&](auto& t) {
      std::erase_if(t, [&](const auto& p) { return p.first == qkv_scale; });
    };
    cases.push_back(b);
  }
  {
    Bad b{"e5m2", {}, "F8_E5M2"};
    b.options.edit = [&](auto& t) {
      Tensor& w = tensor(t, qkv);
      Tensor e = Tensor::empty(DType::kF8E5M2, w.shape());
      std::memcpy(e.raw(), w.raw(), w.nbytes());
      w = e;
    };
    cases.push_back(b);
  }
  {
    Bad b{"block", {}, "weight_scale_inv"};
    b.options.edit = [&](auto& t) {
      t.emplace_back("transformer.h.1.self_attention.query_key_value.weight_scale_inv",
                     Tensor::zeros(DType::kF32, {1, 1}));
    };
    cases.push_back(b);
  }
  {
    Bad b{"fp8_embeddings", {}, "transformer.word_embeddings.weight"};
    b.options.edit = [&](auto& t) {
      Tensor& w = tensor(t, "transformer.word_embeddings.weight");
      Tensor e = Tensor::zeros(DType::kF8E4M3, w.shape());
      w = e;
    };
    cases.push_back(b);
  }
  Bad gptq{"gptq", {}, "quant_method 'gptq'"};
  gptq.options.quantization_config = {{"quant_method", "gptq"}, {"bits", 4}};
  cases.push_back(gptq);
  Bad blocks{"blocks", {}, "weight_block_size"};
  blocks.options.quantization_config = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  cases.push_back(blocks);
  Bad int4{"int4", {}, "config_groups.group_0.weights"};
  int4.options.quantization_config["config_groups"]["group_0"]["weights"] = {
      {"num_bits", 4}, {"type", "int"}, {"strategy", "group"}};
  cases.push_back(int4);
  Bad wrong_type{"wrong_type", {}, "quantization_config"};
  wrong_type.options.quantization_config["config_groups"]["group_0"]["weights"]["type"] = 8;
  cases.push_back(wrong_type);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Bad& c = cases[i];
    const std::string dir = make_checkpoint("bad" + std::to_string(i), c.options);
    const auto r = logits(dir, dir + "/out.safetensors");
    EXPECT_EQ(r.status, 1) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find("error: "), std::string::npos) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.name << ": " << r.out;
    fs::remove_all(dir);
  }
  // With tensor parallelism too: a corrupt scale, E5M2 codes, an FP8 embedding.
  for (size_t i : {0, 3, 5}) {
    const Bad& c = cases[i];
    const std::string dir = make_checkpoint("badtp" + std::to_string(i), c.options);
    const auto r = logits(dir, dir + "/out.safetensors", "--tensor-parallel 2");
    EXPECT_EQ(r.status, 1) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.name << ": " << r.out;
    fs::remove_all(dir);
  }
}

// Tensor parallelism shards an FP8 checkpoint like its BF16 base: each rank the codes of its
// slice and the scales of its rows (column-parallel) or of whole rows (row-parallel); N = 2 and 3
// give the single-rank logits (within 1e-5: the all-reduce sums in another order), per-channel
// and per-tensor scales.
TEST(Fp8Checkpoint, TensorParallelShardsCodesAndScales) {
  const std::string tmp =
      fs::temp_directory_path() / ("kestrel_fp8_tp_" + std::to_string(getpid()));
  for (const char* layout : {"channel", "tensor"}) {
    Options o;
    o.scale_layout = layout;
    const std::string dir = make_checkpoint(std::string("tp_") + layout, o);
    auto r = logits(dir, tmp + "_1.safetensors");
    ASSERT_EQ(r.status, 0) << r.out;
    const std::vector<float> one = read_logits(tmp + "_1.safetensors");
    for (int n : {2, 3}) {
      r = logits(dir, tmp + "_n.safetensors", "--tensor-parallel " + std::to_string(n));
      ASSERT_EQ(r.status, 0) << layout << " N = " << n << ": " << r.out;
      const std::vector<float> got = read_logits(tmp + "_n.safetensors");
      ASSERT_EQ(got.size(), one.size());
      EXPECT_LE(test::rel_error(got.data(), one.data(), got.size()), 1e-5)
          << layout << " N = " << n;
    }
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace kestrel
