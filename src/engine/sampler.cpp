// Token sampling with TGI / transformers semantics.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/ops.h"
#include "core/error.h"

namespace kestrel {
namespace {

std::vector<float> softmax(const std::vector<float>& x) {
  const float m = *std::max_element(x.begin(), x.end());
  std::vector<float> p(x.size());
  double sum = 0.0;
  for (size_t i = 0; i < x.size(); ++i) sum += p[i] = std::exp(x[i] - m);
  for (float& v : p) v = static_cast<float>(v / sum);
  return p;
}

}  // namespace

void apply_penalties(const SamplingParams& p, const std::unordered_map<int32_t, int32_t>& seen,
                     const std::unordered_map<int32_t, int32_t>& generated, float* logits,
                     int64_t vocab) {
  if (p.repetition_penalty != 1.0f) {
    for (const auto& [id, n] : seen) {
      if (id < 0 || id >= vocab) continue;
      float& l = logits[id];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    for (const auto& [id, n] : generated) {
      if (id < 0 || id >= vocab) continue;
      logits[id] -= p.frequency_penalty * static_cast<float>(n) + p.presence_penalty;
    }
  }
}

std::vector<bool> sampling_mask(const SamplingParams& p, const std::vector<float>& probs) {
  const size_t n = probs.size();
  std::vector<bool> keep(n, true);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Most likely first; ties by id, so the mask is deterministic.
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    for (size_t r = p.top_k; r < n; ++r) keep[order[r]] = false;
  }
  if (p.top_p < 1.0f) {
    // transformers' TopP: drop the tokens whose cumulative probability from the
    // least likely up is <= 1 - top_p; the most likely always stays.
    double kept_mass = 0.0;
    for (size_t r = 0; r < n; ++r) {
      if (!keep[order[r]]) continue;
      if (r > 0 && kept_mass >= p.top_p) keep[order[r]] = false;
      kept_mass += probs[order[r]];
    }
  }
  if (p.typical_p < 1.0f) {
    // transformers' Typical: rank by |-log p - entropy|, keep the smallest set
    // with mass >= typical_p (at least one token).
    double entropy = 0.0;
    for (size_t i = 0; i < n; ++i) {
      if (probs[i] > 0) entropy -= probs[i] * std::log(static_cast<double>(probs[i]));
    }
    std::vector<int32_t> by_dev(order);
    auto dev = [&](int32_t i) {
      return probs[i] > 0 ? std::abs(-std::log(static_cast<double>(probs[i])) - entropy) : INFINITY;
    };
    std::stable_sort(by_dev.begin(), by_dev.end(),
                     [&](int32_t a, int32_t b) { return dev(a) < dev(b); });
    double mass = 0.0;
    bool done = false;
    for (int32_t i : by_dev) {
      if (done) keep[i] = false;
      mass += probs[i];
      if (mass >= p.typical_p) done = true;
    }
  }
  return keep;
}

SampledToken sample_token(const SamplingParams& p, const float* logits, int64_t vocab,
                          std::mt19937_64& rng) {
  std::vector<float> x(logits, logits + vocab);
  if (p.do_sample && p.temperature != 1.0f) {
    for (float& v : x) v /= p.temperature;
  }
  const std::vector<float> probs = softmax(x);
  SampledToken out;
  if (!p.do_sample) {
    out.id = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  } else {
    const std::vector<bool> keep = sampling_mask(p, probs);
    double total = 0.0;
    for (int64_t i = 0; i < vocab; ++i) total += keep[i] ? probs[i] : 0.0;
    // One uniform draw per token from the request's own generator.
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng) * total;
    double acc = 0.0;
    out.id = -1;
    for (int64_t i = 0; i < vocab; ++i) {
      if (!keep[i]) continue;
      acc += probs[i];
      out.id = static_cast<int32_t>(i);
      if (acc > u) break;
    }
    // top-k / top-p and typical each keep a token, but their sets can be
    // disjoint: then the most likely token, as the CUDA sampler picks.
    if (out.id < 0)
      out.id = static_cast<int32_t>(std::max_element(probs.begin(), probs.end()) - probs.begin());
  }
  out.logprob = std::log(std::max(probs[out.id], 1e-38f));
  if (p.top_n_tokens > 0) {
    std::vector<int32_t> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    const int64_t k = std::min<int64_t>(p.top_n_tokens, vocab);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
    for (int64_t r = 0; r < k; ++r) {
      out.alternatives.emplace_back(idx[r], std::log(std::max(probs[idx[r]], 1e-38f)));
    }
  }
  return out;
}

