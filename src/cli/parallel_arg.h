// How the model commands (logits, generate, serve, bench) load the model: --tensor-parallel N
// (alias --num-shard, LoRAX's name; N ranks, checked before any weight is read), --quantize fp8
// (LoRAX / TGI's spelling: FP8 E4M3 linears, FalconModel's WeightQuant), --fp8-activations and
// --verbose.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "model/falcon_model.h"

namespace kestrel::cli {

struct ParallelArgs {
  int tensor_parallel = 1;
  bool verbose = false;
  // Across processes (logits, bench): --nnodes processes, one rank each.
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string quantize;                 // "" or "fp8"
  bool fp8_activations = false;         // round activations to FP8 at every row count
  std::string kv_cache_dtype = "auto";  // auto (the activations' dtype) or fp8 (E4M3)
};

// The WeightQuant --quantize / --fp8-activations ask for.
WeightQuant weight_quant(const ParallelArgs& a);
// Sets the model's KV cache dtype from --kv-cache-dtype.
void apply_kv_cache_dtype(FalconModel& model, const ParallelArgs& a);

// processes: also --nnodes, --node-rank, --master-addr, --master-port (commands whose every
// process runs the same batches: logits, bench; only rank 0 writes results).
void add_parallel_options(CLI::App* cmd, ParallelArgs& a, bool processes = false);

// Loads DIR on `device` over a.tensor_parallel ranks (or, with --nnodes N > 1, this process's
// rank of N after joining the others: CPU collectives over TCP, CUDA over NCCL); with --verbose
// prints each rank's weight bytes (its share of the checkpoint) to stderr.
FalconModel load_model(const std::string& dir, Device device, const ParallelArgs& a);

}  // namespace kestrel::cli
