// Parsing and validation of LoRAX / TGI generate requests into SamplingParams.
#include "server/generate_request.h"

#include <cmath>

#include "core/error.h"
#include "server/response_format.h"

namespace kestrel::server {
namespace {

[[noreturn]] void invalid(const char* field, const std::string& message) {
  throw ValidationError(field, message);
}

const json& member_or_null(const json& obj, const char* key) {
  static const json kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

std::string num(double v) {
  std::string s = json(v).dump();
  return s;
}

// Parameters the engine cannot honour yet: accepted when absent, null or false.
void refuse_unsupported(const json& p) {
  for (const char* field : {"adapter_parameters", "api_token"}) {
    auto it = p.find(field);
    if (it != p.end() && !it->is_null())
      invalid(field, std::string("`") + field + "` is not supported yet");
  }
  if (auto w = opt_bool(p, "watermark"); w && *w)
    invalid("watermark", "`watermark` is not supported yet");
}

// adapter_id (a folder path, a name under --adapters-dir, or a hub ORG/NAME) and adapter_source
// ("local" by default, "hub"; anything else a 422 naming it). The source is checked even without
// an id, as LoRAX does.
std::optional<AdapterRef> parse_adapter(const json& p) {
  AdapterRef ref;
  if (auto src = opt_string(p, "adapter_source")) {
    try {
      ref.source = parse_adapter_source(*src);
    } catch (const Error& e) {
      invalid("adapter_source", std::string("`adapter_source`: ") + e.what());
    }
  }
  const std::optional<std::string> id = opt_string(p, "adapter_id");
  if (!id || id->empty()) return std::nullopt;
  ref.id = *id;
  return ref;
}

// The adapters one merge may name (each is read from its folder for the merge).
constexpr size_t kMaxMergedAdapters = 32;

// LoRAX's merged_adapters {ids, weights, merge_strategy, density, majority_sign_method} (null
// fields as absent): a MergeSpec, validated (422s name merged_adapters.<field>). The seed is set
// by the caller.
MergeSpec parse_merged_adapters(const json& m) {
  if (!m.is_object())
    invalid("merged_adapters",
            std::string("`merged_adapters` must be an object, got ") + m.type_name());
  MergeSpec spec;
  const json& ids = member_or_null(m, "ids");
  if (ids.is_null()) invalid("merged_adapters.ids", "`merged_adapters.ids` is required");
  if (!ids.is_array())
    invalid("merged_adapters.ids", std::string("`merged_adapters.ids` must be an array of adapter "
                                               "ids, got ") +
                                       ids.type_name());
  if (ids.size() > kMaxMergedAdapters)
    invalid("merged_adapters.ids", "`merged_adapters.ids` names " + std::to_string(ids.size()) +
                                       " adapters; at most " + std::to_string(kMaxMergedAdapters) +
                                       " are merged at once");
  for (const json& id : ids) {
    if (!id.is_string() || id.get<std::string>().empty())
      invalid("merged_adapters.ids", "`merged_adapters.ids` must hold non-empty strings");
    spec.ids.push_back(id.get<std::string>());
  }
  const json& w = member_or_null(m, "weights");
  if (w.is_null()) {
    spec.weights.assign(spec.ids.size(), 1.0);
  } else {
    if (!w.is_array())
      invalid("merged_adapters.weights",
              std::string("`merged_adapters.weights` must be an array of numbers, got ") +
                  w.type_name());
    for (const json& x : w) {
      if (!x.is_number())
        invalid("merged_adapters.weights", "`merged_adapters.weights` must hold numbers");
      spec.weights.push_back(x.get<double>());
    }
  }
  try {
    if (auto st = opt_string(m, "merge_strategy")) spec.strategy = parse_merge_strategy(*st);
    if (auto d = opt_number(m, "density")) spec.density = *d;
    if (auto sm = opt_string(m, "majority_sign_method"))
      spec.majority_sign_method = parse_majority_sign_method(*sm);
  } catch (const ValidationError& e) {
    // opt_* name the bare key: the field is inside merged_adapters.
    if (e.field().rfind("merged_adapters.", 0) == 0) throw;
    throw ValidationError("merged_adapters." + e.field(),
                          "merged_adapters." + e.field() + ": " + e.what(), e.kind());
  }
  spec.validate();
  return spec;
}

}  // namespace

void apply_sampling(const SamplingInput& in, SamplingParams& out) {
  bool warpers = false;
  if (in.temperature) {
    const double t = *in.temperature;
    if (!(t >= 0) || !std::isfinite(t))
      invalid("temperature", "`temperature` must be >= 0 (0 means greedy), got " + num(t));
    if (t > 0) {
      out.temperature = static_cast<float>(t);
      warpers |= t != 1.0;
    }
  }
  if (in.top_k) {
    const double k = *in.top_k;
    if (!(k >= 0) || k > 1e9 || std::floor(k) != k)
      invalid("top_k", "`top_k` must be an integer >= 0 (0 means off), got " + num(k));
    out.top_k = static_cast<int32_t>(k);
    warpers |= out.top_k > 0;
  }
  if (in.top_p) {
    const double p = *in.top_p;
    if (!(p > 0 && p <= 1)) invalid("top_p", "`top_p` must be > 0.0 and <= 1.0, got " + num(p));
    out.top_p = static_cast<float>(p);
    warpers |= p < 1;
  }
  if (in.typical_p) {
    const double p = *in.typical_p;
    if (!(p > 0 && p <= 1))
      invalid("typical_p", "`typical_p` must be > 0.0 and <= 1.0, got " + num(p));
    out.typical_p = static_cast<float>(p);
    warpers |= p < 1;
  }
  if (in.repetition_penalty) {
    const double r = *in.repetition_penalty;
    if (!(r > 0) || !std::isfinite(r))
      invalid("repetition_penalty",
              "`repetition_penalty` must be strictly positive, got " + num(r));
    out.repetition_penalty = static_cast<float>(r);
  }
  if (in.frequency_penalty) {
    const double f = *in.frequency_penalty;
    if (!(f >= -2 && f <= 2))
      invalid("frequency_penalty", "`frequency_penalty` must be in [-2.0, 2.0], got " + num(f));
    out.frequency_penalty = static_cast<float>(f);
  }
  if (in.presence_penalty) {
    const double f = *in.presence_penalty;
    if (!(f >= -2 && f <= 2))
      invalid("presence_penalty", "`presence_penalty` must be in [-2.0, 2.0], got " + num(f));
    out.presence_penalty = static_cast<float>(f);
  }
  // Temperature 0 is greedy whatever else is set (LoRAX and OpenAI clients send it so).
  const bool greedy = in.temperature && *in.temperature == 0;
  out.do_sample = !greedy && (in.do_sample || warpers);
}

GenerateParams parse_generate_request(const json& body, bool stream, const RequestLimits& limits) {
  GenerateParams g;
  auto inputs = body.find("inputs");
  if (inputs == body.end() || inputs->is_null()) invalid("inputs", "`inputs` is required");
  if (!inputs->is_string())
    invalid("inputs", std::string("`inputs` must be a string, got ") + inputs->type_name());
  g.inputs = inputs->get<std::string>();
  if (g.inputs.empty()) invalid("inputs", "`inputs` cannot be empty");
  g.stream = opt_bool(body, "stream").value_or(stream);

  static const json kEmpty = json::object();
  const json* pp = &kEmpty;
  if (auto it = body.find("parameters"); it != body.end() && !it->is_null()) {
    if (!it->is_object())
      invalid("parameters", std::string("`parameters` must be an object, got ") + it->type_name());
    pp = &*it;
  }
  const json& p = *pp;
  refuse_unsupported(p);
  g.adapter = parse_adapter(p);
  if (const json& m = member_or_null(p, "merged_adapters"); !m.is_null()) {
    if (g.adapter) invalid("merged_adapters", "give `adapter_id` or `merged_adapters`, not both");
    g.merged = parse_merged_adapters(m);
    if (auto src = opt_string(p, "adapter_source")) g.merged_source = parse_adapter_source(*src);
  }
  const json& rf = member_or_null(p, "response_format");
  const json& gr = member_or_null(p, "grammar");
  if (!rf.is_null() && !gr.is_null())
    invalid("grammar", "give `response_format` or `grammar`, not both");
  g.constraint = rf.is_null() ? parse_tgi_grammar(gr) : parse_lorax_response_format(rf);

  SamplingInput s;
  s.do_sample = opt_bool(p, "do_sample").value_or(false);
  s.temperature = opt_number(p, "temperature");
  s.top_p = opt_number(p, "top_p");
  s.typical_p = opt_number(p, "typical_p");
  s.repetition_penalty = opt_number(p, "repetition_penalty");
  s.frequency_penalty = opt_number(p, "frequency_penalty");
  s.presence_penalty = opt_number(p, "presence_penalty");
  if (auto k = opt_int(p, "top_k")) s.top_k = static_cast<double>(*k);
  SamplingParams& sp = g.sampling;
  apply_sampling(s, sp);

  if (auto n = opt_int(p, "max_new_tokens")) {
    if (*n < 1)
      invalid("max_new_tokens",
              "`max_new_tokens` must be strictly positive, got " + std::to_string(*n));
    if (*n > limits.max_total_tokens)
      invalid("max_new_tokens",
              "`max_new_tokens` must be <= " + std::to_string(limits.max_total_tokens) +
                  " (max_total_tokens), got " + std::to_string(*n));
    sp.max_new_tokens = *n;
    g.max_new_tokens_given = true;
  } else {
    sp.max_new_tokens = limits.default_max_new_tokens;
  }
  if (auto seed = opt_int(p, "seed")) {
    if (*seed < 0) invalid("seed", "`seed` must be >= 0, got " + std::to_string(*seed));
    sp.seed = static_cast<uint64_t>(*seed);
    if (g.merged) g.merged->seed = *sp.seed;
  }
  sp.stop = opt_string_list(p, "stop");
  if (static_cast<int64_t>(sp.stop.size()) > limits.max_stop_sequences)
    invalid("stop", "`stop` supports up to " + std::to_string(limits.max_stop_sequences) +
                        " stop sequences. Given: " + std::to_string(sp.stop.size()));
  for (const std::string& st : sp.stop)
    if (st.empty()) invalid("stop", "`stop` sequences cannot be empty");
  sp.ignore_eos = opt_bool(p, "ignore_eos_token").value_or(false);
  g.details = opt_bool(p, "details").value_or(false);
  g.decoder_input_details = opt_bool(p, "decoder_input_details").value_or(false);
  g.return_full_text = opt_bool(p, "return_full_text").value_or(false);
  sp.prompt_logprobs = g.decoder_input_details;

  if (auto t = opt_int(p, "truncate")) {
    if (*t < 1 || *t > limits.max_input_length)
      invalid("truncate", "`truncate` must be strictly positive and <= " +
                              std::to_string(limits.max_input_length) +
                              " (max_input_length), got " + std::to_string(*t));
    g.truncate = *t;
  }
  for (const char* field : {"return_k_alternatives", "top_n_tokens"}) {
    if (auto k = opt_int(p, field)) {
      if (*k < 0 || *k > limits.max_top_n_tokens)
        invalid(field, std::string("`") + field + "` must be in [0, " +
                           std::to_string(limits.max_top_n_tokens) + "], got " +
                           std::to_string(*k));
      sp.top_n_tokens = static_cast<int32_t>(*k);
    }
  }
  if (auto b = opt_int(p, "best_of")) {
    if (*b < 1 || *b > limits.max_best_of)
      invalid("best_of", "`best_of` must be in [1, " + std::to_string(limits.max_best_of) +
                             "], got " + std::to_string(*b));
    if (*b > 1) {
      if (!sp.do_sample) invalid("best_of", "you must use sampling when `best_of` is > 1");
      if (sp.seed) invalid("seed", "`seed` must not be set when `best_of` is > 1");
      if (g.stream) invalid("best_of", "`best_of` != 1 is not supported when `stream` == true");
    }
    sp.best_of = static_cast<int32_t>(*b);
  }
  return g;
}

void fit_to_limits(std::vector<int32_t>& ids, std::optional<int64_t> truncate,
                   bool max_new_tokens_given, SamplingParams& params, const RequestLimits& limits) {
  if (truncate && static_cast<int64_t>(ids.size()) > *truncate)
    ids.erase(ids.begin(), ids.end() - *truncate);
  const auto n = static_cast<int64_t>(ids.size());
  if (n == 0) invalid("inputs", "`inputs` tokenizes to no tokens");
  if (n > limits.max_input_length)
    invalid("inputs", "`inputs` must have less than " + std::to_string(limits.max_input_length) +
                          " tokens. Given: " + std::to_string(n));
  const int64_t budget = limits.max_total_tokens - n;
  if (!max_new_tokens_given)
    params.max_new_tokens = std::max<int64_t>(1, std::min(params.max_new_tokens, budget));
  if (n + params.max_new_tokens > limits.max_total_tokens)
    invalid("max_new_tokens", "`inputs` tokens + `max_new_tokens` must be <= " +
                                  std::to_string(limits.max_total_tokens) +
                                  ". Given: " + std::to_string(n) + " `inputs` tokens and " +
                                  std::to_string(params.max_new_tokens) + " `max_new_tokens`");
}

}  // namespace kestrel::server
