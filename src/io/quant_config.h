// Pre-quantized FP8 checkpoints: what config.json's quantization_config says, checked before any
// weight is read. Two layouts are read as they are: compressed-tensors (llm-compressor, vLLM:
// `quant_method: "compressed-tensors"`, FP8 E4M3 weights with `weight_scale` per tensor or per
// channel, optional static `input_scale`) and TGI / vLLM's `fp8` (`weight_scale` per tensor or
// per channel). What kestrel cannot honour (other methods, integer or block-wise quantization,
// E5M2 weights) is refused naming the key. docs/fp8.md.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kestrel {

struct CheckpointQuant {
  std::string method;                // "" (none), "compressed-tensors" or "fp8"
  bool static_input_scales = false;  // input_scale tensors present (read, not used: docs/fp8.md)
  std::vector<std::string> ignore;   // modules left unquantized (compressed-tensors' `ignore`)
};

// Reads `quantization_config` of a parsed config.json (absent or null: method ""). Throws a
// kestrel::Error naming `where` and the key of whatever is not supported.
CheckpointQuant parse_checkpoint_quant(const nlohmann::json& config, const std::string& where);

// The same from DIR/config.json.
CheckpointQuant checkpoint_quant_of(const std::string& dir);

}  // namespace kestrel
