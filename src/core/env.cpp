#include "core/env.h"

#include <cstdlib>

namespace kestrel {

std::optional<std::string> env_var(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

}  // namespace kestrel
