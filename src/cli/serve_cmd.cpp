// `kestrel serve`: loads the model folder (or draws a preset's random weights on the device,
// for capacity and load tests at real shapes), starts the engine and answers the LoRAX / TGI
// and OpenAI HTTP APIs until SIGTERM / SIGINT (then drains, exit 0).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "cli/commands.h"
#include "cli/parallel_arg.h"
#include "cli/presets.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/engine.h"
#include "lora/adapter_store.h"
#include "model/falcon_model.h"
#include "model/memory_plan.h"
#include "server/chat_template.h"
#include "server/http_server.h"
#include "server/request_policy.h"
#include "text/tokenizer.h"

namespace kestrel::cli {
namespace {

struct ServeArgs {
  std::string model_dir;
  std::string preset;     // random weights of a published shape instead of --model
  std::string tokenizer;  // tokenizer.json for --preset
  ParallelArgs parallel;
  std::string model_id;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  int64_t max_concurrent_requests = 512;
  int64_t max_input_length = 1024;
  int64_t max_total_tokens = 2048;
  int64_t max_batch_prefill_tokens = 4096;
  int64_t max_batch_total_tokens = 0;
  int64_t max_running_seqs = 128;
  std::string kv_cache_memory;  // empty: from --gpu-memory-fraction on cuda, 256MiB on the CPU
  std::string device = "cpu";
  std::string cuda_graphs = "on";
  double gpu_memory_fraction = 0.9;
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  bool no_prefix_caching = false;
  int64_t max_body_bytes = 2 << 20;
  int threads = 2;
  double drain_timeout_s = 30;
  int64_t max_best_of = 4;
  int64_t max_stop_sequences = 4;
  std::vector<std::string> adapters;  // --adapter NAME=DIR, preloaded
  std::string adapters_dir;
  bool allow_adapter_paths = false;
  bool allow_runtime_adapters = false;
  int64_t max_requests_per_adapter = 0;
  double adapter_load_timeout_s = 60;
  std::vector<std::string> allowed_hosts;  // empty: from --host
  std::vector<std::string> cors_origins;
  int max_loaded_adapters = 16;
  int64_t adapter_memory_mib = 0;  // 0: on cuda max_loaded x a rank-16 adapter, else no bound
};

constexpr double kMiB = 1048576.0;
constexpr int64_t kReserveRank = 16;  // the default reserve's adapter: rank 16, all four modules

// The store's memory budget (bytes, 0: none) and the reserve kept beside the CUDA KV cache:
// --adapter-memory, else on cuda --max-loaded-adapters x one rank-16 adapter on all modules.
struct AdapterMemory {
  int64_t budget = 0, reserve = 0, unit = 0;
};

AdapterMemory plan_adapter_memory(const ServeArgs& a, const FalconModel& model, Device device) {
  AdapterMemory m;
  m.unit = lora_adapter_bytes(model, kReserveRank);
  if (a.adapter_memory_mib > 0)
    m.budget = a.adapter_memory_mib << 20;
  else if (device == Device::kCuda)
    m.budget = a.max_loaded_adapters * m.unit;
  // Only a cache sized from --gpu-memory-fraction needs the room kept; a given size is the user's.
  const bool cache_from_fraction = a.kv_cache_memory.empty() && a.num_blocks <= 0;
  m.reserve = device == Device::kCuda && cache_from_fraction ? m.budget : 0;
  if (m.budget > 0)
    spdlog::info(
        "adapter store: up to {} adapters in {:.1f} MiB ({}; a rank-{} adapter on all four modules "
        "of this model is {:.1f} MiB){}",
        a.max_loaded_adapters, m.budget / kMiB,
        a.adapter_memory_mib > 0 ? "--adapter-memory" : "--max-loaded-adapters x rank-16 adapter",
        kReserveRank, m.unit / kMiB, m.reserve > 0 ? ", reserved beside the KV cache" : "");
  else
    spdlog::info("adapter store: up to {} adapters (--max-loaded-adapters), no memory bound",
                 a.max_loaded_adapters);
  return m;
}

// `--adapter NAME=DIR` x N, loaded before the server listens; a bad one stops start-up.
void preload_adapters(const ServeArgs& a, AdapterStore& store) {
  KESTREL_CHECK(static_cast<int64_t>(a.adapters.size()) <= a.max_loaded_adapters, a.adapters.size(),
                " --adapter flags but --max-loaded-adapters is ", a.max_loaded_adapters);
  std::vector<std::string> names;
  for (const std::string& spec : a.adapters) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      KESTREL_FAIL("--adapter expects NAME=DIR, got '", spec, "'");
    names.push_back(spec.substr(0, eq));
    try {
      store.preload(names.back(), spec.substr(eq + 1));
    } catch (const std::exception& e) {
      KESTREL_FAIL("--adapter ", spec, ": ", e.what());
    }
  }
  for (const std::string& name : names)
    if (!store.is_loaded(name))
      KESTREL_FAIL("--adapter ", name,
                   ": evicted by the adapters preloaded after it; together they hold more than "
                   "the adapter memory budget (",
                   store.options().memory_budget / kMiB, " MiB, --adapter-memory)");
}

// "268435456", "256MiB", "1GiB", "512M", "2G".
int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    KESTREL_FAIL("--kv-cache-memory: cannot read '", text, "' as a size (e.g. 256MiB)");
  }
  std::string unit = text.substr(used);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 1;
  if (unit == "k" || unit == "kib" || unit == "kb")
    scale = 1024.0;
  else if (unit == "m" || unit == "mib" || unit == "mb")
    scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib" || unit == "gb")
    scale = 1024.0 * 1024 * 1024;
  else
    KESTREL_CHECK(unit.empty() || unit == "b", "--kv-cache-memory: unknown unit '", unit, "'");
  KESTREL_CHECK(v > 0, "--kv-cache-memory must be positive");
  return static_cast<int64_t>(v * scale);
}

