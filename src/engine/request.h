// What goes into the engine (GenerationRequest) and what comes out: a stream
// of tokens and a final GenerationResult.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampling_params.h"
#include "grammar/constraint.h"

namespace kestrel {

class LoraAdapter;

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  // LoRA (docs/lora.md): the adapter this request runs under (made by the engine's model's
  // load_adapter / random_adapter), or null for the base model.
  std::shared_ptr<const LoraAdapter> adapter;
  // Structured output (docs/structured-output.md): what the generated text must match. The
  // request waits for its compile (never the batch), and ends when the grammar is complete.
  std::optional<grammar::Spec> constraint;
};

enum class FinishReason : uint8_t { kLength, kEosToken, kStopSequence, kCancelled };
// "length", "eos_token", "stop_sequence", "cancelled" (TGI / LoRAX spelling).
const char* finish_reason_name(FinishReason reason);

struct TokenAlternative {
  int32_t id = 0;
  std::string text;
  float logprob = 0.0f;
};

struct TokenInfo {
  int32_t id = 0;
  std::string text;      // this token's piece of the detokenized text (may be empty mid-UTF-8)
  float logprob = 0.0f;  // NaN where not computed (the first prompt token)
  bool special = false;
  std::vector<TokenAlternative> alternatives;  // top_n_tokens best, most likely first
};

struct Sequence;  // engine-internal

struct GenerationResult {
  std::vector<int32_t> token_ids;  // generated only (stop sequence removed from text, not ids)
  std::string text;                // generated text, stop sequence excluded
  std::vector<TokenInfo> tokens;   // one per generated token
  std::vector<TokenInfo> prompt_tokens;  // with prompt_logprobs
  FinishReason finish_reason = FinishReason::kLength;
  int64_t prompt_length = 0;
  uint64_t seed = 0;  // the seed used (drawn when the request gave none)
  // best_of > 1: the other candidates, best first (the result itself is the best).
  std::vector<GenerationResult> best_of_sequences;
  double queue_seconds = 0;      // submit -> first scheduled
  double inference_seconds = 0;  // first scheduled -> finished
};

// One event of a request's stream. kToken carries the new token; kFinished the
// result (after the last token); kError a message and its kind (the request is over:
// kUnavailable when the engine stopped under it, kInternal when a step failed).
struct EngineEvent {
  enum class Kind : uint8_t { kToken, kFinished, kError } kind = Kind::kToken;
  TokenInfo token;
  std::shared_ptr<const GenerationResult> result;
  std::string error;
  ErrorKind error_kind = ErrorKind::kInternal;
};

}  // namespace kestrel
