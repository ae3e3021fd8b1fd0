// For the CUDA graph tests: test sequences that each own a fixed range of blocks in a paged KV
// cache, the ForwardBatch that computes their tokens not yet in the cache, and falcon-7b's
// shapes for random-weight models.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/falcon_config.h"
#include "model/forward_batch.h"

namespace kestrel::test {

struct Seq {
  int64_t id = 0;  // its block range: [id * blocks_per_seq, (id + 1) * blocks_per_seq)
  std::vector<int32_t> tokens;
  int64_t computed = 0;  // tokens in the cache
};

// The batch that computes tokens [computed, size) of each sequence, logits at each last one.
inline ForwardBatch make_batch(const std::vector<Seq*>& seqs, int64_t block_size,
                               int64_t blocks_per_seq) {
  ForwardBatch b;
  b.cu_seqlens.push_back(0);
  int32_t max_blocks = 1;
  for (const Seq* s : seqs)
    max_blocks = std::max<int32_t>(
        max_blocks, static_cast<int32_t>((s->tokens.size() + block_size - 1) / block_size));
  b.max_blocks = max_blocks;
  b.block_tables.assign(seqs.size() * max_blocks, 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Seq& s = *seqs[i];
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    for (int64_t p = s.computed; p < n; ++p) {
      b.input_ids.push_back(s.tokens[p]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slots.push_back(s.id * blocks_per_seq * block_size + p);
    }
    b.lm_head_indices.push_back(static_cast<int32_t>(b.input_ids.size()) - 1);
    b.cu_seqlens.push_back(static_cast<int32_t>(b.input_ids.size()));
    b.kv_lens.push_back(static_cast<int32_t>(n));
    for (int32_t k = 0; k < max_blocks; ++k)
      b.block_tables[i * max_blocks + k] = static_cast<int32_t>(s.id * blocks_per_seq + k);
  }
  return b;
}

// falcon-7b's shapes (71 query heads on one K/V head, head_dim 64, vocab 65,024) at `layers`
// layers.
inline FalconConfig falcon7b_shapes(int64_t layers) {
  const nlohmann::json j = {{"model_type", "falcon"},
                            {"hidden_size", 4544},
                            {"num_attention_heads", 71},
                            {"num_hidden_layers", layers},
                            {"multi_query", true},
                            {"parallel_attn", true},
                            {"new_decoder_architecture", false},
                            {"bias", false},
                            {"alibi", false},
                            {"vocab_size", 65024},
                            {"layer_norm_epsilon", 1e-5}};
  return FalconConfig::from_json(j, "falcon-7b, " + std::to_string(layers) + " layers");
}

}  // namespace kestrel::test
