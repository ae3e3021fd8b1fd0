// Sampler: one token from one logits row, with TGI's processing order
// (repetition, frequency and presence penalties, then temperature, top_k,
// top_p, typical_p) and a per-request RNG, so a seed reproduces the same text
// whatever else is batched.
#pragma once

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "backend/ops.h"
#include "core/tensor.h"
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

// The masks of top_k, then top_p, then typical_p, each over the survivors of
// the previous one renormalised (transformers / TGI), over probabilities `probs` (softmax
// of the temperature-scaled logits): keep[i] is false for filtered tokens.
// Exposed for tests: they are compared with a plain reference implementation.
std::vector<bool> sampling_mask(const SamplingParams& p, const std::vector<float>& probs);

SampledToken sample_token(const SamplingParams& p, const float* logits, int64_t vocab,
                          std::mt19937_64& rng);

// One row of a step's logits to sample, with the request's state.
struct SampleRow {
  const SamplingParams* params = nullptr;
  const std::unordered_map<int32_t, int32_t>* seen = nullptr;       // prompt + generated counts
  const std::unordered_map<int32_t, int32_t>* generated = nullptr;  // generated counts
  std::mt19937_64* rng = nullptr;
};

// The device sampler's row for these parameters (ops::sample_on_device),
// drawing the request's one uniform for the token when it samples.
ops::SampleSpec device_spec(const SamplingParams& p,
                            const std::unordered_map<int32_t, int32_t>& seen,
                            const std::unordered_map<int32_t, int32_t>& generated,
                            std::mt19937_64& rng);

// Whether a row takes the plain greedy kernel (ops::greedy_rows): greedy, no
// penalty, no alternatives.
bool device_samplable(const SamplingParams& p);

// Samples row r of logits [rows.size(), vocab] F32 for rows[r], on any device.
// On a GPU every row is sampled there (device_samplable rows by
// ops::greedy_rows, the rest by ops::sample_on_device) and only ids, logprobs
// and alternatives cross to the host; on the CPU apply_penalties +
// sample_token. Either way a seeded request draws the same tokens whatever
// else is batched.
std::vector<SampledToken> sample_rows(const Tensor& logits, const std::vector<SampleRow>& rows);

}  // namespace kestrel
