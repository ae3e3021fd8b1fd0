// Falcon's forward pass: embedding, then per layer
//   ln -> query_key_value -> split + rotary -> KV write -> paged attention -> dense
//   parallel:   x += dense(attn) + mlp(ln or ln_mlp)
//   sequential: x += dense(attn); x += mlp(post_attention_layernorm(x))
// then ln_f and the lm_head on the selected rows.
#include "model/falcon_model.h"

#include <chrono>
#include <cmath>
#include <map>

#include "backend/ops.h"
#include "core/error.h"
#include "core/logging.h"
#include "io/quant_config.h"
#include "io/safetensors.h"
#include "model/alibi.h"
#include "model/decode_graphs.h"
#include "model/falcon_lora.h"
#include "model/falcon_weights.h"

namespace kestrel {
namespace {

Tensor host_tensor(const std::vector<int32_t>& v, Shape shape) {
  return Tensor::borrow(const_cast<int32_t*>(v.data()), DType::kI32, std::move(shape));
}

Tensor host_tensor(const std::vector<int64_t>& v, Shape shape) {
  return Tensor::borrow(const_cast<int64_t*>(v.data()), DType::kI64, std::move(shape));
}

Tensor host_tensor(const std::vector<float>& v, Shape shape) {
  return Tensor::borrow(const_cast<float*>(v.data()), DType::kF32, std::move(shape));
}

}  // namespace

FalconModel FalconModel::load(const std::string& dir, Device device, int tensor_parallel,
                              const WeightQuant& quant) {
  const CheckpointQuant ckpt = checkpoint_quant_of(dir);  // refuses what it cannot read
  if (!ckpt.method.empty())
    spdlog::info("checkpoint quantization: {} (FP8 E4M3 weights read as they are{})", ckpt.method,
                 ckpt.static_input_scales
                     ? "; its static input scales are not used: activations are scaled per token"
                     : "");
  if (tensor_parallel != 1) return load_parallel(dir, device, tensor_parallel, quant);
  FalconConfig config = FalconConfig::from_model_dir(dir);
  WeightStore store = WeightStore::open_folder(dir);
  return from_store(config, store, device, quant);
}

FalconModel FalconModel::from_store(const FalconConfig& config, const WeightStore& store,
                                    Device device, const WeightQuant& quant) {
  const bool has_lm_head = store.contains("lm_head.weight");
  KESTREL_CHECK(has_lm_head || config.tie_word_embeddings,
                "config says tie_word_embeddings: false but the checkpoint has no lm_head.weight");
  std::vector<WeightSpec> specs = falcon_weight_specs(config, has_lm_head);

  // Validate every name and shape before converting anything.
  for (const WeightSpec& s : specs) store.get(s.name, s.shape);
  size_t known = specs.size();
  for (const std::string& name : store.names())
    known += name.ends_with(".weight_scale") || name.ends_with(".input_scale");
  if (store.names().size() > known) {
    spdlog::warn("checkpoint holds {} tensors the config does not use (ignored)",
                 store.names().size() - known);
  }
  // A pre-quantized linear: its E4M3 codes as they are and its scales, checked.
  auto load_fp8 = [&](const std::string& name, Tensor& q, Tensor& scale) {
    const TensorInfo& info = store.get(name);
    if (!is_fp8(info.dtype)) {
      if (!quant.fp8) return false;
      // --quantize fp8 from the checkpoint's own values: an F32 / F16 weight is not rounded to
      // BF16 first on CUDA (that would round twice, and the codes would not be the CPU's).
      const DType wide = info.dtype == DType::kBF16 ? ops::weight_dtype(device) : DType::kF32;
      ops::quantize_fp8(ops::upload_weight(info.data, info.dtype, info.shape, wide, device), q,
                        scale);
      return true;
    }
    const Tensor host = fp8_weight_scales(store, name);
    q = ops::upload_weight(info.data, info.dtype, info.shape, info.dtype, device);
    scale = ops::to_device(host, device);
    return true;
  };
  const DType dtype = ops::weight_dtype(device);
  int64_t total_bytes = 0, done_bytes = 0, done = 0, next_report = 1;
  for (const WeightSpec& s : specs) total_bytes += static_cast<int64_t>(store.get(s.name).nbytes);
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  spdlog::info("loading {} tensors ({:.2f} GiB) to {}", specs.size(), total_bytes / 1073741824.0,
               device == Device::kCuda ? "cuda" : "cpu");
  FalconModel m = build(
      config, device, has_lm_head,
      [&](const std::string& name) {
        const TensorInfo& info = store.get(name);
        if (is_fp8(info.dtype))
          KESTREL_FAIL("tensor ", name, " is ", dtype_name(info.dtype),
                       ": only the linears (query_key_value, dense, dense_h_to_4h, "
                       "dense_4h_to_h) may be FP8");
        Tensor t = ops::upload_weight(info.data, info.dtype, info.shape, dtype, device);
        done_bytes += static_cast<int64_t>(info.nbytes);
        ++done;
        spdlog::debug("loaded {} {} ({} of {})", name, shape_str(info.shape), done, specs.size());
        // A progress line at every tenth of the bytes.
        if (total_bytes > 0 && done_bytes * 10 >= next_report * total_bytes) {
          while (done_bytes * 10 >= next_report * total_bytes) ++next_report;
          spdlog::info("load {:3d}%: {} of {} tensors, {:.2f} of {:.2f} GiB, {:.1f} s",
                       static_cast<int>(done_bytes * 100 / total_bytes), done, specs.size(),
                       done_bytes / 1073741824.0, total_bytes / 1073741824.0, seconds());
        }
        return t;
      },
      quant, load_fp8);
  ops::synchronize(device);
  const double secs = seconds();
  spdlog::info("loaded {:.2f} GiB of weights in {:.2f} s ({:.2f} GB/s)", total_bytes / 1073741824.0,
               secs, secs > 0 ? total_bytes / secs / 1e9 : 0.0);
  spdlog::info("weights: linears {}, the rest {}; {} bytes ({:.3f} GiB) on {}",
               dtype_name(m.linear_weight_dtype()), dtype_name(m.act_dtype()), m.weight_bytes(),
               m.weight_bytes() / 1073741824.0, device == Device::kCuda ? "cuda" : "cpu");
  return m;
}

FalconModel FalconModel::random(const FalconConfig& config, Device device, uint64_t seed,
                                const WeightQuant& quant) {
  const bool has_lm_head = !config.tie_word_embeddings;
  std::map<std::string, Shape> shapes;
  for (const WeightSpec& w : falcon_weight_specs(config, has_lm_head)) shapes[w.name] = w.shape;
  const DType dtype = ops::weight_dtype(device);
  uint64_t n = 0;
  return build(
      config, device, has_lm_head,
      [&](const std::string& name) {
        // As random-model draws them: norms 1 (weights) / 0 (biases), linears U(+-0.02 sqrt 3).
        const bool is_norm =
            name.find("ln") != std::string::npos || name.find("layernorm") != std::string::npos;
        const bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
        const float constant = is_norm && !is_bias ? 1.0f : 0.0f;
        const float amp = is_norm || is_bias ? 0.0f : 0.02f * std::sqrt(3.0f);
        return ops::random_uniform(shapes.at(name), dtype, device,
                                   seed * 0x9e3779b97f4a7c15ull + ++n, amp, constant);
      },
      quant);
}

FalconModel FalconModel::build(const FalconConfig& config, Device device, bool has_lm_head,
                               const std::function<Tensor(const std::string&)>& load,
                               const WeightQuant& quant, const LoadFp8& load_fp8) {
  FalconModel m;
  m.config_ = config;
  m.device_ = device;
  m.act_dtype_ = ops::weight_dtype(device);
  m.quant_ = quant;
  // A linear's weight as loaded, or with --quantize fp8 its FP8 codes (the loaded tensor is
  // dropped as soon as it is converted: one tensor at a time is held at full width).
  auto linear_w = [&](const std::string& name, Tensor& scale) {
    Tensor q;
    if (load_fp8 && load_fp8(name, q, scale)) {
      m.quant_.fp8 = true;  // a pre-quantized checkpoint is FP8 with or without --quantize
      return q;
    }
    Tensor w = load(name);
    if (!quant.fp8) return w;
    ops::quantize_fp8(w, q, scale);
    return q;
  };
  if (device == Device::kCuda) m.graphs_ = std::make_shared<DecodeGraphs>();
  auto load_opt = [&](const std::string& name) { return config.bias ? load(name) : Tensor(); };

  m.word_embeddings_ = load("transformer.word_embeddings.weight");
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::string p = layer_prefix(l);
    FalconLayerWeights w;
    const std::string ln1 = config.two_layer_norms() ? "ln_attn" : "input_layernorm";
    w.ln_attn_w = load(p + ln1 + ".weight");
    w.ln_attn_b = load(p + ln1 + ".bias");
    if (config.two_layer_norms()) {
      w.ln_mlp_w = load(p + "ln_mlp.weight");
      w.ln_mlp_b = load(p + "ln_mlp.bias");
    } else if (!config.parallel_attn) {
      w.ln_mlp_w = load(p + "post_attention_layernorm.weight");
      w.ln_mlp_b = load(p + "post_attention_layernorm.bias");
    }
    w.qkv_w = linear_w(p + "self_attention.query_key_value.weight", w.qkv_s);
    w.qkv_b = load_opt(p + "self_attention.query_key_value.bias");
    w.dense_w = linear_w(p + "self_attention.dense.weight", w.dense_s);
    w.dense_b = load_opt(p + "self_attention.dense.bias");
    w.fc1_w = linear_w(p + "mlp.dense_h_to_4h.weight", w.fc1_s);
    w.fc1_b = load_opt(p + "mlp.dense_h_to_4h.bias");
    w.fc2_w = linear_w(p + "mlp.dense_4h_to_h.weight", w.fc2_s);
    w.fc2_b = load_opt(p + "mlp.dense_4h_to_h.bias");
    m.layers_.push_back(std::move(w));
  }
  m.ln_f_w_ = load("transformer.ln_f.weight");
  m.ln_f_b_ = load("transformer.ln_f.bias");
  m.lm_head_ = has_lm_head ? load("lm_head.weight") : m.word_embeddings_;
  if (config.alibi) {
    // A tensor-parallel rank's config holds its own heads: the slopes of its range.
    const int64_t total = config.tp_total_heads > 0 ? config.tp_total_heads : config.n_heads;
    const int64_t left = total - config.tp_first_head;  // global heads from the first on
    const int64_t own = left < config.n_heads ? left : config.n_heads;
    std::vector<float> slopes = alibi_slopes(total, config.tp_first_head, own);
    slopes.resize(config.n_heads, 0.0f);  // padding heads (split GQA groups) add nothing
    m.set_alibi_slopes(slopes);
  }
  return m;
}

