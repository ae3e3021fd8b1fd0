// Logging: spdlog to stderr, so that stdout carries only a command's output.
#pragma once

#include <spdlog/spdlog.h>

namespace kestrel {
// Sets the stderr logger up once; level is "debug", "info", "warn" or "error".
void init_logging(const std::string& level = "info");
}  // namespace kestrel
