// The merge of LoRA adapters (merge.h): peft's add_weighted_adapter on the host.
#include "lora/merge.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "core/error.h"

namespace kestrel {

namespace {

constexpr std::array<MergeStrategy, 5> kStrategies = {
    MergeStrategy::kLinear, MergeStrategy::kTies, MergeStrategy::kDareLinear,
    MergeStrategy::kDareTies, MergeStrategy::kCat};

bool is_dare(MergeStrategy s) {
  return s == MergeStrategy::kDareLinear || s == MergeStrategy::kDareTies;
}

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<float> to_vector(const Tensor& t) {
  KESTREL_CHECK(t.device() == Device::kCpu && t.dtype() == DType::kF32,
                "merge: LoRA factors must be host F32 tensors");
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

Tensor from_vector(const std::vector<float>& v, Shape shape) {
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  KESTREL_CHECK(static_cast<size_t>(t.numel()) == v.size(), "merge: ", v.size(),
                " values for shape ", shape_str(t.shape()));
  std::memcpy(t.raw(), v.data(), v.size() * sizeof(float));
  return t;
}

std::string module_where(int64_t layer, LoraModule m) {
  return "layer " + std::to_string(layer) + "'s " + lora_module_name(m);
}

// sign(x) as torch.sign: -1, 0, 1.
int sign_of(float x) {
  return (x > 0.0f) - (x < 0.0f);
}

}  // namespace

const char* merge_strategy_name(MergeStrategy s) {
  switch (s) {
    case MergeStrategy::kLinear:
      return "linear";
    case MergeStrategy::kTies:
      return "ties";
    case MergeStrategy::kDareLinear:
      return "dare_linear";
    case MergeStrategy::kDareTies:
      return "dare_ties";
    case MergeStrategy::kCat:
      return "cat";
  }
  return "?";
}

const char* majority_sign_method_name(MajoritySignMethod m) {
  return m == MajoritySignMethod::kTotal ? "total" : "frequency";
}

MergeStrategy parse_merge_strategy(std::string_view name) {
  for (MergeStrategy s : kStrategies)
    if (name == merge_strategy_name(s)) return s;
  throw ValidationError("merged_adapters.merge_strategy",
                        detail::concat("merged_adapters.merge_strategy \"", name,
                                       "\" is not one of linear, ties, dare_linear, dare_ties, "
                                       "cat"));
}

MajoritySignMethod parse_majority_sign_method(std::string_view name) {
  if (name == "total") return MajoritySignMethod::kTotal;
  if (name == "frequency") return MajoritySignMethod::kFrequency;
  throw ValidationError("merged_adapters.majority_sign_method",
                        detail::concat("merged_adapters.majority_sign_method \"", name,
                                       "\" is not one of total, frequency"));
}

void MergeSpec::validate() const {
  if (ids.empty())
    throw ValidationError("merged_adapters.ids",
                          "merged_adapters.ids must name at least one adapter");
  if (weights.size() != ids.size())
    throw ValidationError(
        "merged_adapters.weights",
        detail::concat("merged_adapters.weights has ", weights.size(), " values for ", ids.size(),
                       " merged_adapters.ids: one weight per adapter"));
  for (size_t i = 0; i < weights.size(); ++i)
    if (!std::isfinite(weights[i]))
      throw ValidationError("merged_adapters.weights",
                            detail::concat("merged_adapters.weights[", i, "] is not finite"));
  if (!(density >= 0.0 && density <= 1.0))
    throw ValidationError("merged_adapters.density",
                          detail::concat("merged_adapters.density ", density,
                                         " is outside [0, 1] (the fraction of entries kept)"));
  if (density == 0.0 && is_dare(effective_strategy()))
    throw ValidationError(
        "merged_adapters.density",
        detail::concat("merged_adapters.density 0 with merge_strategy ",
                       merge_strategy_name(strategy),
                       " keeps nothing and rescales by 1 / density (peft yields NaN): use a "
                       "density in (0, 1]"));
}

MergeStrategy MergeSpec::effective_strategy() const {
  return ids.size() == 1 ? MergeStrategy::kLinear : strategy;
}

void MergeSpec::validate_ranks(std::span<const int64_t> ranks) const {
  KESTREL_CHECK(ranks.size() == ids.size(), "validate_ranks: ", ranks.size(), " ranks for ",
                ids.size(), " ids");
  const MergeStrategy s = effective_strategy();
  if (s == MergeStrategy::kCat) return;
  for (size_t i = 1; i < ranks.size(); ++i)
    if (ranks[i] != ranks[0])
      throw ValidationError(
          "merged_adapters.ids",
          detail::concat("merged_adapters.ids: adapter \"", ids[0], "\" has rank ", ranks[0],
                         " and \"", ids[i], "\" rank ", ranks[i], "; merge_strategy ",
                         merge_strategy_name(s),
                         " adds the adapters' A and B factor by factor, so it needs equal ranks "
                         "(merge_strategy cat takes any)"));
}

int64_t peft_merge_rank(const LoraConfig& config) {
  int64_t r = config.r;
  for (const auto& [key, value] : config.rank_pattern) r = std::max(r, value);
  return r;
}

uint64_t merge_module_seed(uint64_t seed, int64_t layer, LoraModule m) {
  return splitmix64(splitmix64(seed) ^
                    static_cast<uint64_t>(layer * kLoraModules + static_cast<int>(m)));
}

namespace merge_ops {

void magnitude_prune(std::span<float> t, double density) {
  if (density >= 1.0) return;
  const auto n = static_cast<int64_t>(t.size());
  // peft: k = int(density * tensor.numel()), in double.
  const auto k = static_cast<int64_t>(density * static_cast<double>(n));
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto larger = [&](int64_t x, int64_t y) {
    const float ax = std::fabs(t[x]), ay = std::fabs(t[y]);
    return ax != ay ? ax > ay : x < y;
  };
  if (k < n) std::nth_element(order.begin(), order.begin() + k, order.end(), larger);
  for (int64_t i = k; i < n; ++i) t[order[i]] *= 0.0f;  // tensor * mask, as peft
}

void random_prune(std::span<float> t, double density, bool rescale, std::mt19937_64& rng) {
  if (density >= 1.0) return;
  const float d = static_cast<float>(density);
  for (float& x : t) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    x *= u < density ? 1.0f : 0.0f;
    if (rescale) x /= d;
  }
}

std::vector<float> combine(MergeStrategy strategy, std::vector<std::vector<float>> tasks,
                           std::span<const float> weights, double density,
                           MajoritySignMethod method, std::mt19937_64* rng) {
  KESTREL_CHECK(!tasks.empty() && tasks.size() == weights.size(), "merge: ", tasks.size(),
                " tasks, ", weights.size(), " weights");
  KESTREL_CHECK(strategy != MergeStrategy::kCat, "merge_ops::combine: cat is not elementwise");
  const size_t n = tasks[0].size();
  for (const auto& t : tasks) KESTREL_CHECK(t.size() == n, "merge: tasks of different sizes");
  // Sparsify.
  if (strategy == MergeStrategy::kTies) {
    for (auto& t : tasks) magnitude_prune(t, density);
  } else if (is_dare(strategy)) {
    KESTREL_CHECK(rng != nullptr, "merge: dare needs a random stream");
    for (auto& t : tasks) random_prune(t, density, /*rescale=*/true, *rng);
  }
  std::vector<float> out(n, 0.0f);
  if (strategy == MergeStrategy::kLinear || strategy == MergeStrategy::kDareLinear) {
    for (size_t e = 0; e < n; ++e) {
      float acc = tasks[0][e] * weights[0];
      for (size_t i = 1; i < tasks.size(); ++i) acc += tasks[i][e] * weights[i];
      out[e] = acc;
    }
    return out;
  }
  // ties / dare_ties: elect the sign over the unweighted pruned tasks, then the disjoint merge.
  for (size_t e = 0; e < n; ++e) {
    float magnitude = 0.0f;
    if (method == MajoritySignMethod::kTotal) {
      magnitude = tasks[0][e];
      for (size_t i = 1; i < tasks.size(); ++i) magnitude += tasks[i][e];
    } else {
      for (const auto& t : tasks) magnitude += static_cast<float>(sign_of(t[e]));
    }
    const int majority = magnitude >= 0.0f ? 1 : -1;
    float acc = 0.0f;
    float kept = 0.0f;
    for (size_t i = 0; i < tasks.size(); ++i) {
      const bool in = sign_of(tasks[i][e]) == majority;
      acc += (tasks[i][e] * weights[i]) * (in ? 1.0f : 0.0f);
      kept += in ? 1.0f : 0.0f;
    }
    out[e] = acc / std::max(kept, 1.0f);
  }
  return out;
}

}  // namespace merge_ops

MergedLora merge_adapters(const MergeSpec& spec, std::span<const HostLoraAdapter* const> adapters) {
  spec.validate();
  KESTREL_CHECK(adapters.size() == spec.ids.size(), "merge_adapters: ", adapters.size(),
                " adapters for ", spec.ids.size(), " ids");
  std::vector<int64_t> ranks;
  for (const HostLoraAdapter* a : adapters) {
    KESTREL_CHECK(a != nullptr, "merge_adapters: null adapter");
    ranks.push_back(peft_merge_rank(a->config));
  }
  spec.validate_ranks(ranks);
  const size_t n = adapters.size();
  const int64_t n_layers = static_cast<int64_t>(adapters[0]->layers.size());
  for (const HostLoraAdapter* a : adapters)
    KESTREL_CHECK(static_cast<int64_t>(a->layers.size()) == n_layers,
                  "merge_adapters: adapters of ", a->layers.size(), " and ", n_layers, " layers");

  MergedLora out;
  out.strategy = spec.effective_strategy();
  out.rank = out.strategy == MergeStrategy::kCat
                 ? std::accumulate(ranks.begin(), ranks.end(), int64_t{0})
                 : ranks[0];
  const LoraConfig& first = adapters[0]->config;
  out.use_rslora = first.use_rslora;
  // lora_alpha = r = the merged rank.
  out.scale = first.use_rslora ? static_cast<double>(out.rank) / std::sqrt(out.rank) : 1.0;
  out.layers_to_transform = first.layers_to_transform;
  for (int m = 0; m < kLoraModules; ++m) {
    const auto mod = static_cast<LoraModule>(m);
    for (const HostLoraAdapter* a : adapters) {
      const auto& t = a->config.target_modules;
      if (std::find(t.begin(), t.end(), mod) != t.end()) {
        out.target_modules.push_back(mod);
        break;
      }
    }
  }
  out.layers.resize(n_layers);

  for (int64_t layer = 0; layer < n_layers; ++layer) {
    const auto& ltt = out.layers_to_transform;
    if (!ltt.empty() && std::find(ltt.begin(), ltt.end(), layer) == ltt.end()) continue;
    for (LoraModule mod : out.target_modules) {
      const int m = static_cast<int>(mod);
      std::vector<size_t> valid;
      for (size_t i = 0; i < n; ++i)
        if (adapters[i]->layers[layer][m].defined()) valid.push_back(i);
      if (valid.empty())
        throw ValidationError(
            "merged_adapters.ids",
            detail::concat("merged_adapters.ids: the merged adapter targets ",
                           module_where(layer, mod),
                           " (the union of the adapters' target modules, on the layers of the "
                           "first adapter, \"",
                           spec.ids[0],
                           "\"), which none of the adapters has; peft's "
                           "add_weighted_adapter refuses this merge too"));
      const LoraFactors& f0 = adapters[valid[0]]->layers[layer][m];
      const int64_t in = f0.a.dim(1), out_dim = f0.b.dim(0);
      for (size_t i : valid) {
        const LoraFactors& f = adapters[i]->layers[layer][m];
        KESTREL_CHECK(f.a.ndim() == 2 && f.b.ndim() == 2 && f.a.dim(1) == in &&
                          f.b.dim(0) == out_dim && f.b.dim(1) == f.a.dim(0),
                      "merge_adapters: ", module_where(layer, mod), " of \"", spec.ids[i],
                      "\" has A ", shape_str(f.a.shape()), " and B ", shape_str(f.b.shape()),
                      ", unlike the others (another base model?)");
      }
      LoraFactors& dst = out.layers[layer][m];
      dst.scale = out.scale;

      if (out.strategy == MergeStrategy::kCat) {
        std::vector<float> a(static_cast<size_t>(out.rank * in), 0.0f);
        std::vector<float> b(static_cast<size_t>(out_dim * out.rank), 0.0f);
        int64_t row = 0;
        for (size_t i : valid) {
          const LoraFactors& f = adapters[i]->layers[layer][m];
          const float w = static_cast<float>(spec.weights[i]);
          const float s = static_cast<float>(f.scale);
          const int64_t r = f.a.dim(0);
          KESTREL_CHECK(row + r <= out.rank, "merge_adapters: cat ranks exceed ", out.rank);
          const float* pa = f.a.data<float>();
          const float* pb = f.b.data<float>();
          for (int64_t k = 0; k < r * in; ++k) a[row * in + k] = (pa[k] * w) * s;
          for (int64_t o = 0; o < out_dim; ++o)
            for (int64_t k = 0; k < r; ++k) b[o * out.rank + row + k] = pb[o * r + k];
          row += r;
        }
        dst.a = from_vector(a, {out.rank, in});
        dst.b = from_vector(b, {out_dim, out.rank});
        continue;
      }

      const int64_t r = f0.a.dim(0);
      for (size_t i : valid) {
        const int64_t ri = adapters[i]->layers[layer][m].a.dim(0);
        if (ri != r)
          throw ValidationError(
              "merged_adapters.ids",
              detail::concat("merged_adapters.ids: ", module_where(layer, mod), " has rank ", r,
                             " in \"", spec.ids[valid[0]], "\" and ", ri, " in \"", spec.ids[i],
                             "\" (rank_pattern); merge_strategy ",
                             merge_strategy_name(out.strategy),
                             " needs equal ranks (merge_strategy cat takes any)"));
      }
      std::vector<float> wa, wb;
      std::vector<std::vector<float>> as, bs;
      for (size_t i : valid) {
        const LoraFactors& f = adapters[i]->layers[layer][m];
        const double ws = spec.weights[i] * f.scale;
        const double root = std::sqrt(std::fabs(ws));
        // The sign on A only: on both it would cancel.
        wa.push_back(static_cast<float>(ws >= 0.0 ? root : -root));
        wb.push_back(static_cast<float>(root));
        as.push_back(to_vector(f.a));
        bs.push_back(to_vector(f.b));
      }
      std::mt19937_64 rng(merge_module_seed(spec.seed, layer, mod));
      const double density = spec.density;
      dst.a = from_vector(merge_ops::combine(out.strategy, std::move(as), wa, density,
                                             spec.majority_sign_method, &rng),
                          {r, in});
      dst.b = from_vector(merge_ops::combine(out.strategy, std::move(bs), wb, density,
                                             spec.majority_sign_method, &rng),
                          {out_dim, r});
    }
  }
  return out;
}

}  // namespace kestrel
