// `kestrel bench`: prefill and decode throughput of the model on one device,
// with a preset's random weights drawn on the device (no files) or a model
// folder. Decode tok/s counts generated tokens over the decode steps' time
// only (llama.cpp batched-bench's S_TG); first-token time is one request's
// prompt step plus its first sampled token. --json prints only the JSON.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "cli/bench_engine.h"
#include "cli/bench_roofline.h"
#include "cli/commands.h"
#include "cli/parallel_arg.h"
#include "cli/presets.h"
#include "core/error.h"
#include "core/logging.h"
#include "model/falcon_model.h"
#include "model/falcon_weights.h"
#ifdef KESTREL_CUDA
#include "backend/cuda/cuda_ops.h"
#endif

namespace kestrel::cli {
namespace {

struct BenchArgs {
  std::string device = "cuda";
  std::string model_dir;
  ParallelArgs parallel;
  std::string preset;
  int64_t layers = 0;
  std::string prefill = "1x2048,8x512,32x512";
  std::string decode = "1x128x128,32x128x128,128x128x128";
  int64_t first_token_prompt = 128;
  int64_t iters = 5;
  int64_t block_size = 16;
  bool json = false;
  std::string engine_levels = "auto";  // "auto": 1,8,64 on the CPU, none on CUDA
  // LoRA: each decode shape again with N random adapters over its sequences (0: off).
  std::string lora_adapters;  // "8,32": one run per count (empty: none)
  int64_t lora_rank = 16;
  std::string lora_modules = "all";
  std::string cuda_graphs = "on";  // on, off, or both (each decode shape without, then with)
  bool roofline = true;            // measure the card's copy bandwidth and GEMM rate first
  EngineBenchArgs engine;
};

// "1x2048,8x512" -> {{1, 2048}, {8, 512}} (each item `parts` numbers).
std::vector<std::vector<int64_t>> parse_shapes(const std::string& s, size_t parts,
                                               const char* what) {
  std::vector<std::vector<int64_t>> out;
  std::stringstream items(s);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    std::vector<int64_t> v;
    std::stringstream nums(item);
    std::string n;
    while (std::getline(nums, n, 'x')) {
      try {
        v.push_back(std::stoll(n));
      } catch (const std::exception&) {
        KESTREL_FAIL(what, ": \"", item, "\" is not a list of numbers separated by x");
      }
    }
    KESTREL_CHECK(
        v.size() == parts && std::all_of(v.begin(), v.end(), [](int64_t x) { return x > 0; }), what,
        ": \"", item, "\" needs ", parts, " positive numbers");
    out.push_back(v);
  }
  return out;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// n_seqs sequences in a fresh cache, each owning ceil(cap / block_size)
// consecutive blocks; batches of their next tokens.
class Workload {
 public:
  Workload(const FalconModel& model, int64_t n_seqs, int64_t cap, int64_t block_size)
      : model_(model),
        bs_(block_size),
        blocks_per_seq_((cap + block_size - 1) / block_size),
        cache_(model.make_kv_cache(n_seqs * blocks_per_seq_, block_size)),
        lens_(n_seqs, 0) {}

  // Every sequence appends n tokens (random ids, or `ids` [n_seqs] when n is 1).
  ForwardBatch batch(int64_t n, const std::vector<int32_t>* ids, std::mt19937& rng) {
    ForwardBatch b;
    b.adapters = adapters_;
    const int64_t n_seqs = static_cast<int64_t>(lens_.size());
    b.max_blocks = static_cast<int32_t>(blocks_per_seq_);
    b.cu_seqlens.push_back(0);
    const int32_t vocab = static_cast<int32_t>(model_.config().vocab_size);
    for (int64_t s = 0; s < n_seqs; ++s) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t pos = lens_[s] + j;
        b.input_ids.push_back(ids ? (*ids)[s] : static_cast<int32_t>(rng() % vocab));
        b.positions.push_back(static_cast<int32_t>(pos));
        b.slots.push_back((s * blocks_per_seq_ + pos / bs_) * bs_ + pos % bs_);
      }
      b.cu_seqlens.push_back(static_cast<int32_t>(b.input_ids.size()));
      b.kv_lens.push_back(static_cast<int32_t>(lens_[s] + n));
      b.lm_head_indices.push_back(static_cast<int32_t>(b.input_ids.size() - 1));
      for (int64_t i = 0; i < blocks_per_seq_; ++i)
        b.block_tables.push_back(static_cast<int32_t>(s * blocks_per_seq_ + i));
    }
    for (auto& l : lens_) l += n;
    return b;
  }
  void reset() { std::fill(lens_.begin(), lens_.end(), 0); }
  KvCache& cache() { return cache_; }
  // One adapter per sequence (empty: none), kept alive by the caller.
  void set_adapters(std::vector<const LoraAdapter*> a) { adapters_ = std::move(a); }