void FalconModel::set_kv_cache_dtype(DType dtype) {
  if (dtype != act_dtype_ && dtype != DType::kF8E4M3)
    KESTREL_FAIL("--kv-cache-dtype: ", dtype_name(dtype), " is not a KV cache dtype (",
                 dtype_name(act_dtype_), " or F8_E4M3)");
  kv_fp8_ = dtype == DType::kF8E4M3;  // a tensor-parallel model's shards follow it
}

DType FalconModel::linear_weight_dtype() const {
  return quant_.fp8 ? DType::kF8E4M3 : act_dtype_;
}

void FalconModel::set_alibi_slopes(const std::vector<float>& slopes) {
  KESTREL_CHECK(config_.alibi, "set_alibi_slopes: the model's config has no alibi");
  KESTREL_CHECK(static_cast<int64_t>(slopes.size()) == config_.n_heads,
                "set_alibi_slopes: ", slopes.size(), " slopes for ", config_.n_heads,
                " query heads");
  Tensor host = Tensor::empty(DType::kF32, {config_.n_heads});
  std::copy(slopes.begin(), slopes.end(), host.data<float>());
  alibi_slopes_ = ops::to_device(host, device_);
}

KvCache FalconModel::make_kv_cache(int64_t num_blocks, int64_t block_size) const {
  if (group_) return make_group_kv_cache(num_blocks, block_size);
  KvCacheShape shape{config_.n_layers, num_blocks, block_size, config_.n_kv_heads,
                     config_.head_dim};
  return KvCache(shape, kv_cache_dtype(), device_);
}

