// `kestrel logits`: every prompt token's logits from one ragged prefill batch
// through the paged KV cache (the parity checks call exactly this).
#include "cli/adapters_arg.h"
#include "cli/commands.h"
#include "cli/parallel_arg.h"
#include "cli/prompt_input.h"
#include "core/error.h"
#include "core/logging.h"
#include "io/safetensors.h"
#include "model/falcon_model.h"
#include "model/runner.h"

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

namespace kestrel::cli {
namespace {

struct RunArgs {
  std::string model_dir;
  ParallelArgs parallel;
  std::string token_ids_file;
  int64_t block_size = 16;
  int64_t prefill_chunk = 0;
  std::string device = "cpu";
  std::string adapters_file;  // logits --adapters
};

void add_run_options(CLI::App* cmd, RunArgs& a) {
  cmd->add_option("--model", a.model_dir, "model folder (config.json + safetensors)")->required();
  add_parallel_options(cmd, a.parallel, /*processes=*/true);
  cmd->add_option("--block-size", a.block_size, "KV cache block size in tokens")
      ->capture_default_str();
  cmd->add_option("--device", a.device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--prefill-chunk", a.prefill_chunk,
                  "prefill each prompt in chunks of N tokens through the cache (0: whole)")
      ->capture_default_str();
}

void run_logits(const RunArgs& a, const std::string& out_path) {
  const FalconModel model =
      load_model(a.model_dir, parse_device_arg(a.device, "logits"), a.parallel);
  std::vector<std::vector<int32_t>> prompts = read_token_ids(a.token_ids_file);
  std::vector<int64_t> cu{0};
  for (const auto& p : prompts) cu.push_back(cu.back() + static_cast<int64_t>(p.size()));
  RunnerOptions opt{a.block_size, a.prefill_chunk, {}};
  std::vector<std::shared_ptr<const LoraAdapter>> adapters;
  if (!a.adapters_file.empty()) {
    adapters = load_adapters(model, a.adapters_file, prompts.size());
    for (const auto& ad : adapters) opt.adapters.push_back(ad.get());
  }
  BatchRunner runner(model, prompts, 0, opt);
  Tensor logits = runner.prefill(/*all_logits=*/true);
  Tensor cu_t = Tensor::empty(DType::kI64, {static_cast<int64_t>(cu.size())});
  std::copy(cu.begin(), cu.end(), cu_t.data<int64_t>());
  if (a.parallel.nnodes > 1 && a.parallel.node_rank != 0) return;  // rank 0 writes
  write_safetensors(out_path, {{"logits", logits}, {"cu_seqlens", cu_t}});
  spdlog::info("wrote logits {} to {}", shape_str(logits.shape()), out_path);
}

}  // namespace

void add_model_commands(CLI::App& app) {
  static RunArgs logits_args;
  static std::string out_path;
  CLI::App* logits = app.add_subcommand(
      "logits", "logits of every prompt token, all prompts as one ragged prefill batch");
  add_run_options(logits, logits_args);
  logits->add_option("--token-ids", logits_args.token_ids_file, "PROMPTS.json: [[ids...], ...]")
      ->required();
  logits->add_option("--out", out_path, "output .safetensors (logits, cu_seqlens)")->required();
  logits->add_option("--adapters", logits_args.adapters_file,
                     "ADAPTERS.json: a list, one LoRA adapter folder (or null) per prompt; all "
                     "prompts still run as one batch");
  logits->callback([] { run_logits(logits_args, out_path); });
}

}  // namespace kestrel::cli
