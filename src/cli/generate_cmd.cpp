// `kestrel generate`: every prompt submitted to one Engine (continuous
// batching, chunked prefill, the sampler with all of its knobs, stop
// sequences), the text streamed to stdout as tokens arrive, or with --json one
// object per prompt: ids, text, logprobs and finish reason.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/adapters_arg.h"
#include "cli/commands.h"
#include "cli/parallel_arg.h"
#include "cli/prompt_input.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/engine.h"
#include "model/falcon_model.h"

namespace kestrel::cli {
namespace {

struct GenerateArgs {
  std::string model_dir;
  ParallelArgs parallel;
  std::string token_ids_file;
  std::string adapters_file;  // --adapters: one LoRA adapter folder (or null) per prompt
  std::vector<std::string> prompts;
  std::string device = "cpu";
  std::string cuda_graphs = "on";
  int64_t block_size = 16;
  int64_t prefill_chunk = 0;
  int64_t max_new_tokens = 32;
  bool greedy = false;
  bool json = false;
  bool ignore_eos = false;
  bool no_prefix_caching = false;
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float typical_p = 1.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::string json_schema_file;  // structured output: a JSON Schema file, or
  std::string regex;             // a regular expression the output must match
};

// --json-schema FILE / --regex RE as the engine's constraint (checked when submitted).
std::optional<grammar::Spec> constraint(const GenerateArgs& g) {
  if (!g.regex.empty()) return grammar::Spec{grammar::Spec::Kind::kRegex, g.regex, "--regex"};
  if (g.json_schema_file.empty()) return std::nullopt;
  std::ifstream in(g.json_schema_file, std::ios::binary);
  KESTREL_CHECK(in.good(), "--json-schema: cannot read ", g.json_schema_file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return grammar::Spec{grammar::Spec::Kind::kJsonSchema, text, "--json-schema"};
}

SamplingParams sampling_params(const GenerateArgs& g, size_t prompt_index) {
  SamplingParams p;
  // --greedy, or temperature 0 (as the server), is argmax; otherwise sampling.
  p.do_sample = !g.greedy && g.temperature != 0.0f;
  if (p.do_sample) p.temperature = g.temperature;
  p.top_k = g.top_k;
  p.top_p = g.top_p;
  p.typical_p = g.typical_p;
  p.repetition_penalty = g.repetition_penalty;
  p.frequency_penalty = g.frequency_penalty;
  p.presence_penalty = g.presence_penalty;
  // Prompt i draws from seed + i: reproducible, yet equal prompts differ.
  if (g.seed) p.seed = *g.seed + prompt_index;
  p.max_new_tokens = g.max_new_tokens;
  p.stop = g.stop;
  p.ignore_eos = g.ignore_eos;
  return p;
}

// A cache that holds every request at once, so nothing is preempted.
EngineOptions engine_options(const GenerateArgs& g,
                             const std::vector<std::vector<int32_t>>& prompts) {
  EngineOptions o;
  o.block_size = g.block_size;
  int64_t longest = 0, blocks = 1;
  for (const auto& p : prompts) {
    const int64_t n = static_cast<int64_t>(p.size());
    longest = std::max(longest, n);
    blocks += (n + g.max_new_tokens + g.block_size - 1) / g.block_size;
  }
  o.num_blocks = blocks;
  o.max_input_length = longest;
  o.max_total_tokens = longest + g.max_new_tokens;
  o.max_running_seqs = std::max<int64_t>(1, static_cast<int64_t>(prompts.size()));
  if (g.prefill_chunk > 0) o.max_batch_prefill_tokens = g.prefill_chunk;
  o.prefix_caching = !g.no_prefix_caching;
  return o;
}

// Text of one request as it streams: a stop sequence found in it (the engine
// ends the request there) and whatever could still begin one are held back
// until the next token or the end.
class TextStream {
 public:
  explicit TextStream(const std::vector<std::string>& stops) : stops_(stops) {
    for (const auto& s : stops) hold_ = std::max(hold_, s.empty() ? size_t{0} : s.size() - 1);
  }
  void token(const std::string& piece) {
    text_ += piece;
    size_t upto = text_.size() > hold_ ? text_.size() - hold_ : 0;
    for (const std::string& s : stops_) upto = std::min(upto, text_.find(s));
    emit(upto);
  }
  void finish(const std::string& final_text) {
    text_ = final_text;
    emit(text_.size());
  }

 private:
  void emit(size_t upto) {
    if (upto <= printed_) return;
    std::cout.write(text_.data() + printed_, static_cast<std::streamsize>(upto - printed_));
    std::cout.flush();
    printed_ = upto;
  }
  std::vector<std::string> stops_;
  std::string text_;
  size_t printed_ = 0;
  size_t hold_ = 0;
};

nlohmann::json result_json(const GenerationResult& r, bool has_text) {
  nlohmann::json logprobs = nlohmann::json::array();
  for (const TokenInfo& t : r.tokens) {
    logprobs.push_back(std::isfinite(t.logprob) ? nlohmann::json(t.logprob) : nlohmann::json());
  }
  return {{"token_ids", r.token_ids},
          {"text", has_text ? nlohmann::json(r.text) : nlohmann::json()},
          {"logprobs", std::move(logprobs)},
          {"finish_reason", finish_reason_name(r.finish_reason)},
          {"seed", r.seed}};
}

void run_generate(const GenerateArgs& g) {
  const bool graphs = parse_cuda_graphs_arg(g.cuda_graphs, "generate");
  auto model = std::make_shared<const FalconModel>([&] {
    FalconModel m = load_model(g.model_dir, parse_device_arg(g.device, "generate"), g.parallel);
    m.set_cuda_graphs(graphs);
    return m;
  }());
  spdlog::info("loaded {}: {}", g.model_dir, model->config().summary());
  std::shared_ptr<const text::Tokenizer> tok;
  if (auto t = maybe_tokenizer(g.model_dir)) {
    tok = std::make_shared<const text::Tokenizer>(std::move(*t));
  }
  std::vector<std::vector<int32_t>> prompts;
  if (!g.token_ids_file.empty()) {
    prompts = read_token_ids(g.token_ids_file);
  } else {
    KESTREL_CHECK(!g.prompts.empty(), "give --token-ids FILE or --prompt TEXT");
    KESTREL_CHECK(tok != nullptr, g.model_dir, " has no tokenizer.json; give --token-ids");
    for (const std::string& text : g.prompts) prompts.push_back(tok->encode(text));
  }
  KESTREL_CHECK(g.stop.empty() || tok, "--stop needs the model folder's tokenizer.json");

  std::vector<GenerationResult> results(prompts.size());
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<EngineStats> stats;
  if (g.max_new_tokens > 0) {
    Engine engine(model, tok, engine_options(g, prompts));
    std::vector<GenerationRequest> requests;
    std::vector<std::shared_ptr<const LoraAdapter>> adapters(prompts.size());
    if (!g.adapters_file.empty()) adapters = load_adapters(*model, g.adapters_file, prompts.size());
    const std::optional<grammar::Spec> spec = constraint(g);
    KESTREL_CHECK(!spec || tok, "--json-schema / --regex need the model folder's tokenizer.json");
    for (size_t i = 0; i < prompts.size(); ++i)
      requests.push_back({prompts[i], sampling_params(g, i), adapters[i], spec});
    // Queued at once, so they start in one step and a run repeats exactly.
    const auto handles = engine.submit_all(std::move(requests));
    // All run together; prompt i's text streams once the ones before it ended.
    for (size_t i = 0; i < handles.size(); ++i) {
      if (!g.json && tok) std::cout << tok->decode(prompts[i]) << std::flush;
      TextStream out(g.stop);
      while (auto e = handles[i]->next()) {
        if (e->kind == EngineEvent::Kind::kError) throw Error(e->error);
        if (e->kind == EngineEvent::Kind::kFinished) {
          results[i] = *e->result;
          break;
        }
        if (!g.json && tok) out.token(e->token.text);
      }
      if (g.json) continue;
      if (tok) {
        out.finish(results[i].text);
      } else {
        for (size_t k = 0; k < results[i].token_ids.size(); ++k) {
          std::cout << (k ? " " : "") << results[i].token_ids[k];
        }
      }
      std::cout << "\n" << std::flush;
    }
    stats = engine.stats();
  } else if (!g.json) {
    for (const auto& p : prompts) std::cout << (tok ? tok->decode(p) : "") << "\n";
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t n_new = 0;
  for (const auto& r : results) n_new += static_cast<int64_t>(r.token_ids.size());
  spdlog::info("generated {} tokens for {} prompts in {:.3f} s ({:.1f} tokens/s)", n_new,
               prompts.size(), secs, secs > 0 ? n_new / secs : 0.0);
  if (stats) {
    spdlog::info("engine: {} steps, {} prompt tokens computed, {} from the prefix cache",
                 stats->steps, stats->computed_prompt_tokens, stats->prefix_cache_hit_tokens);
  }
  if (g.json) {
    nlohmann::json j;
    j["outputs"] = nlohmann::json::array();
    for (const auto& r : results) j["outputs"].push_back(result_json(r, tok != nullptr));
    std::cout << j.dump() << "\n";
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  static GenerateArgs g;
  CLI::App* cmd = app.add_subcommand(
      "generate", "generate for every prompt through the engine (continuous batching, sampling)");
  cmd->add_option("--model", g.model_dir, "model folder (config.json + safetensors)")->required();
  add_parallel_options(cmd, g.parallel);
  auto* ids = cmd->add_option("--token-ids", g.token_ids_file, "PROMPTS.json: [[ids...], ...]");
  auto* text = cmd->add_option("--prompt", g.prompts, "prompt text (repeatable)");
  cmd->add_option("--adapters", g.adapters_file,
                  "ADAPTERS.json: a list, one LoRA adapter folder (or null) per prompt; all "
                  "prompts still run as one batch");
  ids->excludes(text);
  cmd->add_option("--max-new-tokens", g.max_new_tokens, "tokens to generate per prompt")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_flag("--greedy", g.greedy, "greedy decoding (argmax); the default is sampling");
  cmd->add_option("--temperature", g.temperature, "softmax temperature (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", g.top_k, "sample from the k most likely tokens (0: off)")
      ->capture_default_str();
  cmd->add_option("--top-p", g.top_p, "nucleus sampling mass (1: off)")->capture_default_str();
  cmd->add_option("--typical-p", g.typical_p, "typical sampling mass (1: off)")
      ->capture_default_str();
  cmd->add_option("--repetition-penalty", g.repetition_penalty,
                  "divides positive, multiplies negative logits of seen tokens (1: off)")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", g.frequency_penalty, "OpenAI frequency penalty [-2, 2]")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", g.presence_penalty, "OpenAI presence penalty [-2, 2]")
      ->capture_default_str();
  cmd->add_option("--seed", g.seed, "sampling seed (prompt i uses seed + i)");
  cmd->add_option("--stop", g.stop, "stop sequence, not part of the output (repeatable)");
  cmd->add_flag("--ignore-eos", g.ignore_eos, "do not stop at EOS");
  auto* schema =
      cmd->add_option("--json-schema", g.json_schema_file,
                      "structured output: the text is JSON valid under this schema file");
  cmd->add_option("--regex", g.regex, "structured output: the text matches this regex")
      ->excludes(schema);
  cmd->add_flag("--json", g.json,
                "print only {\"outputs\":[{\"token_ids\",\"text\",\"logprobs\",\"finish_reason\","
                "\"seed\"}]}");
  cmd->add_option("--device", g.device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--cuda-graphs", g.cuda_graphs, "on or off: decode steps as CUDA graphs")
      ->capture_default_str();
  cmd->add_option("--block-size", g.block_size, "KV cache block size in tokens")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", g.prefill_chunk,
                  "tokens per step (--max-batch-prefill-tokens; 0: the engine's default)")
      ->capture_default_str();
  cmd->add_flag("--no-prefix-caching", g.no_prefix_caching,
                "do not share the KV blocks of equal prompt prefixes");
  cmd->callback([] { run_generate(g); });
}

}  // namespace kestrel::cli