void FalconModel::check_batch(const ForwardBatch& b, const KvCache& cache) const {
  const int64_t n_tokens = b.n_tokens(), n_seqs = b.n_seqs();
  KESTREL_CHECK(n_tokens > 0 && n_seqs > 0, "forward: empty batch");
  KESTREL_CHECK(static_cast<int64_t>(b.positions.size()) == n_tokens &&
                    static_cast<int64_t>(b.slots.size()) == n_tokens,
                "forward: ", n_tokens, " input_ids but ", b.positions.size(), " positions and ",
                b.slots.size(), " slots");
  KESTREL_CHECK(static_cast<int64_t>(b.cu_seqlens.size()) == n_seqs + 1 &&
                    b.cu_seqlens.front() == 0 && b.cu_seqlens.back() == n_tokens,
                "forward: cu_seqlens must run from 0 to ", n_tokens, " over ", n_seqs,
                " sequences");
  KESTREL_CHECK(
      b.max_blocks > 0 && static_cast<int64_t>(b.block_tables.size()) == n_seqs * b.max_blocks,
      "forward: block_tables has ", b.block_tables.size(), " entries, expected ", n_seqs, " x ",
      b.max_blocks);
  for (int32_t i : b.lm_head_indices) {
    KESTREL_CHECK(i >= 0 && i < n_tokens, "forward: lm_head index ", i, " outside [0, ", n_tokens,
                  ")");
  }
  for (int64_t s = 0; s < n_seqs; ++s) {
    KESTREL_CHECK(b.cu_seqlens[s + 1] >= b.cu_seqlens[s], "forward: cu_seqlens decreases at ", s);
    KESTREL_CHECK(b.kv_lens[s] <= b.max_blocks * cache.block_size(), "forward: sequence ", s,
                  " has kv_len ", b.kv_lens[s], " beyond its ", b.max_blocks, " blocks");
  }
  check_lora_batch(b, tp_.size, config_.n_layers);
}