 private:
  const FalconModel& model_;
  int64_t bs_, blocks_per_seq_;
  KvCache cache_;
  std::vector<int64_t> lens_;
  std::vector<const LoraAdapter*> adapters_;
};

std::vector<LoraModule> parse_lora_modules(const std::string& text) {
  if (text == "all")
    return {LoraModule::kQkv, LoraModule::kDense, LoraModule::kFc1, LoraModule::kFc2};
  std::vector<LoraModule> out;
  std::stringstream ss(text);
  std::string name;
  while (std::getline(ss, name, ',')) {
    bool found = false;
    for (int m = 0; m < kLoraModules; ++m) {
      if (name == lora_module_name(static_cast<LoraModule>(m)) || (name == "qkv" && m == 0)) {
        out.push_back(static_cast<LoraModule>(m));
        found = true;
      }
    }
    KESTREL_CHECK(found, "--lora-modules: unknown module '", name,
                  "' (query_key_value or qkv, dense, dense_h_to_4h, dense_4h_to_h, or all)");
  }
  return out;
}

// Greedy next tokens of logits [n, vocab] on the model's device, as host ids.
std::vector<int32_t> sample(const Tensor& logits) {
  const int64_t n = logits.dim(0);
  Tensor ids = Tensor::empty(DType::kI32, {n}, logits.device());
  ops::argmax_rows(logits, ids);
  std::vector<int32_t> out(n);
  if (logits.device() == Device::kCpu) {
    std::copy(ids.data<int32_t>(), ids.data<int32_t>() + n, out.begin());
  } else {
    Tensor host = Tensor::borrow(out.data(), DType::kI32, {n});
    Tensor dev_view = ids;
#ifdef KESTREL_CUDA
    cuda::copy(dev_view, host);
#endif
  }
  return out;
}

struct Costs {
  double matmul_params = 0;  // per token, excluding the lm_head
  double lm_head_params = 0;
  double weight_bytes = 0;
  double kv_bytes_per_token = 0;   // all layers, K and V
  double attn_flops_per_pair = 0;  // per (query token, context token), all layers
};

// Bytes a decode step streams: the linears at `linear_bytes` a weight (2 for BF16, 1 for FP8),
// the lm_head at 2.
Costs model_costs(const FalconConfig& c, double linear_bytes) {
  Costs k;
  const double h = static_cast<double>(c.hidden_size);
  const double per_layer =
      h * c.qkv_out_dim() + h * c.n_heads * c.head_dim + 2.0 * h * c.ffn_hidden_size;
  k.matmul_params = per_layer * c.n_layers;
  k.lm_head_params = h * c.vocab_size;
  k.weight_bytes = linear_bytes * k.matmul_params + 2.0 * k.lm_head_params;
  k.kv_bytes_per_token = 2.0 * 2.0 * c.n_layers * c.n_kv_heads * c.head_dim;
  k.attn_flops_per_pair = 4.0 * c.n_heads * c.head_dim * c.n_layers;
  return k;
}