void run_serve(const ServeArgs& a) {
  KESTREL_CHECK(a.max_input_length < a.max_total_tokens, "--max-input-length (", a.max_input_length,
                ") must be below --max-total-tokens (", a.max_total_tokens, ")");
  const Device device = parse_device_arg(a.device, "serve");
  const bool preset = !a.preset.empty();
  KESTREL_CHECK(a.model_dir.empty() == preset, "serve: give --model DIR or --preset NAME");
  KESTREL_CHECK(!preset || !a.tokenizer.empty(),
                "serve --preset needs --tokenizer FILE (a tokenizer.json)");
  KESTREL_CHECK(!preset || (a.parallel.tensor_parallel == 1 && a.parallel.nnodes == 1),
                "serve --tensor-parallel / --nnodes need --model DIR (--preset draws one rank's "
                "weights)");
  spdlog::info("loading model from {} to {}",
               preset ? "random " + a.preset + " weights" : a.model_dir, a.device);
  const bool graphs = parse_cuda_graphs_arg(a.cuda_graphs, "serve");
  auto model = std::make_shared<const FalconModel>([&] {
    FalconModel m = preset ? FalconModel::random(falcon_preset_config(a.preset), device, 1,
                                                 weight_quant(a.parallel))
                           : load_model(a.model_dir, device, a.parallel);
    if (preset) apply_kv_cache_dtype(m, a.parallel);
    m.set_cuda_graphs(graphs);
    return m;
  }());
  spdlog::info("loaded {} on {} ({} linear weights, {:.2f} GiB)", model->config().summary(),
               ops::device_name(device), dtype_name(model->linear_weight_dtype()),
               model->weight_bytes() / 1073741824.0);
  const std::filesystem::path dir(preset ? std::filesystem::path(a.tokenizer).parent_path()
                                         : std::filesystem::path(a.model_dir));
  KESTREL_CHECK(preset || std::filesystem::exists(dir / "tokenizer.json"), a.model_dir,
                " has no tokenizer.json: the server needs one to read and write text");
  auto tokenizer = std::make_shared<const text::Tokenizer>(
      preset ? text::Tokenizer::from_file(a.tokenizer) : text::Tokenizer::from_model_dir(dir));
  spdlog::info("loaded tokenizer ({} tokens)", tokenizer->vocab_size());
  KESTREL_CHECK(tokenizer->vocab_size() <= model->config().vocab_size, "serve: the tokenizer has ",
                tokenizer->vocab_size(), " tokens, the model's vocabulary ",
                model->config().vocab_size);
  server::ChatTemplate chat =
      preset ? server::ChatTemplate() : server::ChatTemplate::from_model_dir(dir);
  spdlog::info("chat template: {}", chat.is_default() ? "Falcon default (User:/Assistant:)"
                                                      : "tokenizer_config.json chat_template");

  const AdapterMemory adapter_mem = plan_adapter_memory(a, *model, device);
  EngineOptions eo;
  eo.block_size = a.block_size;
  eo.num_blocks = a.num_blocks;
  if (a.num_blocks <= 0) {
    KvPlanOptions po;
    po.block_size = a.block_size;
    po.max_batch_prefill_tokens = a.max_batch_prefill_tokens;
    po.max_running_seqs = a.max_running_seqs;
    po.max_input_length = a.max_input_length;
    po.gpu_memory_fraction = a.gpu_memory_fraction;
    po.reserved_bytes = adapter_mem.reserve;
    po.kv_cache_memory = !a.kv_cache_memory.empty() ? parse_bytes(a.kv_cache_memory)
                         : device == Device::kCpu   ? int64_t{256} << 20
                                                    : 0;
    const KvPlan plan = plan_kv_cache(*model, po);
    if (plan.total > 0) {
      constexpr double kGiB = 1073741824.0;
      spdlog::info(
          "device memory: {:.2f} GiB total, {:.2f} GiB in use after loading, {:.2f} GiB "
          "activation workspace, {:.2f} GiB margin, {:.2f} GiB for LoRA adapters; KV cache "
          "{:.2f} GiB ({} of {:.2f})",
          plan.total / kGiB, plan.used_before / kGiB, plan.activation_bytes / kGiB,
          plan.margin_bytes / kGiB, plan.reserved_bytes / kGiB, plan.kv_bytes / kGiB,
          "--gpu-memory-fraction", a.gpu_memory_fraction);
    }
    eo.num_blocks = plan.num_blocks;
  }
  eo.max_batch_prefill_tokens = a.max_batch_prefill_tokens;
  eo.max_running_seqs = a.max_running_seqs;
  eo.max_input_length = a.max_input_length;
  eo.max_total_tokens = a.max_total_tokens;
  eo.max_batch_total_tokens = a.max_batch_total_tokens;
  eo.prefix_caching = !a.no_prefix_caching;
  Engine engine(model, tokenizer, eo);
  const EngineStats st = engine.stats();
  spdlog::info("engine ready on {}: {} KV blocks of {} tokens ({} tokens, {}, {:.2f} GiB)",
               a.device, st.kv_blocks_total, eo.block_size, st.kv_blocks_total * eo.block_size,
               dtype_name(model->kv_cache_dtype()),
               st.kv_blocks_total * model->kv_bytes_per_block(eo.block_size) / 1073741824.0);

  // The store outlives nothing that its callbacks reach: reset before the server goes.
  AdapterStoreOptions so_lora;
  so_lora.max_loaded = a.max_loaded_adapters;
  so_lora.adapters_dir = a.adapters_dir;
  so_lora.memory_budget = adapter_mem.budget;
  so_lora.allow_paths = a.allow_adapter_paths;
  so_lora.load_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(a.adapter_load_timeout_s * 1000));
  KESTREL_CHECK(a.adapters_dir.empty() || std::filesystem::is_directory(a.adapters_dir),
                "--adapters-dir ", a.adapters_dir, " is not a folder");
  auto store = std::make_unique<AdapterStore>(
      [model](const std::string& dir, const std::string& name) {
        return model->load_adapter(dir, name);
      },
      so_lora);
  store->set_merge_hooks({[model](const std::string& dir) { return model->read_host_adapter(dir); },
                          [model](const MergedLora& merged, const std::string& name) {
                            return model->adapter_from_merged(merged, name);
                          }});
  preload_adapters(a, *store);

  server::ApiOptions ao;
  ao.adapters = store.get();
  const std::string base =
      preset ? a.preset : std::filesystem::absolute(dir).lexically_normal().filename().string();
  ao.model_id = a.model_id.empty() ? base : a.model_id;
  if (ao.model_id.empty()) ao.model_id = "kestrel";
  ao.base_model_name = base;
  ao.api_key = a.api_key;
  if (a.allowed_hosts.empty()) {
    ao.allowed_hosts = server::default_allowed_hosts(a.host, ao.allow_ip_hosts);
  } else {
    ao.allowed_hosts.clear();
    for (const std::string& h : a.allowed_hosts) {
      std::string name = h == "*" ? h : server::host_of(h);
      KESTREL_CHECK(!name.empty(), "--allowed-hosts: '", h, "' is not a host name");
      ao.allowed_hosts.push_back(name);
    }
  }
  ao.cors_origins = a.cors_origins;
  ao.max_concurrent_requests = a.max_concurrent_requests;
  ao.max_requests_per_adapter = a.max_requests_per_adapter;
  ao.runtime_adapters = a.allow_runtime_adapters;
  ao.max_body_bytes = static_cast<size_t>(a.max_body_bytes);
  ao.limits.max_input_length = a.max_input_length;
  ao.limits.max_total_tokens = a.max_total_tokens;
  ao.limits.max_best_of = static_cast<int32_t>(a.max_best_of);
  ao.limits.max_stop_sequences = static_cast<int32_t>(a.max_stop_sequences);
  server::Api api(engine, *tokenizer, std::move(chat), ao);

  server::ServerOptions so;
  so.host = a.host;
  so.port = static_cast<uint16_t>(a.port);
  so.threads = a.threads;
  so.drain_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.drain_timeout_s * 1000));
  server::HttpServer server(api, so);
  struct StoreFirst {  // queued loads fail ("server shutting down") while the server still exists
    std::unique_ptr<AdapterStore>& store;
    ~StoreFirst() { store.reset(); }
  } store_first{store};
  const uint16_t port = server.listen();
  const bool v6 = a.host.find(':') != std::string::npos;
  std::printf("kestrel serving %s on http://%s%s%s:%u\n", ao.model_id.c_str(), v6 ? "[" : "",
              a.host.c_str(), v6 ? "]" : "", port);
  std::fflush(stdout);
  server.run();
  spdlog::info("stopped");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  static ServeArgs a;
  CLI::App* cmd = app.add_subcommand("serve", "serve the LoRAX / TGI and OpenAI HTTP APIs");
  add_parallel_options(cmd, a.parallel);
  auto* model_opt = cmd->add_option("--model", a.model_dir,
                                    "model folder (config.json, safetensors, tokenizer.json)");
  cmd->add_option("--preset", a.preset,
                  "instead of --model: random weights of falcon-7b, falcon-40b, falcon-180b, "
                  "falcon2-11b, falcon-rw-1b or tiny drawn on the device (capacity and load "
                  "tests; the text is noise)")
      ->excludes(model_opt);
  cmd->add_option("--tokenizer", a.tokenizer, "with --preset: the tokenizer.json to serve with");
  cmd->add_option("--model-id", a.model_id,
                  "name in /info and /v1/models (default: the folder name)");
  cmd->add_option("--host", a.host, "address to bind")->capture_default_str();
  cmd->add_option("--port", a.port, "port to bind (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", a.api_key,
                  "require Authorization: Bearer KEY (all routes but /health)");
  cmd->add_option("--allowed-hosts", a.allowed_hosts,
                  "Host header names the server answers (comma-separated; '*': any; default: "
                  "the --host address, and localhost's names on a loopback address)")
      ->delimiter(',');
  cmd->add_option("--cors-allow-origin", a.cors_origins,
                  "origins browser pages may call from (comma-separated, e.g. "
                  "https://app.example.com; '*': any; default: none)")
      ->delimiter(',');
  cmd->add_option("--max-concurrent-requests", a.max_concurrent_requests,
                  "generation requests in flight before 429")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-input-length", a.max_input_length, "prompt tokens per request")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-total-tokens", a.max_total_tokens, "prompt + generated tokens per request")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-batch-prefill-tokens", a.max_batch_prefill_tokens, "token budget per step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-batch-total-tokens", a.max_batch_total_tokens,
                  "tokens in the KV cache at once (0: what it holds)")
      ->capture_default_str();
  cmd->add_option("--max-running-seqs", a.max_running_seqs, "sequences decoding together")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--device", a.device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--cuda-graphs", a.cuda_graphs, "on or off: decode steps as CUDA graphs")
      ->capture_default_str();
  cmd->add_option("--kv-cache-memory", a.kv_cache_memory,
                  "KV cache size (bytes, or 256MiB, 2GiB; default: 256MiB on the CPU, "
                  "--gpu-memory-fraction on cuda)");
  cmd->add_option("--gpu-memory-fraction", a.gpu_memory_fraction,
                  "cuda: share of device memory for weights, activations and the KV cache")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--num-blocks", a.num_blocks, "KV blocks (overrides --kv-cache-memory)")
      ->capture_default_str();
  cmd->add_option("--block-size", a.block_size, "KV cache block size in tokens")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--no-prefix-caching", a.no_prefix_caching, "do not share prompt-prefix KV blocks");
  cmd->add_option("--max-body-bytes", a.max_body_bytes, "request body limit (413 beyond)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-best-of", a.max_best_of, "largest best_of accepted")
      ->capture_default_str();
  cmd->add_option("--max-stop-sequences", a.max_stop_sequences, "stop sequences per request")
      ->capture_default_str();
  cmd->add_option("--http-threads", a.threads, "HTTP I/O threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--drain-timeout", a.drain_timeout_s,
                  "seconds to let in-flight requests finish on SIGTERM / SIGINT")
      ->capture_default_str();
  cmd->add_option("--adapter", a.adapters,
                  "NAME=DIR: a LoRA adapter folder loaded at start under NAME (repeatable)");
  cmd->add_option("--adapters-dir", a.adapters_dir,
                  "folder whose subfolders are LoRA adapters requests may name (adapter_id); "
                  "ids resolve only inside it");
  cmd->add_flag("--allow-adapter-paths", a.allow_adapter_paths,
                "also accept an absolute folder path as adapter_id (any folder the server can "
                "read: only for trusted clients)");
  cmd->add_flag("--allow-runtime-adapters", a.allow_runtime_adapters,
                "allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter without --api-key "
                "(with a key they need it; without either they are refused)");
  cmd->add_option("--max-requests-per-adapter", a.max_requests_per_adapter,
                  "generation requests one adapter (or merge) may have in flight before 429 "
                  "(0: no cap beyond --max-concurrent-requests)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--adapter-load-timeout", a.adapter_load_timeout_s,
                  "seconds an adapter load may take before its requests fail with 503")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-loaded-adapters", a.max_loaded_adapters,
                  "LoRA adapters kept loaded (least recently used unused ones evicted)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--adapter-memory", a.adapter_memory_mib,
                  "MiB the loaded LoRA adapters may hold (default: on cuda "
                  "--max-loaded-adapters x a rank-16 adapter on all four modules, reserved "
                  "beside the KV cache; on the CPU no bound)")
      ->check(CLI::PositiveNumber);
  cmd->callback([] { run_serve(a); });
}

}  // namespace kestrel::cli
