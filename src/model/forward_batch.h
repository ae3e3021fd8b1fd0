// ForwardBatch: the model's input contract (LoRAX's FlashRWForCausalLM.forward),
// host-side: a flattened batch of n_tokens from n_seqs sequences over the paged
// KV cache. The scheduler (or a runner) fills it; the model uploads it.
#pragma once

#include <cstdint>
#include <vector>

namespace kestrel {

class LoraAdapter;

struct ForwardBatch {
  std::vector<int32_t> input_ids;     // [n_tokens]
  std::vector<int32_t> positions;     // [n_tokens] position of each token in its sequence
  std::vector<int32_t> cu_seqlens;    // [n_seqs + 1] sequence b's new tokens: [cu[b], cu[b+1])
  std::vector<int32_t> kv_lens;       // [n_seqs] tokens in the cache after this step (cached + new)
  std::vector<int32_t> block_tables;  // [n_seqs, max_blocks] row-major, unused entries 0
  int32_t max_blocks = 0;
  std::vector<int64_t> slots;  // [n_tokens] cache slot of each new token
  // Rows that get logits (indices into the n_tokens); empty: every row.
  std::vector<int32_t> lm_head_indices;
  bool skip_lm_head = false;  // return the final hidden states instead of logits
  // LoRA: [n_seqs] the adapter of each sequence (nullptr: the base model), or empty: none at all.
  // Made by FalconModel::load_adapter / random_adapter of this model; the caller keeps them alive
  // through the forward. Consecutive sequences with one adapter form one segment of ops::lora_add.
  std::vector<const LoraAdapter*> adapters;

  int64_t n_tokens() const { return static_cast<int64_t>(input_ids.size()); }
  int64_t n_seqs() const { return static_cast<int64_t>(kv_lens.size()); }
};

}  // namespace kestrel
