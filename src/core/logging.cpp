// The process-wide stderr logger.
#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace kestrel {

void init_logging(const std::string& level) {
  if (!spdlog::get("kestrel")) spdlog::set_default_logger(spdlog::stderr_color_mt("kestrel"));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_level(spdlog::level::from_str(level));
}

}  // namespace kestrel
