// --tensor-parallel N (alias --num-shard, LoRAX's name) and --verbose for the model commands
// (logits, generate, serve, bench): N ranks of tensor parallelism, checked before any weight is
// read.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "model/falcon_model.h"

namespace kestrel::cli {

struct ParallelArgs {
  int tensor_parallel = 1;
  bool verbose = false;
};

void add_parallel_options(CLI::App* cmd, ParallelArgs& a);

// Loads DIR on `device` over a.tensor_parallel ranks; with --verbose prints each rank's weight
// bytes (its share of the checkpoint) to stderr.
FalconModel load_model(const std::string& dir, Device device, const ParallelArgs& a);

}  // namespace kestrel::cli
