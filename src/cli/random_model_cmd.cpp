// `kestrel random-model`: writes a Falcon model folder (config.json + sharded
// safetensors, the real tensor layout) with random weights at the real shapes,
// for benchmarks: no real checkpoint can be downloaded where kestrel is built.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/presets.h"
#include "core/error.h"
#include "core/logging.h"
#include "io/falcon_config.h"
#include "io/safetensors.h"
#include "model/falcon_weights.h"

namespace kestrel::cli {
namespace {

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// Uniform in [-amp, amp] (amp 0: the constant `fill`), chunked so that the
// result does not depend on the thread count.
void fill_random(std::span<std::byte> out, DType dtype, uint64_t seed, float amp, float constant) {
  const int64_t n = static_cast<int64_t>(out.size() / dtype_size(dtype));
  constexpr int64_t kChunk = 1 << 16;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    uint64_t s = seed ^ (static_cast<uint64_t>(c0) * 0x2545f4914f6cdd1dull);
    const int64_t c1 = std::min(n, c0 + kChunk);
    for (int64_t i = c0; i < c1; ++i) {
      float v = constant;
      if (amp > 0) v = amp * (static_cast<float>(splitmix(s) >> 40) / 8388608.0f - 1.0f);
      if (dtype == DType::kF32) {
        reinterpret_cast<float*>(out.data())[i] = v;
      } else {
        reinterpret_cast<uint16_t*>(out.data())[i] =
            dtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
      }
    }
  }
}

// The values fill_random draws for a tensor of n elements, rounded to BF16 (what a BF16 folder of
// the same seed holds), as floats.
std::vector<float> draw_bf16(int64_t n, uint64_t seed, float amp, float constant) {
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  fill_random(std::as_writable_bytes(std::span<uint16_t>(bits)), DType::kBF16, seed, amp, constant);
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_f32(bits[i]);
  return out;
}

// Per output row of [rows, cols] values: the FP8 scale (amax / 448, 1 for zeros), as
// ops::quantize_fp8 computes it.
std::vector<float> row_scales(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> s(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(v[r * cols + c]));
    s[r] = fp8_scale(amax);
  }
  return s;
}

bool is_fp8_linear(const std::string& name) {
  for (const char* m : {".query_key_value.weight", ".self_attention.dense.weight",
                        ".dense_h_to_4h.weight", ".dense_4h_to_h.weight"})
    if (name.size() > std::strlen(m) && name.ends_with(m)) return true;
  return false;
}

struct RandomArgs {
  std::string preset = "tiny";
  std::string out;
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0;
  std::string dtype = "bf16";
  uint64_t seed = 0;
  int64_t shard_mb = 4096;
  std::string tokenizer;
};

