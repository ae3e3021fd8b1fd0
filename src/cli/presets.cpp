// The preset table (presets.h).
#include "cli/presets.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace kestrel::cli {

FalconConfig falcon_preset(const std::string& name) {
  FalconConfig c;
  c.vocab_size = 65024;
  c.max_position_embeddings = 2048;
  if (name == "falcon-7b") {
    c.hidden_size = 4544, c.n_layers = 32, c.n_heads = 71, c.n_kv_heads = 1;
    c.multi_query = true;
  } else if (name == "falcon-40b") {
    c.hidden_size = 8192, c.n_layers = 60, c.n_heads = 128, c.n_kv_heads = 8;
    c.new_decoder_architecture = true, c.num_ln_in_parallel_attn = 2;
  } else if (name == "falcon-180b") {
    c.hidden_size = 14848, c.n_layers = 80, c.n_heads = 232, c.n_kv_heads = 8;
    c.new_decoder_architecture = true, c.num_ln_in_parallel_attn = 2;
  } else if (name == "falcon2-11b") {
    c.hidden_size = 4096, c.n_layers = 60, c.n_heads = 32, c.n_kv_heads = 8;
    c.new_decoder_architecture = true, c.num_ln_in_parallel_attn = 1;
    c.rope_theta = 500042.0, c.max_position_embeddings = 8192;
  } else if (name == "falcon-rw-1b") {
    // RefinedWeb 1B: ALiBi, full multi-head attention, sequential attention, biases.
    c.vocab_size = 50304, c.hidden_size = 2048, c.n_layers = 24, c.n_heads = 32, c.n_kv_heads = 32;
    c.alibi = true, c.bias = true, c.parallel_attn = false, c.bos_token_id = 1, c.eos_token_id = 2;
  } else if (name == "tiny") {
    c.vocab_size = 1024, c.hidden_size = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 1;
    c.multi_query = true;
  } else {
    KESTREL_FAIL("unknown preset \"", name,
                 "\" (falcon-7b, falcon-40b, falcon-180b, falcon2-11b, falcon-rw-1b or tiny)");
  }
  c.ffn_hidden_size = 4 * c.hidden_size;
  return c;
}

FalconConfig falcon_preset_config(const std::string& name) {
  return FalconConfig::from_json(falcon_preset(name).to_json(), "preset " + name);
}

}  // namespace kestrel::cli
