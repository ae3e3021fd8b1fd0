// The tensors of a Falcon checkpoint, by name and shape, as FalconConfig
// implies them. The loader checks a folder against this list; random-model
// writes exactly this list.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/falcon_config.h"

namespace kestrel {

struct WeightSpec {
  std::string name;
  Shape shape;
};

// Every tensor the config implies, in checkpoint order. `with_lm_head` adds
// lm_head.weight (untied models).
std::vector<WeightSpec> falcon_weight_specs(const FalconConfig& config, bool with_lm_head);

// Names used by the model, for layer l.
std::string layer_prefix(int64_t l);  // "transformer.h.L."

class WeightStore;

// The F32 scales of a pre-quantized FP8 linear `weight_name` (F8_E4M3) of `store`, on the host:
// [1] (per tensor) or [out] (per output channel), from `<linear>.weight_scale`. Throws
// kestrel::Error naming the tensor for E5M2 weights, block-wise scales (`weight_scale_inv`), a
// missing scale, a scale of the wrong shape or dtype, and a scale that is not finite and positive.
Tensor fp8_weight_scales(const WeightStore& store, const std::string& weight_name);

}  // namespace kestrel
