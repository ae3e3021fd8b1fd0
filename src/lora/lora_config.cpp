// LoraConfig::from_file: adapter_config.json as peft saves it, the keys kestrel honours and a clear
// error for the ones it cannot (docs/lora.md).
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "lora/lora_adapter.h"

namespace kestrel {
namespace {

using nlohmann::json;

bool ends_with_key(const std::string& name, const std::string& key) {
  // peft matches target_modules and pattern keys as a suffix at a '.' boundary.
  if (name == key) return true;
  return name.size() > key.size() && name.compare(name.size() - key.size(), key.size(), key) == 0 &&
         name[name.size() - key.size() - 1] == '.';
}

bool has_regex_chars(const std::string& s) {
  return s.find_first_of("*+?[](){}|^$\\") != std::string::npos;
}

// The modules a target_modules entry names (none: unknown).
std::vector<LoraModule> modules_named(const std::string& key) {
  std::vector<LoraModule> out;
  for (int i = 0; i < kLoraModules; ++i) {
    const auto m = static_cast<LoraModule>(i);
    if (ends_with_key(lora_module_path(m), key)) out.push_back(m);
  }
  return out;
}

}  // namespace

std::string lora_module_key(int64_t layer, LoraModule m) {
  return "transformer.h." + std::to_string(layer) + "." + lora_module_path(m);
}

bool LoraConfig::targets(int64_t layer, LoraModule m) const {
  bool module = false;
  for (LoraModule t : target_modules) module = module || t == m;
  if (!module) return false;
  if (layers_to_transform.empty()) return true;
  for (int64_t l : layers_to_transform)
    if (l == layer) return true;
  return false;
}

// peft takes the first pattern key that matches the module's name as a suffix; kestrel's keys are
// literal (no regular expressions), and the longest matching key wins, so the order of the file's
// keys does not matter.
template <typename V>
static const V* pattern_value(const std::map<std::string, V>& pattern, const std::string& name) {
  const V* best = nullptr;
  size_t best_len = 0;
  for (const auto& [key, v] : pattern) {
    if (ends_with_key(name, key) && key.size() >= best_len) {
      best = &v;
      best_len = key.size();
    }
  }
  return best;
}

int64_t LoraConfig::rank_for(int64_t layer, LoraModule m) const {
  const int64_t* p = pattern_value(rank_pattern, lora_module_key(layer, m));
  return p ? *p : r;
}

float LoraConfig::scale_for(int64_t layer, LoraModule m) const {
  const double* p = pattern_value(alpha_pattern, lora_module_key(layer, m));
  const double alpha = p ? *p : lora_alpha;
  const double rank = static_cast<double>(rank_for(layer, m));
  return static_cast<float>(use_rslora ? alpha / std::sqrt(rank) : alpha / rank);
}

LoraConfig LoraConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  KESTREL_CHECK(in.good(), "LoRA adapter: cannot open ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::exception& e) {
    KESTREL_FAIL("LoRA adapter: ", path, " is not valid JSON: ", e.what());
  }
  KESTREL_CHECK(j.is_object(), "LoRA adapter: ", path, " is not a JSON object");
  auto bad = [&](const std::string& key, const std::string& why) -> void {
    KESTREL_FAIL("LoRA adapter: ", path, ": \"", key, "\" ", why);
  };
  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  auto get_int = [&](const json& v, const std::string& key) -> int64_t {
    if (!v.is_number_integer()) bad(key, "must be an integer, not " + v.dump());
    return v.get<int64_t>();
  };
  auto get_num = [&](const json& v, const std::string& key) -> double {
    if (!v.is_number()) bad(key, "must be a number, not " + v.dump());
    return v.get<double>();
  };

