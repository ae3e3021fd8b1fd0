// --device for the model commands: a name to a Device, refusing cuda when
// this build or this machine has none; --cuda-graphs on|off.
#include "backend/ops.h"
#include "cli/commands.h"
#include "core/error.h"

namespace kestrel::cli {

Device parse_device_arg(const std::string& name, const char* command) {
  if (name == "cpu") return Device::kCpu;
  KESTREL_CHECK(name == "cuda", command, " --device must be cuda or cpu, got '", name, "'");
  KESTREL_CHECK(ops::cuda_available(), command,
                " --device cuda: this kestrel was built without CUDA (configure with "
                "-DKESTREL_CUDA=ON)");
  KESTREL_CHECK(ops::cuda_device_count() > 0, command, " --device cuda: no CUDA device visible");
  return Device::kCuda;
}

bool parse_cuda_graphs_arg(const std::string& value, const char* command) {
  KESTREL_CHECK(value == "on" || value == "off", command, " --cuda-graphs must be on or off, got '",
                value, "'");
  return value == "on";
}

}  // namespace kestrel::cli
