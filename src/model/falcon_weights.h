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

}  // namespace kestrel
