// Merging LoRA adapters into one, as LoRAX's `merged_adapters` asks ({"ids", "weights",
// "merge_strategy", "density", "majority_sign_method"}), with the math of peft's
// `PeftModel.add_weighted_adapter` (peft 0.21, tuners/lora/model.py and utils/merge_utils.py) for
// combination types linear, ties, dare_linear, dare_ties and cat. On the host, in F32, independent
// of the model and the device: the caller reads the adapters' A and B onto the host, merges, and
// uploads the result.
//
// What peft does, and so what this does:
// - One adapter: always `linear` (density and the sign method are ignored).
// - linear, ties, dare_linear, dare_ties need every adapter's rank equal (peft's rank of an
//   adapter: r, or the largest of r and its rank_pattern values); cat takes any ranks and the
//   merged rank is their sum.
// - The merged adapter is the first adapter's config with r = lora_alpha = the merged rank,
//   target_modules the union of the adapters' target modules, no rank/alpha patterns: its scale
//   is 1 for every module, or sqrt(rank) when the FIRST adapter has use_rslora (alpha / sqrt(r)).
//   It keeps the first adapter's layers_to_transform: another adapter's modules on layers outside
//   it are dropped. A module the merged adapter targets that no adapter has (e.g. a module of the
//   union on a layer only the first adapter covers) makes peft fail (IndexError / "No matching
//   LoRAs found"); here it is a ValidationError naming the layer and module.
// - Per module, only the adapters that have it take part, with their weights. For linear / ties /
//   dare_*, weight w and the adapter's scale s of that module give sqrt(|w s|) * sign(w s) for A
//   and sqrt(|w s|) for B (in double, then rounded to F32), and peft's task-arithmetic function
//   runs over the A's and, separately, over the B's:
//     linear       sum_i w_i T_i
//     ties         each T_i pruned to its top int(density * numel) entries by magnitude; the
//                  majority sign per entry elected over the pruned, unweighted T_i (total: sign of
//                  their sum, frequency: sign of the sum of their signs; 0 counts as +); the
//                  entries of that sign (zeros never) averaged, weighted: sum_i w_i T_i m_i /
//                  max(1, sum_i m_i)
//     dare_linear  each entry of each T_i kept with probability density and divided by density,
//                  then as linear
//     dare_ties    that random pruning, then ties' election and disjoint merge
//   density >= 1 prunes nothing (no rescale). cat: A = rows of w_i s_i A_i, B = columns of B_i,
//   stacked in adapter order at the top of a [sum r, in] / [out, sum r] zero tensor.
// - DARE's mask cannot be torch's (torch.bernoulli's generator); it is drawn from a seeded
//   stream, so a merge repeats: per (layer, module) a std::mt19937_64 seeded with
//   merge_module_seed(seed, layer, module); an entry is kept when (next() >> 11) * 2^-53 < density;
//   the A's of the adapters that have the module in order, then their B's, each row-major.
//   tests/data/make_merge_references.py runs peft with this stream in place of torch.bernoulli.
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "lora/lora_adapter.h"

namespace kestrel {

enum class MergeStrategy : uint8_t { kLinear, kTies, kDareLinear, kDareTies, kCat };
enum class MajoritySignMethod : uint8_t { kTotal, kFrequency };

// "linear", "ties", "dare_linear", "dare_ties", "cat".
const char* merge_strategy_name(MergeStrategy s);
// "total", "frequency".
const char* majority_sign_method_name(MajoritySignMethod m);
// Throw ValidationError naming merged_adapters.merge_strategy / .majority_sign_method and the
// accepted values for anything else.
MergeStrategy parse_merge_strategy(std::string_view name);
MajoritySignMethod parse_majority_sign_method(std::string_view name);

// A request's merged_adapters.
struct MergeSpec {
  std::vector<std::string> ids;
  std::vector<double> weights;  // one per id
  MergeStrategy strategy = MergeStrategy::kLinear;
  double density = 1.0;  // ties / dare_*: the fraction of entries kept
  MajoritySignMethod majority_sign_method = MajoritySignMethod::kTotal;
  uint64_t seed = 0;  // dare_*: the stream of the random pruning

  // ValidationError naming the field: merged_adapters.ids (none), merged_adapters.weights (not one
  // per id, or not finite), merged_adapters.density (outside [0, 1], or 0 for dare_*: peft
  // divides by it and yields NaN).
  void validate() const;
  // What runs: linear for a single adapter (as peft), else `strategy`.
  MergeStrategy effective_strategy() const;
  // ranks[i]: peft_merge_rank of adapter i. For every strategy but cat they must be equal: a
  // ValidationError on merged_adapters.ids naming the two adapters, their ranks and why.
  void validate_ranks(std::span<const int64_t> ranks) const;
};

// peft's rank of an adapter for add_weighted_adapter: r, or max(r, rank_pattern values).
int64_t peft_merge_rank(const LoraConfig& config);

// One module's factors on the host: a F32 [r, in], b F32 [out, r], the adapter's scale for it.
struct LoraFactors {
  Tensor a, b;
  double scale = 0.0;
  bool defined() const { return a.defined(); }
};

// An adapter on the host: its config and layers[layer][module] (undefined where not targeted).
struct HostLoraAdapter {
  LoraConfig config;
  std::vector<std::array<LoraFactors, kLoraModules>> layers;
};

// The merged adapter: every defined module has scale `scale` and rank `rank`.
struct MergedLora {
  MergeStrategy strategy = MergeStrategy::kLinear;  // what ran
  int64_t rank = 0;
  double scale = 1.0;
  bool use_rslora = false;                   // the first adapter's
  std::vector<LoraModule> target_modules;    // the union, in LoraModule order
  std::vector<int64_t> layers_to_transform;  // the first adapter's (empty: all)
  std::vector<std::array<LoraFactors, kLoraModules>> layers;
};

// Merges adapters[i] (the adapter of spec.ids[i]; all with the same number of layers) as peft
// does (above). Validates the spec and the ranks first; throws ValidationError for a module the
// merged adapter targets that no adapter has, or (not cat) two adapters whose A of one module
// differ in rank.
MergedLora merge_adapters(const MergeSpec& spec, std::span<const HostLoraAdapter* const> adapters);

// The seed of the DARE stream of one module.
uint64_t merge_module_seed(uint64_t seed, int64_t layer, LoraModule m);

// peft's merge_utils on flat F32 tensors (tests use them directly).
namespace merge_ops {
// Keeps the int(density * size) entries of largest magnitude (ties: the lower index), zeroes the
// rest; density >= 1 keeps all.
void magnitude_prune(std::span<float> t, double density);
// Keeps each entry with probability density (one draw per entry, in order) and, with rescale,
// divides the kept by density; density >= 1 keeps all, unscaled.
void random_prune(std::span<float> t, double density, bool rescale, std::mt19937_64& rng);
// prune (per strategy) each task, then combine with the F32 weights, as peft's task_arithmetic,
// ties, dare_linear and dare_ties. rng: only for dare_*. Not for cat.
std::vector<float> combine(MergeStrategy strategy, std::vector<std::vector<float>> tasks,
                           std::span<const float> weights, double density,
                           MajoritySignMethod method, std::mt19937_64* rng);
}  // namespace merge_ops

}  // namespace kestrel
