// quantization_config of config.json (quant_config.h).
#include "io/quant_config.h"

#include <fstream>

#include "core/error.h"

namespace kestrel {
namespace {

using nlohmann::json;

std::string brief(const json& v) {
  std::string s = v.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

// A compressed-tensors quantization args object ("weights" / "input_activations"): FP8 E4M3 only.
void check_fp8_args(const json& a, const std::string& key, bool weights) {
  if (a.is_null()) return;
  if (!a.is_object()) KESTREL_FAIL(key, " is ", brief(a), ", not an object");
  const std::string type = a.value("type", "float");
  const int bits = a.value("num_bits", 8);
  if (type != "float" || bits != 8)
    KESTREL_FAIL(key, ": ", type, " with ", bits,
                 " bits is not supported (kestrel reads FP8 E4M3: type float, num_bits 8)");
  const std::string strategy = a.value("strategy", "tensor");
  const bool ok = weights ? (strategy == "tensor" || strategy == "channel")
                          : (strategy == "tensor" || strategy == "token");
  if (!ok)
    KESTREL_FAIL(key, ".strategy '", strategy, "' is not supported (",
                 weights ? "tensor or channel" : "tensor or token", ")");
  if (weights && a.contains("block_structure") && !a["block_structure"].is_null())
    KESTREL_FAIL(key, ".block_structure: block-wise FP8 scales are not supported");
  if (!a.value("symmetric", true)) KESTREL_FAIL(key, ".symmetric false is not supported");
}

}  // namespace

CheckpointQuant parse_checked(const json& config, const std::string& where);

CheckpointQuant parse_checkpoint_quant(const json& config, const std::string& where) {
  try {
    return parse_checked(config, where);
  } catch (const json::exception& e) {  // a key of the wrong type, read by json::value
    KESTREL_FAIL(where, ": quantization_config: ", e.what());
  }
}

CheckpointQuant parse_checked(const json& config, const std::string& where) {
  CheckpointQuant q;
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return q;
  const json& qc = *it;
  const std::string at = where + ": quantization_config";
  if (!qc.is_object()) KESTREL_FAIL(at, " is ", brief(qc), ", not an object");
  auto m = qc.find("quant_method");
  if (m == qc.end() || !m->is_string())
    KESTREL_FAIL(at, ".quant_method is missing or not a string");
  q.method = m->get<std::string>();
  if (q.method == "fp8") {
    if (auto b = qc.find("weight_block_size"); b != qc.end() && !b->is_null())
      KESTREL_FAIL(at, ".weight_block_size ", brief(*b),
                   ": block-wise FP8 scales are not supported (per tensor or per channel only)");
    const std::string scheme = qc.value("activation_scheme", "dynamic");
    if (scheme != "dynamic" && scheme != "static")
      KESTREL_FAIL(at, ".activation_scheme '", scheme, "' is not supported (dynamic or static)");
    q.static_input_scales = scheme == "static";
    return q;
  }
  if (q.method == "compressed-tensors") {
    const std::string format = qc.value("format", "float-quantized");
    if (format != "float-quantized" && format != "naive-quantized")
      KESTREL_FAIL(at, ".format '", format,
                   "' is not supported (float-quantized: FP8 weights stored as they are)");
    auto groups = qc.find("config_groups");
    if (groups == qc.end() || !groups->is_object() || groups->empty())
      KESTREL_FAIL(at, ".config_groups is missing or empty");
    for (const auto& [name, g] : groups->items()) {
      const std::string key = at + ".config_groups." + name;
      if (!g.is_object()) KESTREL_FAIL(key, " is ", brief(g), ", not an object");
      check_fp8_args(g.value("weights", json()), key + ".weights", true);
      const json acts = g.value("input_activations", json());
      check_fp8_args(acts, key + ".input_activations", false);
      if (acts.is_object() && !acts.value("dynamic", true)) q.static_input_scales = true;
      if (auto o = g.find("output_activations"); o != g.end() && !o->is_null())
        KESTREL_FAIL(key, ".output_activations: quantized outputs are not supported");
    }
    if (auto kv = qc.find("kv_cache_scheme"); kv != qc.end() && !kv->is_null())
      KESTREL_FAIL(at, ".kv_cache_scheme: checkpoint KV cache scales are not supported yet");
    if (auto ig = qc.find("ignore"); ig != qc.end() && ig->is_array())
      for (const json& s : *ig)
        if (s.is_string()) q.ignore.push_back(s.get<std::string>());
    return q;
  }
  KESTREL_FAIL(at, ".quant_method '", q.method,
               "' is not supported (compressed-tensors or fp8 FP8 checkpoints, or a BF16 / F16 / "
               "F32 checkpoint with --quantize fp8)");
}

CheckpointQuant checkpoint_quant_of(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in.good()) return {};
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return {};  // FalconConfig names the broken file
  return parse_checkpoint_quant(j, path);
}

}  // namespace kestrel
