// Normalises Falcon config.json dialects. The rules follow transformers'
// FalconConfig/FalconModel (what the reference numerics come from) and LoRAX's
// RWConfig for the original RefinedWeb keys.
#include "io/falcon_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace kestrel {
namespace {

using nlohmann::json;

// A present, non-null key among `names` (the first found), or nullptr.
const json* find_key(const json& j, std::initializer_list<const char*> names, std::string* used) {
  for (const char* name : names) {
    auto it = j.find(name);
    if (it != j.end() && !it->is_null()) {
      if (used) *used = name;
      return &*it;
    }
  }
  return nullptr;
}

int64_t get_int(const json& j, std::initializer_list<const char*> names, int64_t fallback,
                const std::string& where, bool required = false) {
  std::string used;
  const json* v = find_key(j, names, &used);
  if (!v) {
    KESTREL_CHECK(!required, where, ": missing required key \"", *names.begin(), "\"");
    return fallback;
  }
  if (v->is_number_float()) {
    double d = v->get<double>();
    KESTREL_CHECK(std::floor(d) == d && std::abs(d) < 9e15, where, ": \"", used,
                  "\" must be an integer, got ", v->dump());
    return static_cast<int64_t>(d);
  }
  KESTREL_CHECK(v->is_number_integer(), where, ": \"", used, "\" must be an integer, got ",
                v->dump());
  return v->get<int64_t>();
}

bool get_bool(const json& j, const char* name, bool fallback, const std::string& where) {
  const json* v = find_key(j, {name}, nullptr);
  if (!v) return fallback;
  KESTREL_CHECK(v->is_boolean(), where, ": \"", name, "\" must be true or false, got ", v->dump());
  return v->get<bool>();
}

double get_double(const json& j, const char* name, double fallback, const std::string& where) {
  const json* v = find_key(j, {name}, nullptr);
  if (!v) return fallback;
  KESTREL_CHECK(v->is_number(), where, ": \"", name, "\" must be a number, got ", v->dump());
  return v->get<double>();
}

// rope_scaling {"type"|"rope_type": linear|dynamic, "factor"} or transformers-5
// rope_parameters {"rope_type": default|linear|dynamic, "factor", "rope_theta"}.
RopeScaling parse_rope_scaling(const json& obj, const std::string& key, const std::string& where) {
  KESTREL_CHECK(obj.is_object(), where, ": \"", key, "\" must be an object, got ", obj.dump());
  RopeScaling s;
  std::string type;
  if (const json* t = find_key(obj, {"rope_type", "type"}, nullptr)) {
    KESTREL_CHECK(t->is_string(), where, ": ", key, ".rope_type must be a string");
    type = t->get<std::string>();
  }
  if (type.empty() || type == "default") return s;
  if (type == "linear") {
    s.kind = RopeScalingKind::kLinear;
  } else if (type == "dynamic") {
    s.kind = RopeScalingKind::kDynamic;
  } else {
    KESTREL_FAIL(where, ": rope scaling type \"", type, "\" in \"", key,
                 "\" is not supported (kestrel supports linear and dynamic)");
  }
  s.factor = get_double(obj, "factor", 0.0, where);
  KESTREL_CHECK(s.factor >= 1.0 && s.factor <= 1024.0, where, ": ", key,
                ".factor must be in [1, 1024], got ", s.factor);
  return s;
}

DType parse_config_dtype(const std::string& s, const std::string& where) {
  if (s == "bfloat16") return DType::kBF16;
  if (s == "float16") return DType::kF16;
  if (s == "float32") return DType::kF32;
  KESTREL_FAIL(where, ": unsupported dtype \"", s, "\" (bfloat16, float16 or float32)");
}

void validate(const FalconConfig& c, const std::string& where) {
  auto in_range = [&](const char* name, int64_t v, int64_t hi) {
    KESTREL_CHECK(v >= 1 && v <= hi, where, ": ", name, " must be in [1, ", hi, "], got ", v);
  };
  in_range("vocab_size", c.vocab_size, int64_t{1} << 24);
  in_range("hidden_size", c.hidden_size, int64_t{1} << 17);
  in_range("num_hidden_layers", c.n_layers, 4096);
  in_range("num_attention_heads", c.n_heads, 8192);
  in_range("num_kv_heads", c.n_kv_heads, 8192);
  in_range("ffn_hidden_size", c.ffn_hidden_size, int64_t{1} << 20);
  in_range("max_position_embeddings", c.max_position_embeddings, int64_t{1} << 24);
  KESTREL_CHECK(c.hidden_size % c.n_heads == 0, where, ": hidden_size ", c.hidden_size,
                " is not divisible by num_attention_heads ", c.n_heads);
  KESTREL_CHECK(c.n_heads % c.n_kv_heads == 0, where, ": num_attention_heads ", c.n_heads,
                " is not divisible by the number of K/V heads ", c.n_kv_heads);
  KESTREL_CHECK(c.alibi || c.head_dim % 2 == 0, where, ": head_dim ", c.head_dim,
                " must be even for rotary embeddings");
  KESTREL_CHECK(c.head_dim <= 1024, where, ": head_dim ", c.head_dim, " is larger than 1024");
  KESTREL_CHECK(c.layer_norm_epsilon > 0 && c.layer_norm_epsilon < 1, where,
                ": layer_norm_epsilon must be in (0, 1), got ", c.layer_norm_epsilon);
  KESTREL_CHECK(c.rope_theta > 0, where, ": rope_theta must be positive, got ", c.rope_theta);
}

}  // namespace

