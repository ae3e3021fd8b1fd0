// --adapters ADAPTERS.json of `kestrel logits` and `kestrel generate` (docs/lora.md).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/falcon_model.h"

namespace kestrel::cli {

// A JSON list, one entry per prompt: an adapter folder (loaded once per distinct path) or null
// (the base model). Throws naming the file unless it has exactly n_prompts entries.
std::vector<std::shared_ptr<const LoraAdapter>> load_adapters(const FalconModel& model,
                                                              const std::string& path,
                                                              size_t n_prompts);

}  // namespace kestrel::cli