ops::SampleSpec device_spec(const SamplingParams& p,
                            const std::unordered_map<int32_t, int32_t>& seen,
                            const std::unordered_map<int32_t, int32_t>& generated,
                            std::mt19937_64& rng) {
  ops::SampleSpec s;
  s.do_sample = p.do_sample;
  s.temperature = p.temperature;
  s.top_k = p.top_k;
  s.top_p = p.top_p;
  s.typical_p = p.typical_p;
  s.repetition_penalty = p.repetition_penalty;
  s.frequency_penalty = p.frequency_penalty;
  s.presence_penalty = p.presence_penalty;
  s.top_n = p.top_n_tokens;
  if (p.repetition_penalty != 1.0f) {
    for (const auto& [id, n] : seen) s.seen.push_back(id);
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    for (const auto& [id, n] : generated) s.generated.emplace_back(id, n);
  }
  // The one draw sample_token makes per sampled token, from the same generator.
  if (p.do_sample) s.u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  return s;
}

bool device_samplable(const SamplingParams& p) {
  return !p.do_sample && p.repetition_penalty == 1.0f && p.frequency_penalty == 0.0f &&
         p.presence_penalty == 0.0f && p.top_n_tokens == 0;
}

std::vector<SampledToken> sample_rows(const Tensor& logits, const std::vector<SampleRow>& rows) {
  KESTREL_CHECK(logits.dtype() == DType::kF32 && logits.ndim() == 2 &&
                    logits.dim(0) == static_cast<int64_t>(rows.size()),
                "sample_rows: logits ", shape_str(logits.shape()), " for ", rows.size(), " rows");
  const int64_t n = logits.dim(0), vocab = logits.dim(1);
  std::vector<SampledToken> out(rows.size());
  if (logits.device() == Device::kCpu) {
    std::vector<float> row(vocab);
    for (size_t r = 0; r < rows.size(); ++r) {
      const SampleRow& s = rows[r];
      std::copy_n(logits.data<float>() + r * vocab, vocab, row.begin());
      apply_penalties(*s.params, *s.seen, *s.generated, row.data(), vocab);
      out[r] = sample_token(*s.params, row.data(), vocab, *s.rng);
    }
    return out;
  }
  std::vector<bool> greedy(rows.size());
  bool any_greedy = false, any_other = false;
  for (size_t r = 0; r < rows.size(); ++r) {
    greedy[r] = device_samplable(*rows[r].params);
    any_greedy = any_greedy || greedy[r];
    any_other = any_other || !greedy[r];
  }
  if (any_greedy) {
    Tensor ids = Tensor::empty(DType::kI32, {n}, logits.device());
    Tensor lps = Tensor::empty(DType::kF32, {n}, logits.device());
    ops::greedy_rows(logits, ids, lps);
    const Tensor ids_h = ops::to_device(ids, Device::kCpu);
    const Tensor lps_h = ops::to_host_f32(lps);
    for (size_t r = 0; r < rows.size(); ++r) {
      if (!greedy[r]) continue;
      out[r].id = ids_h.data<int32_t>()[r];
      out[r].logprob = lps_h.data<float>()[r];
    }
  }
  if (any_other) {
    // The other rows through the device sampler, each with its own one draw.
    std::vector<ops::SampleSpec> specs(rows.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      if (!greedy[r])
        specs[r] = device_spec(*rows[r].params, *rows[r].seen, *rows[r].generated, *rows[r].rng);
    }
    const std::vector<ops::SampleResult> got = ops::sample_on_device(logits, specs);
    for (size_t r = 0; r < rows.size(); ++r) {
      if (greedy[r]) continue;
      out[r].id = got[r].id;
      out[r].logprob = got[r].logprob;
      out[r].alternatives = got[r].alternatives;
    }
  }
  return out;
}

}  // namespace kestrel
