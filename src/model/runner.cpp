// BatchRunner and greedy decoding over the paged cache.
#include "model/runner.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace kestrel {
namespace {

int64_t blocks_for(int64_t n_tokens, int64_t block_size) {
  return (n_tokens + block_size - 1) / block_size;
}

int64_t cache_blocks(const std::vector<std::vector<int32_t>>& prompts, int64_t max_new,
                     int64_t block_size) {
  KESTREL_CHECK(block_size >= 1 && block_size <= 4096, "block size must be in [1, 4096], got ",
                block_size);
  int64_t n = 0;
  for (const auto& p : prompts)
    n += blocks_for(static_cast<int64_t>(p.size()) + max_new, block_size);
  return std::max<int64_t>(n, 1);
}

}  // namespace

BatchRunner::BatchRunner(const FalconModel& model, std::vector<std::vector<int32_t>> prompts,
                         int64_t max_new_tokens, RunnerOptions options)
    : model_(model),
      options_(options),
      allocator_(static_cast<int32_t>(cache_blocks(prompts, max_new_tokens, options.block_size))),
      cache_(model.make_kv_cache(cache_blocks(prompts, max_new_tokens, options.block_size),
                                 options.block_size)) {
  KESTREL_CHECK(options.prefill_chunk >= 0, "prefill chunk must be >= 0, got ",
                options.prefill_chunk);
  KESTREL_CHECK(options.adapters.empty() || options.adapters.size() == prompts.size(),
                "BatchRunner: ", options.adapters.size(), " adapters for ", prompts.size(),
                " prompts");
  KESTREL_CHECK(!prompts.empty(), "no prompts given");
  const int64_t max_pos = model.config().max_position_embeddings;
  for (size_t i = 0; i < prompts.size(); ++i) {
    KESTREL_CHECK(!prompts[i].empty(), "prompt ", i, " is empty");
    const int64_t len = static_cast<int64_t>(prompts[i].size());
    KESTREL_CHECK(len + max_new_tokens <= max_pos ||
                      model.config().rope_scaling.kind != RopeScalingKind::kNone,
                  "prompt ", i, " has ", len, " tokens; with ", max_new_tokens,
                  " new tokens it passes the model's max_position_embeddings ", max_pos);
    const int64_t vocab = model.config().vocab_size;
    for (int32_t id : prompts[i]) {
      KESTREL_CHECK(id >= 0 && id < vocab, "prompt ", i, " holds token id ", id,
                    " outside the vocabulary [0, ", vocab, ")");
    }
    seqs_.push_back(Seq{std::move(prompts[i]), 0, {}});
  }
}

void BatchRunner::reserve(Seq& seq, int64_t n_tokens) {
  const int64_t need =
      blocks_for(n_tokens, options_.block_size) - static_cast<int64_t>(seq.blocks.size());
  if (need <= 0) return;
  KESTREL_CHECK(allocator_.allocate(static_cast<int32_t>(need), seq.blocks),
                "KV cache out of blocks (", allocator_.num_free(), " free, ", need, " needed)");
}

