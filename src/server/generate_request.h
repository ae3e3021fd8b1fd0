// The LoRAX / TGI request ({inputs, parameters{...}, stream}) parsed and
// validated into the engine's SamplingParams, with TGI's messages (a
// ValidationError names the field and the allowed range: the route's 422).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampling_params.h"
#include "grammar/constraint.h"
#include "lora/adapter_store.h"
#include "lora/merge.h"
#include "server/json_util.h"

namespace kestrel::server {

// What the server accepts per request (from the engine's options and the CLI).
struct RequestLimits {
  int64_t max_input_length = 1024;  // prompt tokens
  int64_t max_total_tokens = 2048;  // prompt + new tokens
  int64_t default_max_new_tokens = 20;
  int32_t max_best_of = 4;
  int32_t max_stop_sequences = 4;
  int32_t max_top_n_tokens = 10;
};

// The LoRA adapter a request names (LoRAX's adapter_id / adapter_source, or OpenAI's `model`).
struct AdapterRef {
  std::string id;
  AdapterSource source = AdapterSource::kLocal;
};

struct GenerateParams {
  std::string inputs;
  SamplingParams sampling;
  bool max_new_tokens_given = false;  // else limits.default_max_new_tokens, capped by the budget
  bool stream = false;
  bool details = false;
  bool decoder_input_details = false;
  bool return_full_text = false;
  std::optional<int64_t> truncate;    // keep the last N prompt tokens
  std::optional<AdapterRef> adapter;  // adapter_id (null or "": the base model)
  // merged_adapters (never with adapter_id); its ids under `merged_source` (adapter_source), its
  // seed parameters.seed (absent: 0).
  std::optional<MergeSpec> merged;
  AdapterSource merged_source = AdapterSource::kLocal;
  std::optional<grammar::Spec> constraint;  // response_format or grammar (structured output)
};

// Parses `body` (an object). `stream` is the route's default (/generate_stream
// true, /generate false; POST / reads the body's "stream").
GenerateParams parse_generate_request(const json& body, bool stream, const RequestLimits& limits);

// The sampling knobs shared by every dialect, TGI's semantics: sampling when
// do_sample or any warper is set; temperature 0 means greedy; negative is a 422.
struct SamplingInput {
  bool do_sample = false;
  std::optional<double> temperature, top_p, top_k, typical_p, repetition_penalty;
  std::optional<double> frequency_penalty, presence_penalty;
};
void apply_sampling(const SamplingInput& in, SamplingParams& out);

// Checks the tokenized prompt against the limits and settles max_new_tokens:
// truncates `ids` to the last `truncate` tokens, throws ValidationError for a
// prompt beyond max_input_length or a total beyond max_total_tokens.
void fit_to_limits(std::vector<int32_t>& ids, std::optional<int64_t> truncate,
                   bool max_new_tokens_given, SamplingParams& params, const RequestLimits& limits);

}  // namespace kestrel::server