void run_random_model(const RandomArgs& a) {
  FalconConfig c = falcon_preset(a.preset);
  if (a.layers) c.n_layers = a.layers;
  if (a.hidden) {
    c.hidden_size = a.hidden;
    if (!a.ffn) c.ffn_hidden_size = 4 * a.hidden;
  }
  if (a.heads) {
    // Without --hidden, a head count that does not divide the preset's width keeps the preset's
    // head_dim instead (`--preset tiny --heads 7`: hidden 7 x 16 = 112).
    if (!a.hidden && c.hidden_size % a.heads != 0) {
      c.hidden_size = a.heads * (c.hidden_size / c.n_heads);
    }
    c.n_heads = a.heads;
    if (!c.new_decoder_architecture && !c.multi_query) c.n_kv_heads = a.heads;
  }
  if (a.kv_heads) {
    if (!c.new_decoder_architecture) {
      // The original architecture has 1 K/V head (multi-query) or one per head.
      KESTREL_CHECK(a.kv_heads == 1 || a.kv_heads == c.n_heads, "preset ", a.preset,
                    " is the original architecture: --kv-heads must be 1 or --heads (", c.n_heads,
                    ")");
      c.multi_query = a.kv_heads == 1;
    }
    c.n_kv_heads = a.kv_heads;
  }
  if (a.ffn) c.ffn_hidden_size = a.ffn;
  if (a.vocab) c.vocab_size = a.vocab;
  // fp8: the linears as an FP8 checkpoint (compressed-tensors, per-channel scales) of the values a
  // BF16 folder of the same seed holds, the rest BF16: `--dtype fp8` loads to exactly what
  // `--dtype bf16` loads to with --quantize fp8, at half the bytes on disk.
  const bool fp8 = a.dtype == "fp8";
  c.dtype = a.dtype == "bf16" || fp8 ? DType::kBF16
            : a.dtype == "f16"       ? DType::kF16
            : a.dtype == "f32"
                ? DType::kF32
                : throw Error("--dtype must be bf16, f16, f32 or fp8, got " + a.dtype);
  // Round-trip through the parser so that what we write is what the loader reads.
  c = FalconConfig::from_json(c.to_json(), "random-model " + a.preset);

  std::filesystem::create_directories(a.out);
  std::vector<TensorSpec> specs;
  const DType dt = c.dtype;
  int64_t n_params = 0;
  for (const WeightSpec& w : falcon_weight_specs(c, /*with_lm_head=*/!c.tie_word_embeddings)) {
    n_params += shape_numel(w.shape);
    const bool is_norm =
        w.name.find("ln") != std::string::npos || w.name.find("layernorm") != std::string::npos;
    const bool is_bias = w.name.size() > 5 && w.name.compare(w.name.size() - 5, 5, ".bias") == 0;
    const float constant = is_norm && !is_bias ? 1.0f : 0.0f;
    const float amp = is_norm || is_bias ? 0.0f : 0.02f * std::sqrt(3.0f);
    const uint64_t seed = name_hash(w.name) ^ (a.seed * 0x9e3779b97f4a7c15ull);
    if (fp8 && is_fp8_linear(w.name)) {
      const int64_t rows = w.shape[0], cols = w.shape[1];
      specs.push_back({w.name, DType::kF8E4M3, w.shape, [=](std::span<std::byte> out) {
                         const std::vector<float> v = draw_bf16(rows * cols, seed, amp, constant);
                         const std::vector<float> s = row_scales(v, rows, cols);
                         auto* q = reinterpret_cast<uint8_t*>(out.data());
#pragma omp parallel for schedule(static)
                         for (int64_t r = 0; r < rows; ++r)
                           for (int64_t k = 0; k < cols; ++k)
                             q[r * cols + k] = f32_to_f8e4m3(v[r * cols + k] / s[r]);
                       }});
      const std::string scale_name = w.name.substr(0, w.name.size() - 7) + ".weight_scale";
      specs.push_back({scale_name, DType::kF32, {rows}, [=](std::span<std::byte> out) {
                         const std::vector<float> s =
                             row_scales(draw_bf16(rows * cols, seed, amp, constant), rows, cols);
                         std::memcpy(out.data(), s.data(), s.size() * sizeof(float));
                       }});
      continue;
    }
    specs.push_back({w.name, dt, w.shape,
                     [=](std::span<std::byte> out) { fill_random(out, dt, seed, amp, constant); }});
  }
  {
    nlohmann::json config = c.to_json();
    if (fp8)
      config["quantization_config"] = {
          {"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights",
               {{"num_bits", 8},
                {"type", "float"},
                {"strategy", "channel"},
                {"symmetric", true},
                {"dynamic", false}}},
              {"input_activations",
               {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}}}}}}},
          {"ignore", {"lm_head"}}};
    std::ofstream cfg(std::filesystem::path(a.out) / "config.json");
    cfg << config.dump(2) << "\n";
    KESTREL_CHECK(cfg.good(), "cannot write ", a.out, "/config.json");
  }
  if (!a.tokenizer.empty()) {
    std::filesystem::copy_file(a.tokenizer, std::filesystem::path(a.out) / "tokenizer.json",
                               std::filesystem::copy_options::overwrite_existing);
  }
  write_sharded_safetensors(a.out, specs, static_cast<size_t>(a.shard_mb) << 20);
  spdlog::info("wrote random {} ({}) to {}", a.preset, c.summary(), a.out);
  std::printf("parameters: %lld (%.2f B)\n", static_cast<long long>(n_params), n_params / 1e9);
}

}  // namespace

void add_random_model_command(CLI::App& app) {
  static RandomArgs a;
  CLI::App* cmd = app.add_subcommand(
      "random-model", "write a Falcon model folder with random weights at real shapes");
  cmd->add_option("--preset", a.preset,
                  "falcon-7b, falcon-40b, falcon-180b, falcon2-11b, falcon-rw-1b or tiny")
      ->capture_default_str();
  cmd->add_option("--out", a.out, "output folder")->required();
  cmd->add_option("--layers", a.layers, "override the layer count");
  cmd->add_option("--hidden", a.hidden, "override hidden_size");
  cmd->add_option("--heads", a.heads,
                  "override num_attention_heads (keeps head_dim when the width does not divide)");
  cmd->add_option("--kv-heads", a.kv_heads, "override the K/V head count");
  cmd->add_option("--ffn", a.ffn, "override ffn_hidden_size");
  cmd->add_option("--vocab", a.vocab, "override vocab_size");
  cmd->add_option("--dtype", a.dtype,
                  "bf16, f16, f32, or fp8 (the linears as a compressed-tensors FP8 checkpoint, "
                  "the rest bf16)")
      ->capture_default_str();
  cmd->add_option("--seed", a.seed, "random seed")->capture_default_str();
  cmd->add_option("--shard-size-mb", a.shard_mb, "largest shard")->capture_default_str();
  cmd->add_option("--tokenizer", a.tokenizer, "tokenizer.json to copy into the folder");
  cmd->callback([] { run_random_model(a); });
}

}  // namespace kestrel::cli