// cos/sin [n_tokens, head_dim / 2] of NeoX rotary, as transformers computes
// them (inv_freq = theta^(-2i/d)). Linear scaling divides positions by the
// factor; dynamic NTK rescales the base per sequence once its length passes
// max_position_embeddings (transformers does it per batch: see docs/model.md).
void FalconModel::rope_tables(const ForwardBatch& b, std::vector<float>& cos,
                              std::vector<float>& sin) const {
  const int64_t d = config_.head_dim, half = d / 2;
  cos.resize(b.n_tokens() * half);
  sin.resize(b.n_tokens() * half);
  const RopeScaling& rs = config_.rope_scaling;
  std::vector<float> inv_freq(half);
  for (int64_t s = 0; s < b.n_seqs(); ++s) {
    double base = config_.rope_theta;
    const double seq_len = b.kv_lens[s];
    if (rs.kind == RopeScalingKind::kDynamic && seq_len > config_.max_position_embeddings) {
      base *= std::pow(rs.factor * seq_len / config_.max_position_embeddings - (rs.factor - 1),
                       static_cast<double>(d) / (d - 2));
    }
    for (int64_t i = 0; i < half; ++i) {
      inv_freq[i] = static_cast<float>(1.0 / std::pow(base, static_cast<double>(2 * i) / d));
    }
    for (int32_t t = b.cu_seqlens[s]; t < b.cu_seqlens[s + 1]; ++t) {
      float pos = static_cast<float>(b.positions[t]);
      if (rs.kind == RopeScalingKind::kLinear) pos /= static_cast<float>(rs.factor);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];  // fp32 product, as torch
        cos[t * half + i] = std::cos(angle);
        sin[t * half + i] = std::sin(angle);
      }
    }
  }
}