FalconConfig FalconConfig::from_json(const json& j, const std::string& where) {
  KESTREL_CHECK(j.is_object(), where, ": config must be a JSON object");
  FalconConfig c;
  if (const json* mt = find_key(j, {"model_type"}, nullptr)) {
    KESTREL_CHECK(mt->is_string(), where, ": \"model_type\" must be a string");
    c.model_type = mt->get<std::string>();
  }
  KESTREL_CHECK(
      c.model_type == "falcon" || c.model_type == "RefinedWeb" || c.model_type == "RefinedWebModel",
      where, ": model_type \"", c.model_type,
      "\" is not a Falcon model (falcon, RefinedWeb or RefinedWebModel)");
  const bool rw = c.model_type != "falcon";

  // RefinedWeb (40b) is the new decoder architecture, RefinedWebModel (7b) the
  // original; an explicit key wins, as in LoRAX's RWConfig.
  c.new_decoder_architecture =
      get_bool(j, "new_decoder_architecture", c.model_type == "RefinedWeb", where);
  c.hidden_size = get_int(j, {"hidden_size", "n_embed"}, 4544, where);
  c.n_layers = get_int(j, {"num_hidden_layers", "n_layer"}, 32, where);
  c.n_heads = get_int(j, {"num_attention_heads", "n_head"}, 71, where);
  c.vocab_size = get_int(j, {"vocab_size"}, 65024, where);
  // transformers' FalconConfig defaults multi_query to true, RWConfig to false.
  c.multi_query = get_bool(j, "multi_query", !rw, where);
  if (c.new_decoder_architecture) {
    c.n_kv_heads = get_int(j, {"num_kv_heads", "n_head_kv"}, c.n_heads, where);
  } else {
    // The original architecture ignores num_kv_heads (transformers-5 configs
    // of falcon-7b carry 71 beside multi_query).
    c.n_kv_heads = c.multi_query ? 1 : c.n_heads;
  }
  c.parallel_attn = c.new_decoder_architecture || get_bool(j, "parallel_attn", true, where);
  c.bias = get_bool(j, "bias", false, where);
  c.alibi = get_bool(j, "alibi", false, where);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", true, where);
  c.layer_norm_epsilon = get_double(j, "layer_norm_epsilon", 1e-5, where);
  c.max_position_embeddings = get_int(j, {"max_position_embeddings"}, 2048, where);
  c.ffn_hidden_size = get_int(j, {"ffn_hidden_size"}, 4 * c.hidden_size, where);
  c.bos_token_id = get_int(j, {"bos_token_id"}, 11, where);
  c.eos_token_id = get_int(j, {"eos_token_id"}, 11, where);
  if (c.new_decoder_architecture) {
    int64_t n_ln = get_int(j, {"num_ln_in_parallel_attn"}, 2, where);
    KESTREL_CHECK(n_ln == 1 || n_ln == 2, where, ": num_ln_in_parallel_attn must be 1 or 2, got ",
                  n_ln);
    c.num_ln_in_parallel_attn = static_cast<int>(n_ln);
  }
  if (const json* act = find_key(j, {"activation"}, nullptr)) {
    KESTREL_CHECK(act->is_string() && act->get<std::string>() == "gelu", where, ": activation ",
                  act->dump(), " is not supported (Falcon uses \"gelu\")");
  }
  std::string dtype_key;
  if (const json* dt = find_key(j, {"dtype", "torch_dtype"}, &dtype_key)) {
    KESTREL_CHECK(dt->is_string(), where, ": \"", dtype_key, "\" must be a string");
    c.dtype = parse_config_dtype(dt->get<std::string>(), where);
  }

  c.rope_theta = get_double(j, "rope_theta", 10000.0, where);
  if (const json* rp = find_key(j, {"rope_parameters"}, nullptr)) {
    KESTREL_CHECK(rp->is_object(), where, ": \"rope_parameters\" must be an object");
    if (!j.contains("rope_theta")) c.rope_theta = get_double(*rp, "rope_theta", 10000.0, where);
    c.rope_scaling = parse_rope_scaling(*rp, "rope_parameters", where);
  }
  if (const json* rs = find_key(j, {"rope_scaling"}, nullptr)) {
    c.rope_scaling = parse_rope_scaling(*rs, "rope_scaling", where);
  }

  KESTREL_CHECK(c.n_heads > 0, where, ": num_attention_heads must be positive, got ", c.n_heads);
  c.head_dim = c.hidden_size / c.n_heads;
  validate(c, where);
  return c;
}

