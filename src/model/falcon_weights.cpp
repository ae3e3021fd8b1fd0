// Falcon checkpoint layout (transformers' FalconForCausalLM state dict).
#include "model/falcon_weights.h"

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

}  // namespace kestrel
