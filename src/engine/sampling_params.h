// SamplingParams: how one request chooses its tokens, with TGI / LoRAX
// semantics, and their validation (a ValidationError names the field and the
// allowed range; the server turns it into a 422).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace kestrel {

struct SamplingParams {
  bool do_sample = false;           // false: greedy (argmax), whatever the other knobs say
  float temperature = 1.0f;         // > 0 (the server maps temperature 0 to greedy)
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // (0, 1]; 1: off
  float typical_p = 1.0f;           // (0, 1]; 1: off
  float repetition_penalty = 1.0f;  // > 0; 1: off (divides positive, multiplies negative logits)
  float frequency_penalty = 0.0f;   // [-2, 2], OpenAI semantics
  float presence_penalty = 0.0f;    // [-2, 2]
  std::optional<uint64_t> seed;     // reproducible per request whatever the batch
  int64_t max_new_tokens = 20;      // >= 1
  std::vector<std::string> stop;    // stop sequences, matched on text, not in the output
  bool ignore_eos = false;
  int32_t best_of = 1;           // n candidates, the best by cumulative logprob is returned
  int32_t top_n_tokens = 0;      // alternatives per token (return_k_alternatives)
  bool prompt_logprobs = false;  // logprob of every prompt token (decoder_input_details)
};

// Throws ValidationError for the first out-of-range field.
void validate(const SamplingParams& params);

}  // namespace kestrel
