// BatchRunner: drives a fixed set of sequences through FalconModel over its
// own paged KV cache: a ragged (optionally chunked) prefill, then batched
// decode steps. The CLI's `logits` / `generate` and the model tests use it;
// the engine's scheduler does the same for live traffic.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kv/block_allocator.h"
#include "kv/kv_cache.h"
#include "model/falcon_model.h"

namespace kestrel {

struct RunnerOptions {
  int64_t block_size = 16;
  int64_t prefill_chunk = 0;  // tokens per sequence per prefill step; 0: whole prompts
  // LoRA: one adapter per prompt (nullptr: the base model), or empty: none. The caller keeps
  // them alive while the runner runs.
  std::vector<const LoraAdapter*> adapters;
};

class BatchRunner {
 public:
  // Sizes the cache for every prompt plus max_new_tokens more tokens each.
  BatchRunner(const FalconModel& model, std::vector<std::vector<int32_t>> prompts,
              int64_t max_new_tokens, RunnerOptions options);

  int64_t n_seqs() const { return static_cast<int64_t>(seqs_.size()); }

  // Prefills every prompt. all_logits: logits of every prompt token
  // [sum of prompt lengths, vocab], prompts concatenated in order; otherwise
  // the last token's [n_seqs, vocab].
  Tensor prefill(bool all_logits);

  // One batched decode step: appends tokens[i] to sequence seq_ids[i] and
  // returns their next-token logits [seq_ids.size(), vocab].
  Tensor decode(const std::vector<int>& seq_ids, const std::vector<int32_t>& tokens);

 private:
  struct Seq {
    std::vector<int32_t> tokens;  // every token known so far
    int64_t n_cached = 0;         // tokens whose K/V are in the cache
    std::vector<int32_t> blocks;  // block table
  };
  // One forward over (sequence, n new tokens) pairs; their tokens must be known.
  Tensor step(const std::vector<std::pair<int, int64_t>>& work, std::vector<int32_t> lm_rows);
  void reserve(Seq& seq, int64_t n_tokens);

  const FalconModel& model_;
  RunnerOptions options_;
  std::vector<Seq> seqs_;
  BlockAllocator allocator_;
  KvCache cache_;
};

// Greedy decoding of every prompt together, one batched step per token. A
// sequence stops at EOS when stop_at_eos. on_step (optional) sees each step's
// logits [n active, vocab] and which sequences the rows belong to.
using StepObserver =
    std::function<void(int64_t step, const Tensor& logits, const std::vector<int>& seq_ids)>;
std::vector<std::vector<int32_t>> greedy_generate(const FalconModel& model,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  int64_t max_new_tokens, RunnerOptions options,
                                                  bool stop_at_eos,
                                                  const StepObserver& on_step = nullptr);

// Index of the largest logit (the first on ties, as torch.argmax).
int32_t argmax_row(const Tensor& logits, int64_t row);

}  // namespace kestrel
