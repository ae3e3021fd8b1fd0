// FalconConfig: every config.json dialect of the Falcon family (transformers'
// `falcon`, the original RefinedWeb / RefinedWebModel keys, transformers-5
// `rope_parameters`) normalised in one place, validated, with derived sizes.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"

namespace kestrel {

enum class RopeScalingKind : uint8_t { kNone, kLinear, kDynamic };

struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::kNone;
  double factor = 1.0;
};

struct FalconConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // as transformers derives it (see from_json)
  int64_t head_dim = 0;
  int64_t ffn_hidden_size = 0;
  int64_t max_position_embeddings = 2048;
  bool new_decoder_architecture = false;
  bool multi_query = false;
  bool parallel_attn = true;  // the new architecture is always parallel
  bool bias = false;
  bool alibi = false;
  bool tie_word_embeddings = true;
  int num_ln_in_parallel_attn = 1;  // 2: ln_attn + ln_mlp (new architecture only)
  double layer_norm_epsilon = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t bos_token_id = 11;
  int64_t eos_token_id = 11;
  DType dtype = DType::kBF16;  // stored precision (config "dtype"/"torch_dtype")
  std::string model_type = "falcon";
  // Tensor parallelism: a rank's model config holds the rank's own n_heads, n_kv_heads and
  // ffn_hidden_size (parallel/sharding.h); these say where its query heads sit in the full model
  // (ALiBi slopes are per global head). Local head h is global head tp_first_head + h (with
  // grouped-query attention split between ranks a rank may hold zero padding heads: see
  // docs/parallel.md). tp_total_heads 0: the full model (no tensor parallelism).
  int64_t tp_first_head = 0;
  int64_t tp_total_heads = 0;

  // Parses and validates; `where` names the source in error messages.
  static FalconConfig from_json(const nlohmann::json& j, const std::string& where);
  static FalconConfig from_file(const std::string& path);
  // DIR/config.json.
  static FalconConfig from_model_dir(const std::string& dir);

  // A modern transformers `falcon` config.json that from_json reads back.
  nlohmann::json to_json() const;

  // Rows of the fused query_key_value weight: (n_heads + 2 * n_kv_heads) * head_dim.
  int64_t qkv_out_dim() const { return (n_heads + 2 * n_kv_heads) * head_dim; }
  // Whether a layer has ln_attn + ln_mlp (else one input_layernorm).
  bool two_layer_norms() const { return new_decoder_architecture && num_ln_in_parallel_attn == 2; }
  std::string summary() const;
};

}  // namespace kestrel
