// Sampler: one token from one logits row, with TGI's processing order
// (repetition, frequency and presence penalties, then temperature, top_k,
// top_p, typical_p) and a per-request RNG, so a seed reproduces the same text
// whatever else is batched.
#pragma once

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "engine/request.h"
#include "engine/sampling_params.h"

namespace kestrel {

struct SampledToken {
  int32_t id = 0;
  float logprob = 0.0f;  // log-softmax of the processed logits (before the top-k/p masks)
  std::vector<std::pair<int32_t, float>> alternatives;  // top_n_tokens best (id, logprob)
};

// Applies the penalties in place. counts: occurrences of each token so far
// (prompt and generated; repetition penalty uses presence, frequency and
// presence penalties the generated counts).
void apply_penalties(const SamplingParams& p, const std::unordered_map<int32_t, int32_t>& seen,
                     const std::unordered_map<int32_t, int32_t>& generated, float* logits,
                     int64_t vocab);

// The masks of top_k, top_p and typical_p over probabilities `probs` (softmax
// of the temperature-scaled logits): keep[i] is false for filtered tokens.
// Exposed for tests: they are compared with a plain reference implementation.
std::vector<bool> sampling_mask(const SamplingParams& p, const std::vector<float>& probs);

SampledToken sample_token(const SamplingParams& p, const float* logits, int64_t vocab,
                          std::mt19937_64& rng);

}  // namespace kestrel
