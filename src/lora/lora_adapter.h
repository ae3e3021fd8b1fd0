// A LoRA adapter in PEFT's format (adapter_config.json + adapter_model.safetensors), prepared for
// one base model: for every rank of tensor parallelism, every layer and every targeted module,
// its A and B on the model's device in the model's dtype, sharded like the base layer they attach
// to (docs/lora.md). FalconModel::load_adapter makes one; the forward pass adds the deltas with
// ops::lora_add for the sequences of a batch that name it (ForwardBatch::adapters).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kestrel {

// The Falcon linears an adapter may target, by their PEFT module names.
enum class LoraModule : uint8_t { kQkv = 0, kDense, kFc1, kFc2 };
inline constexpr int kLoraModules = 4;
// "query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h".
const char* lora_module_name(LoraModule m);
// The module's path inside a layer ("transformer.h.N." + this): "self_attention.query_key_value",
// "self_attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h".
const char* lora_module_path(LoraModule m);

// adapter_config.json, the keys kestrel uses. from_file throws kestrel::Error naming the file and
// the key for anything it cannot honour (DoRA, fan_in_fan_out, modules_to_save, bias training,
// an unknown target module).
struct LoraConfig {
  int64_t r = 0;
  double lora_alpha = 0;
  bool use_rslora = false;  // scale alpha / sqrt(r), else alpha / r
  std::map<std::string, int64_t> rank_pattern;
  std::map<std::string, double> alpha_pattern;
  std::vector<int64_t> layers_to_transform;  // empty: every layer
  std::vector<LoraModule> target_modules;
  std::string base_model_name_or_path;

  static LoraConfig from_file(const std::string& path);

  // Whether the adapter attaches to module m of `layer` (target_modules and layers_to_transform).
  bool targets(int64_t layer, LoraModule m) const;
  // r and the scale of module m of `layer`: rank_pattern / alpha_pattern by peft's rule (a key
  // matches the module's name, "transformer.h.N.self_attention.query_key_value", as a suffix at a
  // '.'), else r / lora_alpha; scale alpha / r, or alpha / sqrt(r) with use_rslora.
  int64_t rank_for(int64_t layer, LoraModule m) const;
  float scale_for(int64_t layer, LoraModule m) const;
};

// "transformer.h.N.self_attention.query_key_value" and the like (peft's module names).
std::string lora_module_key(int64_t layer, LoraModule m);

// One module of one layer: a [r, in], b [out, r] (a rank's shard), scale alpha / r (or / sqrt r).
// Undefined when the adapter does not target it.
struct LoraLinear {
  Tensor a, b;
  float scale = 0.0f;
  bool defined() const { return a.defined(); }
};

class LoraAdapter {
 public:
  LoraAdapter(std::string name, std::string source, int n_ranks, int64_t n_layers);

  const std::string& name() const { return name_; }
  const std::string& source() const { return source_; }  // the folder it came from ("" if made)
  // A key that tells adapters apart in the prefix cache and the scheduler (a hash of name, source
  // and the load's number): KV computed under one adapter is never reused under another, a
  // reload of the same folder, or the base model.
  uint64_t cache_key() const { return cache_key_; }
  int n_ranks() const { return static_cast<int>(ranks_.size()); }
  int64_t n_layers() const { return n_layers_; }

  const LoraLinear& linear(int rank, int64_t layer, LoraModule m) const;
  LoraLinear& mutable_linear(int rank, int64_t layer, LoraModule m);
  // Bytes of A and B over every rank (device memory it holds).
  int64_t bytes() const;
  // The largest r of any module.
  int64_t max_rank() const;

 private:
  std::string name_, source_;
  uint64_t cache_key_ = 0;
  int64_t n_layers_ = 0;
  // ranks_[rank][layer][module]
  std::vector<std::vector<std::array<LoraLinear, kLoraModules>>> ranks_;
};

}  // namespace kestrel