void run_bench(const BenchArgs& a) {
  const Device dev = a.device == "cuda"  ? Device::kCuda
                     : a.device == "cpu" ? Device::kCpu
                                         : throw Error("--device must be cuda or cpu");
  if (dev == Device::kCuda)
    KESTREL_CHECK(ops::cuda_device_count() > 0, "bench --device cuda: no CUDA device visible");
  KESTREL_CHECK(a.model_dir.empty() != a.preset.empty(), "give --model DIR or --preset NAME");
  // --nnodes: every process runs the same steps; rank 0 alone prints.
  if (a.parallel.nnodes > 1 && a.parallel.node_rank != 0)
    KESTREL_CHECK(std::freopen("/dev/null", "w", stdout) != nullptr, "cannot silence rank ",
                  a.parallel.node_rank);
  // Before the weights take the card's memory; what it allocates is freed again.
  const Roofline roof = a.roofline ? measure_roofline(dev) : Roofline{};
  // " (N% of what)" when the limit was measured, else nothing.
  auto share = [](double v, double limit, const char* what) {
    if (limit <= 0) return std::string();
    char buf[64];
    std::snprintf(buf, sizeof buf, " (%.0f%% of %s)", 100.0 * v / limit, what);
    return std::string(buf);
  };
  const double t_load = now_s();
  FalconModel model = [&] {
    if (!a.preset.empty()) {
      FalconConfig c = falcon_preset_config(a.preset);
      if (a.layers > 0) c.n_layers = a.layers;
      KESTREL_CHECK(a.parallel.tensor_parallel == 1 && a.parallel.nnodes == 1,
                    "bench --tensor-parallel / --nnodes need --model DIR (--preset draws one "
                    "rank's weights)");
      FalconModel m = FalconModel::random(c, dev, 1, weight_quant(a.parallel));
      apply_kv_cache_dtype(m, a.parallel);
      return m;
    }
    return load_model(a.model_dir, dev, a.parallel);
  }();
  ops::synchronize(dev);
  const double load_s = now_s() - t_load;
  const FalconConfig& c = model.config();
  const Costs costs = model_costs(c, dtype_size(model.linear_weight_dtype()) == 1 ? 1.0 : 2.0);
  int64_t n_params = 0;
  for (const WeightSpec& w : falcon_weight_specs(c, !c.tie_word_embeddings))
    n_params += shape_numel(w.shape);
  if (!a.json)
    std::printf(
        "model %s (%.2f B parameters, linears %s, %.2f GiB of weights) on %s, loaded in "
        "%.2f s\n",
        c.summary().c_str(), n_params / 1e9,
        std::string(dtype_name(model.linear_weight_dtype())).c_str(),
        model.weight_bytes() / 1073741824.0, ops::device_name(dev).c_str(), load_s);

  std::mt19937 rng(1234);
  nlohmann::json out;
  if (roof.copy_bytes_s > 0) {
    out["card"] = {{"copy_tb_s", roof.copy_bytes_s / 1e12},
                   {"gemm_tflops", roof.gemm_flops_s / 1e12},
                   {"gemm_n", roof.gemm_n}};
    if (!a.json)
      std::printf(
          "card: device copy %.2f TB/s (read + write), BF16 GEMM %lldx%lldx%lld %.0f TFLOP/s "
          "(measured now; the percentages below are of these)\n",
          roof.copy_bytes_s / 1e12, static_cast<long long>(roof.gemm_n),
          static_cast<long long>(roof.gemm_n), static_cast<long long>(roof.gemm_n),
          roof.gemm_flops_s / 1e12);
  }
  out["prefill"] = nlohmann::json::array();
  out["decode"] = nlohmann::json::array();
  const int64_t iters = std::max<int64_t>(1, a.iters);

  for (const auto& shape : parse_shapes(a.prefill, 2, "--prefill")) {
    const int64_t batch = shape[0], len = shape[1];
    Workload w(model, batch, len, a.block_size);
    std::vector<double> times;
    for (int64_t it = 0; it < iters + 1; ++it) {  // the first run warms up
      w.reset();
      ForwardBatch b = w.batch(len, nullptr, rng);
      ops::synchronize(dev);
      const double t0 = now_s();
      Tensor logits = model.forward_device(b, w.cache());
      ops::synchronize(dev);
      if (it > 0) times.push_back(now_s() - t0);
    }
    const double t = median(times);
    const double tokens = static_cast<double>(batch * len);
    const double flops = 2.0 * costs.matmul_params * tokens + 2.0 * costs.lm_head_params * batch +
                         costs.attn_flops_per_pair * batch * len * (len + 1) / 2.0;
    out["prefill"].push_back({{"batch", batch},
                              {"prompt", len},
                              {"tok_s", tokens / t},
                              {"ms", t * 1e3},
                              {"tflops", flops / t / 1e12}});
    if (roof.gemm_flops_s > 0) out["prefill"].back()["of_gemm"] = flops / t / roof.gemm_flops_s;
    if (!a.json)
      std::printf("prefill %4lldx%-5lld %10.0f tok/s  %8.2f ms  %6.1f TFLOP/s%s\n",
                  static_cast<long long>(batch), static_cast<long long>(len), tokens / t, t * 1e3,
                  flops / t / 1e12, share(flops / t, roof.gemm_flops_s, "the GEMM").c_str());
  }

  std::vector<int64_t> lora_counts;
  for (const auto& v : parse_shapes(a.lora_adapters, 1, "--lora-adapters"))
    lora_counts.push_back(v[0]);
  std::vector<std::shared_ptr<const LoraAdapter>> adapters;
  if (!lora_counts.empty()) {
    const std::vector<LoraModule> modules = parse_lora_modules(a.lora_modules);
    const int64_t most = *std::max_element(lora_counts.begin(), lora_counts.end());
    for (int64_t i = 0; i < most; ++i)
      adapters.push_back(
          model.random_adapter("bench-" + std::to_string(i), a.lora_rank, modules, 100 + i));
    if (!a.json)
      std::printf("lora: %lld random adapters of rank %lld on %s, %.1f MiB each\n",
                  static_cast<long long>(most), static_cast<long long>(a.lora_rank),
                  a.lora_modules.c_str(), adapters[0]->bytes() / 1048576.0);
  }

  for (const auto& shape : parse_shapes(a.decode, 3, "--decode")) {
    const int64_t batch = shape[0], prompt = shape[1], gen = shape[2];
    // n_adapters 0: the base model; else sequence s takes adapter s * n / batch (equal adapters
    // consecutive, as the engine orders them).
    auto run = [&](int64_t n_adapters, double base_tok_s, bool graphs) {
      model.set_cuda_graphs(graphs);
      const FalconModel::GraphStats g0 = model.graph_stats();
      Workload w(model, batch, prompt + gen, a.block_size);
      if (n_adapters > 0) {
        std::vector<const LoraAdapter*> per_seq;
        for (int64_t s = 0; s < batch; ++s)
          per_seq.push_back(adapters[static_cast<size_t>(s * n_adapters / batch)].get());
        w.set_adapters(std::move(per_seq));
      }
      std::vector<double> runs, comm_runs;
      for (int64_t it = 0; it < std::min<int64_t>(iters, 3) + 1; ++it) {
        w.reset();
        ForwardBatch b = w.batch(prompt, nullptr, rng);
        std::vector<int32_t> next = sample(model.forward_device(b, w.cache()));
        ops::synchronize(dev);
        const double t0 = now_s(), comm0 = model.collective_seconds();
        for (int64_t g = 1; g < gen; ++g) {
          ForwardBatch step = w.batch(1, &next, rng);
          next = sample(model.forward_device(step, w.cache()));
        }
        ops::synchronize(dev);
        if (it > 0) {
          runs.push_back(now_s() - t0);
          comm_runs.push_back(model.collective_seconds() - comm0);
        }
      }
      // The last step again, enqueued gen - 1 times back to back with its argmax and no
      // read-back: the step's time once the host's work (building the batch, reading the ids)
      // overlaps the device's, which the measured loop above does not do.
      double queued_s = 0;
      if (dev != Device::kCpu && gen > 1) {
        const std::vector<int32_t> last(static_cast<size_t>(batch), 0);
        ForwardBatch step = w.batch(1, &last, rng);
        Tensor ids = Tensor::empty(DType::kI32, {batch}, dev);
        for (int it = 0; it < 2; ++it) {
          ops::synchronize(dev);
          const double q0 = now_s();
          for (int64_t g = 1; g < gen; ++g)
            ops::argmax_rows(model.forward_device(step, w.cache()), ids);
          ops::synchronize(dev);
          queued_s = (now_s() - q0) / static_cast<double>(gen - 1);
        }
      }
      const double t = median(runs);
      const double comm_ms = median(comm_runs) / static_cast<double>(gen - 1) * 1e3;
      const double steps = static_cast<double>(gen - 1);
      const double step_s = t / steps;
      const double tok_s = batch * steps / t;
      const double avg_ctx = prompt + gen / 2.0;
      const double bytes = costs.weight_bytes + batch * avg_ctx * costs.kv_bytes_per_token;
      nlohmann::json row = {{"batch", batch},
                            {"prompt", prompt},
                            {"new", gen},
                            {"tok_s", tok_s},
                            {"ms_per_step", step_s * 1e3},
                            {"bandwidth_tb_s", bytes / step_s / 1e12},
                            {"collective_ms_per_step", comm_ms},
                            {"queued_ms_per_step", queued_s * 1e3},
                            {"cuda_graphs", model.cuda_graphs()}};
      // The weight-read bound: batch tokens a step, a step no shorter than reading the weights
      // once at the card's copy rate (the KV cache and activations come on top).
      const double bound_tok_s =
          roof.copy_bytes_s > 0 ? batch * roof.copy_bytes_s / costs.weight_bytes : 0.0;
      if (bound_tok_s > 0) {
        row["of_copy"] = bytes / step_s / roof.copy_bytes_s;
        row["weight_bound_tok_s"] = bound_tok_s;
        row["of_weight_bound"] = tok_s / bound_tok_s;
      }
      const FalconModel::GraphStats g1 = model.graph_stats();
      const int64_t replays = g1.replays - g0.replays, captures = g1.captures - g0.captures;
      if (model.cuda_graphs()) {
        row["graph_replays"] = replays;
        row["graph_captures"] = captures;
        row["graph_pool_mib"] = static_cast<double>(g1.pool_bytes) / 1048576.0;
      }
      if (n_adapters > 0) {
        row["lora_adapters"] = n_adapters;
        row["lora_rank"] = a.lora_rank;
        row["ratio_to_base"] = tok_s / base_tok_s;
      }
      // The "decode" rows stay one per shape; LoRA runs go to their own list.
      // With --cuda-graphs both, "decode" holds the graph rows and "decode_no_graphs" the eager.
      const bool eager_of_both = a.cuda_graphs == "both" && !graphs;
      out[n_adapters > 0  ? "lora_decode"
          : eager_of_both ? "decode_no_graphs"
                          : "decode"]
          .push_back(row);
      if (!a.json && n_adapters == 0)
        std::printf("decode  %4lldx%lldx%-4lld %10.0f tok/s  %8.3f ms/step  %5.2f TB/s%s%s%s\n",
                    static_cast<long long>(batch), static_cast<long long>(prompt),
                    static_cast<long long>(gen), tok_s, step_s * 1e3, bytes / step_s / 1e12,
                    share(bytes / step_s, roof.copy_bytes_s, "copy").c_str(),
                    share(tok_s, bound_tok_s, "the weight-read bound").c_str(),
                    !model.cuda_graphs() ? "  (graphs off)"
                    : replays > 0        ? "  (graphs on)"
                                         : "  (graphs on, none replayed)");
      if (!a.json && queued_s > 0)
        std::printf("        queued back to back (no read-back): %.3f ms/step, %.0f tok/s\n",
                    queued_s * 1e3, batch / queued_s);
      if (!a.json && n_adapters == 0 && model.cuda_graphs())
        std::printf(
            "        graphs: %lld captured, %lld replays, pool %.1f MiB%s\n",
            static_cast<long long>(captures), static_cast<long long>(replays),
            static_cast<double>(g1.pool_bytes) / 1048576.0,
            a.cuda_graphs == "both" && base_tok_s > 0
                ? (", " + std::to_string(tok_s / base_tok_s).substr(0, 4) + "x eager").c_str()
                : "");
      if (!a.json && n_adapters > 0)
        std::printf(
            "  + %3lld LoRA adapters  %10.0f tok/s  %8.3f ms/step  %.2f of the base rate%s\n",
            static_cast<long long>(n_adapters), tok_s, step_s * 1e3, tok_s / base_tok_s,
            !model.cuda_graphs() ? "  (graphs off)"
            : replays > 0        ? ("  (graphs on, " + std::to_string(replays) + " replays, " +
                             std::to_string(captures) + " captures)")
                                .c_str()
                          : "  (graphs on, none replayed)");
      if (!a.json && model.tensor_parallel() > 1)
        std::printf("        collectives %.3f ms/step (%.0f%% of the step)\n", comm_ms,
                    100.0 * comm_ms / (step_s * 1e3));
      return tok_s;
    };
    const bool graphs = a.cuda_graphs != "off";
    const double eager = a.cuda_graphs == "both" ? run(0, 0.0, false) : 0.0;
    const double base = run(0, eager, graphs);
    // Counts above the batch run once, at one adapter per sequence; with --cuda-graphs both,
    // eagerly (against the eager base), then with graphs.
    int64_t last = 0;
    for (int64_t n : lora_counts) {
      if (std::min(n, batch) == last) continue;
      last = std::min(n, batch);
      if (a.cuda_graphs == "both") run(last, eager, false);
      run(last, base, graphs);
    }
    model.set_cuda_graphs(graphs);
  }

  if (a.first_token_prompt > 0) {
    Workload w(model, 1, a.first_token_prompt + 1, a.block_size);
    std::vector<double> times;
    for (int64_t it = 0; it < iters + 1; ++it) {
      w.reset();
      ForwardBatch b = w.batch(a.first_token_prompt, nullptr, rng);
      ops::synchronize(dev);
      const double t0 = now_s();
      std::vector<int32_t> first = sample(model.forward_device(b, w.cache()));
      if (it > 0) times.push_back(now_s() - t0);
    }
    out["first_token_ms"] = median(times) * 1e3;
    if (!a.json)
      std::printf("first token, %lld-token prompt: %.2f ms\n",
                  static_cast<long long>(a.first_token_prompt), median(times) * 1e3);
  }
#ifdef KESTREL_CUDA
  if (dev == Device::kCuda) {
    const cuda::MemoryStats m = cuda::memory_stats();
    out["memory_peak_gib"] = static_cast<double>(m.peak_in_use) / (1 << 30);
    if (!a.json)
      std::printf("device memory: peak %.2f GiB in use, %.2f GiB reserved\n",
                  static_cast<double>(m.peak_in_use) / (1 << 30),
                  static_cast<double>(m.reserved) / (1 << 30));
  }
#endif
  EngineBenchArgs e = a.engine;
  e.concurrency = a.engine_levels != "auto" ? a.engine_levels : dev == Device::kCpu ? "1,8,64" : "";
  e.block_size = a.block_size;
  if (!e.concurrency.empty()) out["engine"] = run_engine_bench(model, e, a.json);
  if (a.json) std::cout << out.dump() << "\n";
}

}  // namespace

