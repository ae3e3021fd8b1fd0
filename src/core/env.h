// The process environment, read in this one place: the variables users set (HF_HUB_CACHE,
// HF_HOME, HOME) and the KESTREL_* benchmark knobs of cuda::Tuning.
#pragma once

#include <optional>
#include <string>

namespace kestrel {

// The variable's value; nullopt when it is unset or empty.
std::optional<std::string> env_var(const char* name);

}  // namespace kestrel