  if (present("peft_type") && j["peft_type"] != "LORA")
    bad("peft_type", "is " + j["peft_type"].dump() + "; only LORA adapters are supported");
  if (present("use_dora") && j["use_dora"] != false)
    bad("use_dora", "is true: DoRA adapters are not supported");
  if (present("fan_in_fan_out") && j["fan_in_fan_out"] != false)
    bad("fan_in_fan_out", "is true: Falcon's linears are not Conv1D; not supported");
  if (present("modules_to_save") &&
      !(j["modules_to_save"].is_array() && j["modules_to_save"].empty()))
    bad("modules_to_save", "is " + j["modules_to_save"].dump() +
                               ": adapters that replace whole modules are not supported");
  if (present("bias") && j["bias"] != "none")
    bad("bias", "is " + j["bias"].dump() + ": trained biases are not supported (only \"none\")");
  if (present("lora_bias") && j["lora_bias"] != false)
    bad("lora_bias", "is true: LoRA biases are not supported");
  if (present("layer_replication")) bad("layer_replication", "is set: not supported");
  if (present("layers_pattern") &&
      !(j["layers_pattern"].is_array() && j["layers_pattern"].empty()) &&
      !(j["layers_pattern"].is_string() && j["layers_pattern"] == "h"))
    bad("layers_pattern", "is " + j["layers_pattern"].dump() + ": Falcon's layers are \"h\"");

  LoraConfig c;
  if (!present("r")) bad("r", "is missing");
  c.r = get_int(j["r"], "r");
  if (c.r <= 0) bad("r", "must be positive, not " + std::to_string(c.r));
  c.lora_alpha = present("lora_alpha") ? get_num(j["lora_alpha"], "lora_alpha") : 8.0;
  if (present("use_rslora")) {
    if (!j["use_rslora"].is_boolean()) bad("use_rslora", "must be true or false");
    c.use_rslora = j["use_rslora"].get<bool>();
  }
  auto check_pattern_key = [&](const std::string& field, const std::string& key) {
    if (has_regex_chars(key))
      bad(field, "key \"" + key + "\" is a regular expression; only module names are supported");
  };
  if (present("rank_pattern")) {
    if (!j["rank_pattern"].is_object()) bad("rank_pattern", "must be an object");
    for (const auto& [k, v] : j["rank_pattern"].items()) {
      check_pattern_key("rank_pattern", k);
      c.rank_pattern[k] = get_int(v, "rank_pattern." + k);
      if (c.rank_pattern[k] <= 0) bad("rank_pattern." + k, "must be positive");
    }
  }
  if (present("alpha_pattern")) {
    if (!j["alpha_pattern"].is_object()) bad("alpha_pattern", "must be an object");
    for (const auto& [k, v] : j["alpha_pattern"].items()) {
      check_pattern_key("alpha_pattern", k);
      c.alpha_pattern[k] = get_num(v, "alpha_pattern." + k);
    }
  }
  if (present("layers_to_transform")) {
    const json& v = j["layers_to_transform"];
    if (v.is_array()) {
      for (const json& e : v) c.layers_to_transform.push_back(get_int(e, "layers_to_transform"));
    } else {
      c.layers_to_transform.push_back(get_int(v, "layers_to_transform"));
    }
    for (int64_t l : c.layers_to_transform)
      if (l < 0) bad("layers_to_transform", "holds the negative layer " + std::to_string(l));
  }
  if (!present("target_modules")) bad("target_modules", "is missing");
  const json& t = j["target_modules"];
  std::vector<std::string> names;
  if (t.is_string()) {
    const std::string s = t.get<std::string>();
    if (s == "all-linear") {
      names = {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"};
    } else if (has_regex_chars(s)) {
      bad("target_modules", "is the regular expression \"" + s +
                                "\"; only a list of module names (or one name) is supported");
    } else {
      names = {s};
    }
  } else if (t.is_array()) {
    for (const json& e : t) {
      if (!e.is_string()) bad("target_modules", "holds " + e.dump() + ", not a module name");
      names.push_back(e.get<std::string>());
    }
  } else {
    bad("target_modules", "must be a list of module names, not " + t.dump());
  }
  for (const std::string& n : names) {
    const std::vector<LoraModule> ms = modules_named(n);
    if (ms.empty())
      bad("target_modules",
          "names \"" + n +
              "\", not a Falcon linear (query_key_value, dense, dense_h_to_4h, dense_4h_to_h)");
    for (LoraModule m : ms) {
      bool seen = false;
      for (LoraModule e : c.target_modules) seen = seen || e == m;
      if (!seen) c.target_modules.push_back(m);
    }
  }
  if (c.target_modules.empty()) bad("target_modules", "is empty");
  if (present("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
    c.base_model_name_or_path = j["base_model_name_or_path"].get<std::string>();
  return c;
}

}  // namespace kestrel