Tensor FalconModel::forward(const ForwardBatch& b, KvCache& cache) const {
  return ops::to_host_f32(forward_device(b, cache));
}

Tensor FalconModel::forward_device(const ForwardBatch& b, KvCache& cache) const {
  if (group_) return forward_group(b, cache);
  check_batch(b, cache);
  if (graphs_ && cuda_graphs_ && DecodeGraphs::eligible(*this, b))
    return graphs_->run(*this, b, cache);
  const FalconConfig& c = config_;
  const int64_t n_tokens = b.n_tokens(), n_seqs = b.n_seqs();
  const int64_t d = c.head_dim;
  const Device dev = device_;

  std::vector<float> cos_h, sin_h;
  if (!c.alibi) rope_tables(b, cos_h, sin_h);
  int32_t max_kv_len = 0, max_q_len = 0;
  for (int32_t len : b.kv_lens) max_kv_len = std::max(max_kv_len, len);
  for (int64_t s = 0; s < n_seqs; ++s)
    max_q_len = std::max(max_q_len, b.cu_seqlens[s + 1] - b.cu_seqlens[s]);

  StepTensors in;
  in.skip_lm_head = b.skip_lm_head;
  in.ids = ops::to_device(host_tensor(b.input_ids, {n_tokens}), dev);
  in.slots = ops::to_device(host_tensor(b.slots, {n_tokens}), dev);
  in.cu_q = ops::to_device(host_tensor(b.cu_seqlens, {n_seqs + 1}), dev);
  in.kv_lens = ops::to_device(host_tensor(b.kv_lens, {n_seqs}), dev);
  in.tables = ops::to_device(host_tensor(b.block_tables, {n_seqs, b.max_blocks}), dev);
  // ALiBi models: no rotary (undefined tables); attention adds the slopes' bias.
  if (!c.alibi) {
    in.cos = ops::to_device(host_tensor(cos_h, {n_tokens, d / 2}), dev);
    in.sin = ops::to_device(host_tensor(sin_h, {n_tokens, d / 2}), dev);
  }
  if (!b.lm_head_indices.empty()) {
    const int64_t n_out = static_cast<int64_t>(b.lm_head_indices.size());
    in.lm_rows = ops::to_device(host_tensor(b.lm_head_indices, {n_out}), dev);
  }
  const LoraPlan lora(b, tp_.rank, c.n_layers);  // this rank's LoRA segments (falcon_lora.cpp)
  return forward_layers(b, in, max_kv_len, max_q_len, lora, cache);
}

