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
  // transformers' warpers in TGI's order (top_k, then top_p, then typical_p),
  // each over the survivors of the previous one, renormalised (the softmax of
  // the -inf-masked scores it sees). top_k and top_p keep a prefix of the
  // order most likely first (ties by id); typical a subset of that prefix.
  const size_t n = probs.size();
  std::vector<bool> keep(n, false);
  if (n == 0) return keep;
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  // top_k: drop what is below the k-th probability (ties with it stay).
  size_t m = n;
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    const float kth = probs[order[p.top_k - 1]];
    m = p.top_k;
    while (m < n && probs[order[m]] >= kth) ++m;
  }
  // top_p over the renormalised survivors: rank r stays iff r == 0 or the mass
  // before it is < top_p (cumulative from the least likely <= 1 - top_p goes).
  if (p.top_p < 1.0f) {
    double s = 0.0;
    for (size_t r = 0; r < m; ++r) s += probs[order[r]];
    double before = 0.0;
    size_t kept = 1;
    for (size_t r = 1; r < m; ++r) {
      before += probs[order[r - 1]];
      if (before / s >= p.top_p) break;
      kept = r + 1;
    }
    m = kept;
  }
  for (size_t r = 0; r < m; ++r) keep[order[r]] = true;
  if (p.typical_p < 1.0f) {
    // Typical over the m survivors q = p / s: rank by |-log q - H(q)|, find the
    // first rank whose cumulative q reaches typical_p, keep every survivor whose
    // deviation is <= that one's (ties stay, the first always).
    double s = 0.0;
    for (size_t r = 0; r < m; ++r) s += probs[order[r]];
    auto q = [&](int32_t i) { return static_cast<double>(probs[i]) / s; };
    double entropy = 0.0;
    for (size_t r = 0; r < m; ++r) {
      const double v = q(order[r]);
      if (v > 0) entropy -= v * std::log(v);
    }
    std::vector<int32_t> by_dev(order.begin(), order.begin() + m);
    std::vector<double> dev(n, INFINITY);
    for (int32_t i : by_dev) {
      if (q(i) > 0) dev[i] = std::abs(-std::log(q(i)) - entropy);
    }
    std::stable_sort(by_dev.begin(), by_dev.end(),
                     [&](int32_t a, int32_t b) { return dev[a] < dev[b]; });
    double mass = 0.0;
    for (size_t j = 0; j < by_dev.size(); ++j) {
      mass += q(by_dev[j]);
      if (mass < p.typical_p) continue;
      const double limit = dev[by_dev[j]];
      for (size_t t = j + 1; t < by_dev.size(); ++t) {
        if (dev[by_dev[t]] > limit) keep[by_dev[t]] = false;
      }
      break;
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
    // The warpers run in sequence, so the kept set is never empty.
    KESTREL_CHECK(out.id >= 0, "sample_token: no token survived the sampling masks");
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