void add_bench_command(CLI::App& app) {
  static BenchArgs a;
  CLI::App* cmd = app.add_subcommand("bench", "prefill / decode throughput on one device");
  cmd->add_option("--device", a.device, "cuda or cpu")->capture_default_str();
  add_parallel_options(cmd, a.parallel, /*processes=*/true);
  auto* model = cmd->add_option("--model", a.model_dir, "model folder");
  auto* preset = cmd->add_option("--preset", a.preset,
                                 "random weights on the device: falcon-7b, falcon-40b, "
                                 "falcon-180b, falcon2-11b, falcon-rw-1b or tiny");
  model->excludes(preset);
  cmd->add_option("--layers", a.layers, "override the preset's layer count");
  cmd->add_option("--prefill", a.prefill, "BxL,...: B prompts of L tokens in one step")
      ->capture_default_str();
  cmd->add_option("--decode", a.decode, "BxPxG,...: B sequences, P-token prompts, G new tokens")
      ->capture_default_str();
  cmd->add_option("--first-token-prompt", a.first_token_prompt,
                  "prompt length for the first-token time (0: skip)")
      ->capture_default_str();
  cmd->add_option("--iters", a.iters, "timed repetitions (median reported)")->capture_default_str();
  cmd->add_option("--block-size", a.block_size, "KV cache block size")->capture_default_str();
  cmd->add_option("--engine-concurrency", a.engine_levels,
                  "engine benchmark: requests in flight per run, C1,C2,... (auto: 1,8,64 on the "
                  "CPU, none on CUDA; empty: skip)")
      ->capture_default_str();
  cmd->add_option("--engine-prompt", a.engine.prompt, "engine benchmark: prompt tokens")
      ->capture_default_str();
  cmd->add_option("--engine-new", a.engine.new_tokens, "engine benchmark: new tokens per request")
      ->capture_default_str();
  cmd->add_option("--engine-requests", a.engine.requests,
                  "engine benchmark: requests per run (0: max(4 x concurrency, 16))")
      ->capture_default_str();
  cmd->add_option("--lora-adapters", a.lora_adapters,
                  "N,...: each decode shape again with N random LoRA adapters over its sequences")
      ->capture_default_str();
  cmd->add_option("--lora-rank", a.lora_rank, "rank of the random adapters")->capture_default_str();
  cmd->add_option("--lora-modules", a.lora_modules,
                  "all, or a list of query_key_value, dense, dense_h_to_4h, dense_4h_to_h")
      ->capture_default_str();
  cmd->add_option("--cuda-graphs", a.cuda_graphs,
                  "on, off, or both: decode steps as CUDA graphs (both: each decode shape "
                  "without, then with; JSON decode_no_graphs holds the former)")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
  cmd->add_flag("--json", a.json, "print only the JSON result");
  cmd->add_flag("!--no-roofline", a.roofline,
                "skip measuring the card's copy bandwidth and GEMM rate before the model loads");
  cmd->callback([] { run_bench(a); });
}

}  // namespace kestrel::cli