Tensor BatchRunner::step(const std::vector<std::pair<int, int64_t>>& work,
                         std::vector<int32_t> lm_rows) {
  ForwardBatch b;
  b.cu_seqlens.push_back(0);
  int32_t max_blocks = 1;
  for (const auto& [s, n] : work) {
    Seq& seq = seqs_[s];
    reserve(seq, seq.n_cached + n);
    max_blocks = std::max(max_blocks, static_cast<int32_t>(seq.blocks.size()));
  }
  b.max_blocks = max_blocks;
  b.block_tables.assign(work.size() * max_blocks, 0);
  for (size_t i = 0; i < work.size(); ++i) {
    Seq& seq = seqs_[work[i].first];
    const int64_t n = work[i].second;
    for (int64_t p = seq.n_cached; p < seq.n_cached + n; ++p) {
      b.input_ids.push_back(seq.tokens[p]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slots.push_back(kv_slot(seq.blocks, options_.block_size, p));
    }
    b.cu_seqlens.push_back(static_cast<int32_t>(b.input_ids.size()));
    b.kv_lens.push_back(static_cast<int32_t>(seq.n_cached + n));
    std::copy(seq.blocks.begin(), seq.blocks.end(), b.block_tables.begin() + i * max_blocks);
    if (!options_.adapters.empty()) b.adapters.push_back(options_.adapters.at(work[i].first));
  }
  b.lm_head_indices = std::move(lm_rows);
  Tensor logits = model_.forward(b, cache_);
  for (const auto& [s, n] : work) seqs_[s].n_cached += n;
  return logits;
}

Tensor BatchRunner::prefill(bool all_logits) {
  const int64_t vocab = model_.config().vocab_size;
  std::vector<int64_t> offsets;  // each prompt's first row in the all-logits output
  int64_t total = 0;
  for (const Seq& s : seqs_) {
    offsets.push_back(total);
    total += static_cast<int64_t>(s.tokens.size());
  }
  Tensor out = Tensor::empty(DType::kF32, {all_logits ? total : n_seqs(), vocab});
  for (;;) {
    std::vector<std::pair<int, int64_t>> work;
    std::vector<int32_t> lm_rows;
    std::vector<int64_t> dest;  // output row of each logits row
    int64_t rows = 0;
    for (int s = 0; s < n_seqs(); ++s) {
      const Seq& seq = seqs_[s];
      const int64_t left = static_cast<int64_t>(seq.tokens.size()) - seq.n_cached;
      if (left <= 0) continue;
      const int64_t n = options_.prefill_chunk > 0 ? std::min(left, options_.prefill_chunk) : left;
      work.emplace_back(s, n);
      if (all_logits) {
        for (int64_t j = 0; j < n; ++j) {
          lm_rows.push_back(static_cast<int32_t>(rows + j));
          dest.push_back(offsets[s] + seq.n_cached + j);
        }
      } else if (n == left) {
        lm_rows.push_back(static_cast<int32_t>(rows + n - 1));
        dest.push_back(s);
      }
      rows += n;
    }
    if (work.empty()) break;
    if (lm_rows.empty()) {  // no prompt finishes in this chunk: only the cache matters
      lm_rows.push_back(0);
      dest.push_back(-1);
    }
    Tensor logits = step(work, lm_rows);
    for (size_t r = 0; r < dest.size(); ++r) {
      if (dest[r] < 0) continue;
      std::memcpy(out.data<float>() + dest[r] * vocab, logits.data<float>() + r * vocab,
                  sizeof(float) * vocab);
    }
  }
  return out;
}

Tensor BatchRunner::decode(const std::vector<int>& seq_ids, const std::vector<int32_t>& tokens) {
  KESTREL_CHECK(seq_ids.size() == tokens.size() && !seq_ids.empty(), "decode: ", seq_ids.size(),
                " sequences but ", tokens.size(), " tokens");
  std::vector<std::pair<int, int64_t>> work;
  const int32_t vocab = static_cast<int32_t>(model_.config().vocab_size);
  for (size_t i = 0; i < seq_ids.size(); ++i) {
    KESTREL_CHECK(seq_ids[i] >= 0 && seq_ids[i] < n_seqs(), "decode: no sequence ", seq_ids[i]);
    KESTREL_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "decode: token ", tokens[i],
                  " outside the vocabulary");
    Seq& seq = seqs_[seq_ids[i]];
    KESTREL_CHECK(seq.n_cached == static_cast<int64_t>(seq.tokens.size()), "decode: sequence ",
                  seq_ids[i], " is not prefilled");
    seq.tokens.push_back(tokens[i]);
    work.emplace_back(seq_ids[i], 1);
  }
  return step(work, {});
}

int32_t argmax_row(const Tensor& logits, int64_t row) {
  const int64_t vocab = logits.dim(1);
  const float* p = logits.data<float>() + row * vocab;
  return static_cast<int32_t>(std::max_element(p, p + vocab) - p);
}

std::vector<std::vector<int32_t>> greedy_generate(const FalconModel& model,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  int64_t max_new_tokens, RunnerOptions options,
                                                  bool stop_at_eos, const StepObserver& on_step) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  if (max_new_tokens <= 0) return out;
  BatchRunner runner(model, prompts, max_new_tokens, options);
  Tensor logits = runner.prefill(/*all_logits=*/false);
  std::vector<int> active(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) active[i] = static_cast<int>(i);
  const int32_t eos = static_cast<int32_t>(model.config().eos_token_id);
  for (int64_t step = 0;; ++step) {
    if (on_step) on_step(step, logits, active);
    std::vector<int> next_active;
    std::vector<int32_t> next_tokens;
    for (size_t r = 0; r < active.size(); ++r) {
      const int32_t tok = argmax_row(logits, static_cast<int64_t>(r));
      out[active[r]].push_back(tok);
      const bool done = static_cast<int64_t>(out[active[r]].size()) >= max_new_tokens ||
                        (stop_at_eos && tok == eos);
      if (!done) {
        next_active.push_back(active[r]);
        next_tokens.push_back(tok);
      }
    }
    if (next_active.empty()) break;
    active = std::move(next_active);
    logits = runner.decode(active, next_tokens);
  }
  return out;
}

}  // namespace kestrel
