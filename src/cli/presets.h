// The published Falcon shapes that `random-model` writes and `bench` builds in
// memory: one table, so that a preset means the same model in both.
#pragma once

#include <string>

#include "io/falcon_config.h"

namespace kestrel::cli {

// falcon-7b, falcon-40b, falcon-180b, falcon2-11b, falcon-rw-1b or tiny (2 layers,
// hidden 64, 4 heads, vocab 1024); anything else is a kestrel::Error naming them.
FalconConfig falcon_preset(const std::string& name);
// The preset as a model is built from it: read back through FalconConfig::from_json, which
// derives what config.json leaves implicit (bench and serve --preset).
FalconConfig falcon_preset_config(const std::string& name);

}  // namespace kestrel::cli