// The kernels of one step over inputs already on the device (a decode graph captures this).
// b is read only for the sharded embedding of a tensor-parallel rank.
Tensor FalconModel::forward_layers(const ForwardBatch& b, const StepTensors& in, int32_t max_kv_len,
                                   int32_t max_q_len, const LoraPlan& lora, KvCache& cache) const {
  const FalconConfig& c = config_;
  const int64_t n_tokens = in.ids.dim(0);
  const int64_t hidden = c.hidden_size, d = c.head_dim;
  const Device dev = device_;
  const DType act = act_dtype_;
  auto empty = [&](Shape s) { return Tensor::empty(act, std::move(s), dev); };
  const Tensor &ids = in.ids, &slots = in.slots, &cu_q = in.cu_q, &kv_lens = in.kv_lens;
  const Tensor &tables = in.tables, &cos = in.cos, &sin = in.sin;

  Tensor x = empty({n_tokens, hidden});
  if (tp_.comm) {
    embed_sharded(b, x);  // masked lookup of the rank's vocabulary rows + all-reduce
  } else {
    ops::embedding(ids, word_embeddings_, x);
  }
  Tensor ln_a = empty({n_tokens, hidden});
  Tensor ln_m = c.parallel_attn && !c.two_layer_norms() ? Tensor() : empty({n_tokens, hidden});
  Tensor qkv = empty({n_tokens, c.qkv_out_dim()});
  Tensor q = empty({n_tokens, c.n_heads, d});
  Tensor k = empty({n_tokens, c.n_kv_heads, d});
  Tensor v = empty({n_tokens, c.n_kv_heads, d});
  Tensor attn = empty({n_tokens, c.n_heads, d});
  Tensor attn_out = empty({n_tokens, hidden});
  Tensor ffn = empty({n_tokens, c.ffn_hidden_size});
  Tensor mlp_out = empty({n_tokens, hidden});
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  const float eps = static_cast<float>(c.layer_norm_epsilon);

  // A linear's epilogue with its FP8 scales (none for weights at full width).
  auto fp8 = [this](const Tensor& scale, ops::LinearEpilogue e = {}) {
    if (scale.defined()) {
      e.weight_scale = &scale;
      e.fp8_activations = quant_.fp8_activations;
    }
    return e;
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const FalconLayerWeights& w = layers_[l];
    // qkv and fc1 + GELU of one LayerNorm's output in one linear_pair (one GEMV launch for a
    // decode step of 1-2 sequences, which can take the LayerNorm too: ops::PairNorm) unless an
    // adapter's fc1 delta must land before GELU. ln_a is then read by nothing after the pair.
    const bool pair = c.parallel_attn && !c.two_layer_norms() && lora.empty() &&
                      !w.qkv_s.defined() && !w.fc1_s.defined();
    if (pair) {
      ops::linear_pair(x, w.qkv_w, w.qkv_b, qkv, w.fc1_w, w.fc1_b, ffn, /*gelu2=*/true,
                       {&w.ln_attn_w, &w.ln_attn_b, eps, &ln_a});
    } else {
      ops::layer_norm(x, w.ln_attn_w, w.ln_attn_b, eps, ln_a);
      ops::linear(ln_a, w.qkv_w, w.qkv_b, qkv, fp8(w.qkv_s));
    }
    lora.add(l, LoraModule::kQkv, ln_a, qkv);
    ops::qkv_rotary_kv_write(qkv, cos, sin, slots, q, k, v, cache.k(l), cache.v(l));
    ops::paged_attention(q, cache.k(l), cache.v(l), tables, cu_q, kv_lens, max_kv_len, scale, attn,
                         max_q_len, alibi_slopes_);
    const Tensor attn_flat = attn.view({n_tokens, c.n_heads * d});
    // GELU in fc1's epilogue unless an adapter's delta must land before it.
    const bool fuse_gelu = lora.empty();
    auto fc1_gelu = [&](const Tensor& mlp_in) {
      if (pair) return;  // (with qkv, above)
      ops::linear(mlp_in, w.fc1_w, w.fc1_b, ffn, fp8(w.fc1_s, {.gelu = fuse_gelu}));
      if (!fuse_gelu) {
        lora.add(l, LoraModule::kFc1, mlp_in, ffn);
        ops::gelu(ffn);
      }
    };
    const ops::LinearEpilogue into_x{.accumulate = true};  // residual adds: x += linear(...)
    const Tensor& mlp_in = c.two_layer_norms() ? ln_m : ln_a;
    if (c.parallel_attn && !tp_.comm && lora.empty() && !w.dense_s.defined() &&
        !w.fc2_s.defined()) {
      // x += fc2(gelu(fc1(ln))) + dense(attn): one linear of two products (one kernel where the
      // GEMV or the decode GEMM takes the rows: dense's weights streamed right before fc2's).
      if (c.two_layer_norms()) ops::layer_norm(x, w.ln_mlp_w, w.ln_mlp_b, eps, ln_m);
      fc1_gelu(mlp_in);
      ops::linear(ffn, w.fc2_w, w.fc2_b, x,
                  {.accumulate = true, .plus = {&attn_flat, &w.dense_w, &w.dense_b}});
    } else if (c.parallel_attn && !tp_.comm) {
      // x += attn_out + fc2(gelu(fc1(ln))) in fc2's epilogue, rounded once as the 3-way add was
      // (attn_out = x + dense first, then x = attn_out + fc2 through cuBLASLt's C, saved the
      // add's pass but rounded twice: lora-falcon40b-gqa's graphs went to 0.022 of the CPU's
      // logits against the 0.02 bound). Adapters' deltas land on dense's output.
      ops::linear(attn_flat, w.dense_w, w.dense_b, attn_out, fp8(w.dense_s));
      lora.add(l, LoraModule::kDense, attn_flat, attn_out);
      if (c.two_layer_norms()) ops::layer_norm(x, w.ln_mlp_w, w.ln_mlp_b, eps, ln_m);
      fc1_gelu(mlp_in);
      ops::linear(ffn, w.fc2_w, w.fc2_b, x,
                  fp8(w.fc2_s, {.accumulate = true, .addend = &attn_out}));
      lora.add(l, LoraModule::kFc2, ffn, x);
    } else if (c.parallel_attn) {  // row-parallel partial sums: ONE all-reduce for both
      ops::linear(attn_flat, w.dense_w, w.dense_b, attn_out, fp8(w.dense_s));
      lora.add(l, LoraModule::kDense, attn_flat, attn_out);
      if (c.two_layer_norms()) ops::layer_norm(x, w.ln_mlp_w, w.ln_mlp_b, eps, ln_m);
      fc1_gelu(mlp_in);
      ops::linear(ffn, w.fc2_w, w.fc2_b, mlp_out, fp8(w.fc2_s));
      lora.add(l, LoraModule::kFc2, ffn, mlp_out);
      ops::add(attn_out, mlp_out, Tensor(), attn_out);
      all_reduce(attn_out);
      ops::add(x, attn_out, Tensor(), x);
    } else if (!tp_.comm) {
      ops::linear(attn_flat, w.dense_w, w.dense_b, x, fp8(w.dense_s, into_x));
      lora.add(l, LoraModule::kDense, attn_flat, x);
      ops::layer_norm(x, w.ln_mlp_w, w.ln_mlp_b, eps, ln_m);
      fc1_gelu(ln_m);
      ops::linear(ffn, w.fc2_w, w.fc2_b, x, fp8(w.fc2_s, into_x));
      lora.add(l, LoraModule::kFc2, ffn, x);
    } else {
      ops::linear(attn_flat, w.dense_w, w.dense_b, attn_out, fp8(w.dense_s));
      lora.add(l, LoraModule::kDense, attn_flat, attn_out);
      all_reduce(attn_out);
      ops::add(x, attn_out, Tensor(), x);
      ops::layer_norm(x, w.ln_mlp_w, w.ln_mlp_b, eps, ln_m);
      fc1_gelu(ln_m);
      ops::linear(ffn, w.fc2_w, w.fc2_b, mlp_out, fp8(w.fc2_s));
      lora.add(l, LoraModule::kFc2, ffn, mlp_out);
      all_reduce(mlp_out);
      ops::add(x, mlp_out, Tensor(), x);
    }
  }

  Tensor rows = x;
  if (in.lm_rows.defined()) {
    rows = empty({in.lm_rows.dim(0), hidden});
    ops::gather_rows(x, in.lm_rows, rows);
  }
  Tensor h = empty(rows.shape());
  ops::layer_norm(rows, ln_f_w_, ln_f_b_, eps, h);
  if (in.skip_lm_head) return h;
  if (tp_.comm) return lm_head_sharded(h);  // the rank's vocabulary columns, gathered
  // Logits in F32 on every device (the CUDA GEMM writes them from its fp32 accumulators).
  Tensor logits = Tensor::empty(DType::kF32, {h.dim(0), c.vocab_size}, dev);
  ops::linear(h, lm_head_, Tensor(), logits);
  return logits;
}

void FalconModel::set_cuda_graphs(bool on) {
  cuda_graphs_ = on;
}

FalconModel::GraphStats FalconModel::graph_stats() const {
  GraphStats st;
  if (graphs_) {
    st.captures = graphs_->captures();
    st.replays = graphs_->replays();
  }
  st.pool_bytes = ops::graph_pool_bytes(device_);
  return st;
}

}  // namespace kestrel