FalconConfig FalconConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  KESTREL_CHECK(in.good(), "cannot open ", path);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  KESTREL_CHECK(!j.is_discarded(), path, ": not valid JSON");
  return from_json(j, path);
}

FalconConfig FalconConfig::from_model_dir(const std::string& dir) {
  return from_file(dir + "/config.json");
}

json FalconConfig::to_json() const {
  json j;
  j["model_type"] = "falcon";
  j["architectures"] = {"FalconForCausalLM"};
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = n_layers;
  j["num_attention_heads"] = n_heads;
  j["num_kv_heads"] = n_kv_heads;
  j["new_decoder_architecture"] = new_decoder_architecture;
  j["multi_query"] = multi_query;
  j["parallel_attn"] = parallel_attn;
  j["bias"] = bias;
  j["alibi"] = alibi;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["ffn_hidden_size"] = ffn_hidden_size;
  j["layer_norm_epsilon"] = layer_norm_epsilon;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rope_theta"] = rope_theta;
  j["activation"] = "gelu";
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  if (new_decoder_architecture) j["num_ln_in_parallel_attn"] = num_ln_in_parallel_attn;
  if (rope_scaling.kind != RopeScalingKind::kNone) {
    j["rope_scaling"] = {
        {"type", rope_scaling.kind == RopeScalingKind::kLinear ? "linear" : "dynamic"},
        {"factor", rope_scaling.factor}};
  }
  j["torch_dtype"] = dtype == DType::kBF16  ? "bfloat16"
                     : dtype == DType::kF16 ? "float16"
                                            : "float32";
  return j;
}

std::string FalconConfig::summary() const {
  std::ostringstream s;
  s << (new_decoder_architecture ? "new-decoder" : "original") << " arch, " << n_layers
    << " layers, hidden " << hidden_size << ", " << n_heads << " heads x " << head_dim << ", "
    << n_kv_heads << " kv heads, ffn " << ffn_hidden_size << ", vocab " << vocab_size
    << (parallel_attn ? ", parallel" : ", sequential") << (bias ? ", bias" : "")
    << (alibi ? ", alibi" : "") << (tie_word_embeddings ? ", tied lm_head" : ", own lm_head");
  return s.str();
}

}  // namespace kestrel
