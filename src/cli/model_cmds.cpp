// `kestrel logits` and `kestrel generate`: one model run from the command line
// through the paged KV cache (the checks and benchmarks call exactly these).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/logging.h"
#include "io/safetensors.h"
#include "model/falcon_model.h"
#include "model/runner.h"
#include "text/tokenizer.h"

namespace kestrel::cli {
namespace {

struct RunArgs {
  std::string model_dir;
  std::string token_ids_file;
  int64_t block_size = 16;
  int64_t prefill_chunk = 0;
};

void add_run_options(CLI::App* cmd, RunArgs& a) {
  cmd->add_option("--model", a.model_dir, "model folder (config.json + safetensors)")->required();
  cmd->add_option("--block-size", a.block_size, "KV cache block size in tokens")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", a.prefill_chunk,
                  "prefill each prompt in chunks of N tokens through the cache (0: whole)")
      ->capture_default_str();
}

// PROMPTS.json: [[ids...], ...].
std::vector<std::vector<int32_t>> read_token_ids(const std::string& path) {
  std::ifstream in(path);
  KESTREL_CHECK(in.good(), "cannot open ", path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  KESTREL_CHECK(!j.is_discarded(), path, ": not valid JSON");
  KESTREL_CHECK(j.is_array() && !j.empty(), path, ": expected a non-empty array of prompts");
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < j.size(); ++i) {
    KESTREL_CHECK(j[i].is_array() && !j[i].empty(), path, ": prompt ", i,
                  " must be a non-empty array of token ids");
    std::vector<int32_t> ids;
    for (const auto& v : j[i]) {
      KESTREL_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX,
                    path, ": prompt ", i, " holds ", v.dump(), ", not a token id");
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    prompts.push_back(std::move(ids));
  }
  return prompts;
}

std::optional<text::Tokenizer> maybe_tokenizer(const std::string& dir) {
  if (!std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) return std::nullopt;
  return text::Tokenizer::from_model_dir(dir);
}

void run_logits(const RunArgs& a, const std::string& out_path) {
  const FalconModel model = FalconModel::load(a.model_dir);
  std::vector<std::vector<int32_t>> prompts = read_token_ids(a.token_ids_file);
  std::vector<int64_t> cu{0};
  for (const auto& p : prompts) cu.push_back(cu.back() + static_cast<int64_t>(p.size()));
  BatchRunner runner(model, prompts, 0, {a.block_size, a.prefill_chunk});
  Tensor logits = runner.prefill(/*all_logits=*/true);
  Tensor cu_t = Tensor::empty(DType::kI64, {static_cast<int64_t>(cu.size())});
  std::copy(cu.begin(), cu.end(), cu_t.data<int64_t>());
  write_safetensors(out_path, {{"logits", logits}, {"cu_seqlens", cu_t}});
  spdlog::info("wrote logits {} to {}", shape_str(logits.shape()), out_path);
}

struct GenerateArgs {
  std::vector<std::string> prompts;
  int64_t max_new_tokens = 32;
  bool greedy = false;
  bool json = false;
  bool ignore_eos = false;
};

void run_generate(const RunArgs& a, const GenerateArgs& g) {
  const FalconModel model = FalconModel::load(a.model_dir);
  spdlog::info("loaded {}: {}", a.model_dir, model.config().summary());
  std::optional<text::Tokenizer> tok = maybe_tokenizer(a.model_dir);
  std::vector<std::vector<int32_t>> prompts;
  if (!a.token_ids_file.empty()) {
    prompts = read_token_ids(a.token_ids_file);
  } else {
    KESTREL_CHECK(!g.prompts.empty(), "give --token-ids FILE or --prompt TEXT");
    KESTREL_CHECK(tok.has_value(), a.model_dir, " has no tokenizer.json; give --token-ids");
    for (const std::string& text : g.prompts) prompts.push_back(tok->encode(text));
  }
  if (!g.greedy) spdlog::info("sampling arrives with the engine; decoding greedily");

  const auto t0 = std::chrono::steady_clock::now();
  auto outputs = greedy_generate(model, prompts, g.max_new_tokens, {a.block_size, a.prefill_chunk},
                                 /*stop_at_eos=*/!g.ignore_eos);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t n_new = 0;
  for (const auto& o : outputs) n_new += static_cast<int64_t>(o.size());
  spdlog::info("generated {} tokens for {} prompts in {:.3f} s ({:.1f} tokens/s)", n_new,
               outputs.size(), secs, secs > 0 ? n_new / secs : 0.0);

  if (g.json) {
    nlohmann::json j;
    j["outputs"] = nlohmann::json::array();
    for (const auto& o : outputs) {
      nlohmann::json row{{"token_ids", o}};
      if (tok) row["text"] = tok->decode(o);
      j["outputs"].push_back(std::move(row));
    }
    std::cout << j.dump() << "\n";
    return;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (tok) {
      std::cout << tok->decode(prompts[i]) << tok->decode(outputs[i]) << "\n";
    } else {
      for (size_t k = 0; k < outputs[i].size(); ++k) std::cout << (k ? " " : "") << outputs[i][k];
      std::cout << "\n";
    }
  }
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
  logits->callback([] { run_logits(logits_args, out_path); });

  static RunArgs gen_args;
  static GenerateArgs gen;
  CLI::App* generate =
      app.add_subcommand("generate", "decode all prompts together, one batched step per token");
  add_run_options(generate, gen_args);
  auto* ids =
      generate->add_option("--token-ids", gen_args.token_ids_file, "PROMPTS.json: [[ids...], ...]");
  auto* text = generate->add_option("--prompt", gen.prompts, "prompt text (repeatable)");
  ids->excludes(text);
  generate->add_option("--max-new-tokens", gen.max_new_tokens, "tokens to generate per prompt")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  generate->add_flag("--greedy", gen.greedy, "greedy decoding (argmax)");
  generate->add_flag("--json", gen.json, "print {\"outputs\":[{\"token_ids\":[...]}]} only");
  generate->add_flag("--ignore-eos", gen.ignore_eos, "do not stop at EOS");
  generate->callback([] { run_generate(gen_args, gen); });
}

}  // namespace kestrel::cli
