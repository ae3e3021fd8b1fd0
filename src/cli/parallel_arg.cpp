// --tensor-parallel / --num-shard and --verbose (see parallel_arg.h).
#include "cli/parallel_arg.h"

#include <cstdio>

#include "core/error.h"
#include "core/logging.h"
#include "parallel/process_group.h"
#ifdef KESTREL_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif

namespace kestrel::cli {

void add_parallel_options(CLI::App* cmd, ParallelArgs& a, bool processes) {
  cmd->add_option("--tensor-parallel,--num-shard", a.tensor_parallel,
                  "ranks of tensor parallelism (CPU: threads of this process; CUDA: GPUs)")
      ->capture_default_str();
  cmd->add_flag("--verbose", a.verbose, "print each rank's loaded weight bytes");
  cmd->add_option("--quantize", a.quantize,
                  "fp8: the linears' weights as FP8 E4M3 with one scale per output channel, "
                  "quantized at load (embeddings, norms and lm_head stay as they are)")
      ->check(CLI::IsMember({"fp8"}));
  cmd->add_option("--kv-cache-dtype", a.kv_cache_dtype,
                  "auto: K and V as the activations; fp8 (fp8_e4m3): E4M3 under a scale of 1, "
                  "twice the tokens in the same bytes")
      ->check(CLI::IsMember({"auto", "fp8", "fp8_e4m3"}))
      ->capture_default_str();
  cmd->add_flag("--fp8-activations", a.fp8_activations,
                "with --quantize fp8: round activations to FP8 per row before every product (the "
                "CPU else keeps them; CUDA else keeps them up to 8 rows, its weight-only GEMV)");
  if (!processes) return;
  cmd->add_option("--nnodes", a.nnodes,
                  "processes of tensor parallelism, one rank each (every one runs this command)")
      ->capture_default_str();
  cmd->add_option("--node-rank", a.node_rank, "this process's rank in [0, nnodes)")
      ->capture_default_str();
  cmd->add_option("--master-addr", a.master_addr, "IP address where rank 0 listens")
      ->capture_default_str();
  cmd->add_option("--master-port", a.master_port, "TCP port where rank 0 listens")
      ->capture_default_str();
}

namespace {

FalconModel load_process_rank(const std::string& dir, Device device, const ParallelArgs& a) {
  KESTREL_CHECK(a.tensor_parallel == 1 || a.tensor_parallel == a.nnodes, "--tensor-parallel ",
                a.tensor_parallel, " with --nnodes ", a.nnodes,
                ": across processes each process is one rank (leave --tensor-parallel at 1)");
  ProcessGroupOptions o;
  o.nnodes = a.nnodes;
  o.node_rank = a.node_rank;
  o.master_addr = a.master_addr;
  o.master_port = a.master_port;
  check_process_group(o);
  spdlog::info("rank {} of {}: joining rank 0 at {}:{}", o.node_rank, o.nnodes, o.master_addr,
               o.master_port);
  auto group = std::make_shared<ProcessGroup>(o);
  std::shared_ptr<Communicator> comm;
  if (device == Device::kCpu) {
    comm = make_tcp_communicator(group);
  } else {
#ifdef KESTREL_HAVE_NCCL
    comm = make_nccl_process_rank(group);
#else
    KESTREL_FAIL("--nnodes on CUDA needs NCCL, and this build has none");
#endif
  }
  return FalconModel::load_process_rank(dir, device, std::move(comm), weight_quant(a));
}

}  // namespace

WeightQuant weight_quant(const ParallelArgs& a) {
  if (a.fp8_activations && a.quantize != "fp8")
    KESTREL_FAIL("--fp8-activations needs --quantize fp8");
  return {.fp8 = a.quantize == "fp8", .fp8_activations = a.fp8_activations};
}

void apply_kv_cache_dtype(FalconModel& model, const ParallelArgs& a) {
  if (a.kv_cache_dtype != "auto") model.set_kv_cache_dtype(DType::kF8E4M3);
}

FalconModel load_model(const std::string& dir, Device device, const ParallelArgs& a) {
  const WeightQuant quant = weight_quant(a);
  FalconModel model = a.nnodes > 1 ? load_process_rank(dir, device, a)
                                   : FalconModel::load(dir, device, a.tensor_parallel, quant);
  apply_kv_cache_dtype(model, a);
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
