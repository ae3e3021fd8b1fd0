// --tensor-parallel / --num-shard and --verbose (see parallel_arg.h).
#include "cli/parallel_arg.h"

#include <cstdio>

namespace kestrel::cli {

void add_parallel_options(CLI::App* cmd, ParallelArgs& a) {
  cmd->add_option("--tensor-parallel,--num-shard", a.tensor_parallel,
                  "ranks of tensor parallelism (CPU: threads of this process; CUDA: GPUs)")
      ->capture_default_str();
  cmd->add_flag("--verbose", a.verbose, "print each rank's loaded weight bytes");
}

FalconModel load_model(const std::string& dir, Device device, const ParallelArgs& a) {
  FalconModel model = FalconModel::load(dir, device, a.tensor_parallel);
  if (a.verbose) {
    const std::vector<int64_t> bytes = model.rank_weight_bytes();
    int64_t total = 0;
    for (int64_t b : bytes) total += b;
    for (size_t r = 0; r < bytes.size(); ++r) {
      std::fprintf(stderr, "rank %zu/%zu: %lld weight bytes (%.2f MiB, %.2f%% of %lld)\n", r,
                   bytes.size(), static_cast<long long>(bytes[r]), bytes[r] / 1048576.0,
                   total > 0 ? 100.0 * bytes[r] / total : 0.0, static_cast<long long>(total));
    }
  }
  return model;
}

}  // namespace kestrel::cli
