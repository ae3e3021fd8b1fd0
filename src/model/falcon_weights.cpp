// Falcon checkpoint layout (transformers' FalconForCausalLM state dict).
#include "model/falcon_weights.h"

#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace kestrel {

std::string layer_prefix(int64_t l) {
  return "transformer.h." + std::to_string(l) + ".";
}

std::vector<WeightSpec> falcon_weight_specs(const FalconConfig& c, bool with_lm_head) {
  const int64_t h = c.hidden_size;
  std::vector<WeightSpec> specs;
  specs.push_back({"transformer.word_embeddings.weight", {c.vocab_size, h}});
  auto norm = [&](const std::string& name) {
    specs.push_back({name + ".weight", {h}});
    specs.push_back({name + ".bias", {h}});
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    specs.push_back({name + ".weight", {out, in}});
    if (c.bias) specs.push_back({name + ".bias", {out}});
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = layer_prefix(l);
    if (c.two_layer_norms()) {
      norm(p + "ln_attn");
      norm(p + "ln_mlp");
    } else {
      norm(p + "input_layernorm");
    }
    if (!c.parallel_attn) norm(p + "post_attention_layernorm");
    linear(p + "self_attention.query_key_value", c.qkv_out_dim(), h);
    linear(p + "self_attention.dense", h, c.n_heads * c.head_dim);
    linear(p + "mlp.dense_h_to_4h", c.ffn_hidden_size, h);
    linear(p + "mlp.dense_4h_to_h", h, c.ffn_hidden_size);
  }
  norm("transformer.ln_f");
  if (with_lm_head) specs.push_back({"lm_head.weight", {c.vocab_size, h}});
  return specs;
}

Tensor fp8_weight_scales(const WeightStore& store, const std::string& name) {
  const TensorInfo& info = store.get(name);
  if (info.dtype != DType::kF8E4M3)
    KESTREL_FAIL("tensor ", name, " is ", dtype_name(info.dtype),
                 ": only F8_E4M3 weights are supported");
  const std::string base = name.substr(0, name.size() - std::string(".weight").size());
  if (store.contains(base + ".weight_scale_inv"))
    KESTREL_FAIL("tensor ", base, ".weight_scale_inv: block-wise FP8 scales are not supported");
  const std::string sname = base + ".weight_scale";
  if (!store.contains(sname))
    KESTREL_FAIL("tensor ", name, " is F8_E4M3 but the checkpoint has no ", sname);
  const TensorInfo& si = store.get(sname);
  const int64_t rows = info.shape[0], n = shape_numel(si.shape);
  const bool shape_ok =
      (n == 1 && si.shape.size() <= 2) ||
      (n == rows && (si.shape.size() == 1 || (si.shape.size() == 2 && si.shape[1] == 1)));
  if (!shape_ok ||
      !(si.dtype == DType::kF32 || si.dtype == DType::kBF16 || si.dtype == DType::kF16))
    KESTREL_FAIL("tensor ", sname, " is ", dtype_name(si.dtype), " ", shape_str(si.shape),
                 ": a weight scale is F32 / BF16 / F16 of shape [1] (per tensor) or [", rows,
                 "] / [", rows, ", 1] (per output channel)");
  Tensor host = Tensor::empty(DType::kF32, {n});
  convert_to_f32(si.data, si.dtype, static_cast<size_t>(n), host.data<float>());
  for (int64_t i = 0; i < n; ++i) {
    const float v = host.data<float>()[i];
    if (!(std::isfinite(v) && v > 0.0f))
      KESTREL_FAIL("tensor ", sname, " holds ", v, " at index ", i,
                   ": weight scales must be finite and positive");
  }
  return host;
}

}  // namespace kestrel
