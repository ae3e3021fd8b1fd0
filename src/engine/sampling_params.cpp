// Validation of SamplingParams (ranges as TGI / LoRAX state them).
#include "engine/sampling_params.h"

#include <cmath>
#include <sstream>

#include "engine/request.h"

namespace kestrel {
namespace {

template <typename T>
void require(bool ok, const char* field, const char* range, T value) {
  if (ok) return;
  std::ostringstream s;
  s << "`" << field << "` must be " << range << ", got " << value;
  throw ValidationError(field, s.str());
}

}  // namespace

void validate(const SamplingParams& p) {
  require(std::isfinite(p.temperature) && p.temperature > 0, "temperature", "strictly positive",
          p.temperature);
  require(p.top_k >= 0, "top_k", ">= 0", p.top_k);
  require(std::isfinite(p.top_p) && p.top_p > 0 && p.top_p <= 1, "top_p", "in (0, 1]", p.top_p);
  require(std::isfinite(p.typical_p) && p.typical_p > 0 && p.typical_p <= 1, "typical_p",
          "in (0, 1]", p.typical_p);
  require(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0, "repetition_penalty",
          "strictly positive", p.repetition_penalty);
  require(std::isfinite(p.frequency_penalty) && std::abs(p.frequency_penalty) <= 2,
          "frequency_penalty", "in [-2, 2]", p.frequency_penalty);
  require(std::isfinite(p.presence_penalty) && std::abs(p.presence_penalty) <= 2,
          "presence_penalty", "in [-2, 2]", p.presence_penalty);
  require(p.max_new_tokens >= 1, "max_new_tokens", ">= 1", p.max_new_tokens);
  require(p.best_of >= 1 && p.best_of <= 16, "best_of", "in [1, 16]", p.best_of);
  require(p.best_of == 1 || p.do_sample, "best_of", "1 unless do_sample is true", p.best_of);
  require(p.top_n_tokens >= 0 && p.top_n_tokens <= 20, "top_n_tokens", "in [0, 20]",
          p.top_n_tokens);
  require(p.stop.size() <= 8, "stop", "at most 8 sequences", p.stop.size());
  for (const std::string& s : p.stop) require(!s.empty(), "stop", "non-empty strings", "\"\"");
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEosToken:
      return "eos_token";
    case FinishReason::kStopSequence:
      return "stop_sequence";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "length";
}

}  // namespace kestrel
