// One step of the engine's loop: vLLM-v1-style scheduling (each sequence has
// tokens computed vs tokens known; a per-step token budget goes to running
// sequences first, then to chunks of waiting prompts), the prefix cache,
// preemption by recompute when KV blocks run out, one batched forward, prompt
// logprobs, sampling (with best_of forks) and stop checks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "backend/ops.h"
#include "core/error.h"
#include "engine/engine_impl.h"
#include "lora/lora_adapter.h"
#include "model/falcon_model.h"

namespace kestrel {

uint64_t Engine::Impl::block_hash(Sequence& s, size_t k) {
  const size_t bs = static_cast<size_t>(opt.block_size);
  KESTREL_CHECK((k + 1) * bs <= s.tokens.size(), "prefix cache: block ", k, " is not full");
  while (s.hashes.size() <= k) {
    const size_t j = s.hashes.size();
    // The chain starts from the adapter's key: KV computed under one adapter is never reused
    // under another or the base model.
    const uint64_t parent = j == 0 ? (s.adapter ? s.adapter->cache_key() : 0) : s.hashes[j - 1];
    s.hashes.push_back(block_prefix_hash(parent, s.tokens.data() + j * bs, opt.block_size));
  }
  return s.hashes[k];
}

int64_t Engine::Impl::lookup_prefix(Sequence& s) {
  if (!opt.prefix_caching || !s.blocks.empty() || s.wants_prompt_logprobs()) return 0;
  // Full blocks only, and never the last token: it must be computed for logits.
  const size_t max_blocks = (s.tokens.size() - 1) / static_cast<size_t>(opt.block_size);
  for (size_t k = 0; k < max_blocks; ++k) {
    const std::optional<int32_t> b = alloc->lookup(block_hash(s, k));
    if (!b) break;
    s.blocks.push_back(*b);
  }
  s.n_computed = static_cast<int64_t>(s.blocks.size()) * opt.block_size;
  return s.n_computed;
}

void Engine::Impl::register_full_blocks(Sequence& s, int64_t old_computed) {
  if (!opt.prefix_caching) return;
  for (int64_t k = old_computed / opt.block_size; k < s.n_computed / opt.block_size; ++k) {
    alloc->set_hash(s.blocks.at(k), block_hash(s, static_cast<size_t>(k)));
  }
}

void Engine::Impl::cancel_requested(const std::vector<uint64_t>& ids) {
  // Every sequence of a request ends (best_of candidates share its id).
  auto cancel_in = [&](auto& list, uint64_t id) {
    for (auto it = list.begin(); it != list.end();) {
      if ((*it)->id != id) {
        ++it;
        continue;
      }
      auto s = *it;
      it = list.erase(it);
      finish(s, FinishReason::kCancelled);
    }
  };
  for (uint64_t id : ids) {
    cancel_in(running, id);
    cancel_in(waiting, id);
    cancel_in(compiling, id);
  }
}

void Engine::Impl::admit_compiled() {
  for (auto it = compiling.begin(); it != compiling.end();) {
    const std::shared_ptr<Sequence> s = *it;
    if (!s->grammar_pending->ready()) {
      ++it;
      continue;
    }
    it = compiling.erase(it);
    const std::shared_ptr<const grammar::Compiled> g = s->grammar_pending->grammar();
    s->grammar_pending.reset();
    if (!g) {
      fail(s, "the request's constraint could not be compiled", ErrorKind::kInvalidArgument);
      continue;
    }
    s->matcher = std::make_shared<grammar::Matcher>(g);
    waiting.push_back(s);
  }
}

void Engine::Impl::fill_grammar_masks(const std::vector<StepWork*>& sampled,
                                      std::vector<int32_t>& rows, std::vector<int32_t>& bitmask) {
  std::vector<grammar::Matcher*> matchers;
  for (const StepWork* w : sampled) {
    if (!w->seq->matcher) continue;
    matchers.push_back(w->seq->matcher.get());
    rows.push_back(static_cast<int32_t>(w->first_row + w->row_positions.size() - 1));
  }
  if (matchers.empty()) return;
  const auto t0 = Clock::now();
  const int64_t words = grammar_compiler->bitmask_words();
  bitmask.assign(matchers.size() * words, 0);
  // One thread count for every step (the batch filler keeps its pool while the count holds):
  // all cores but a few for the HTTP threads, since a step waits for the slower of this and the
  // forward.
  static const int threads = static_cast<int>(
      std::clamp(static_cast<int>(std::thread::hardware_concurrency()) - 4, 1, 16));
  grammar::fill_bitmasks(matchers, bitmask.data(), words, threads);
  stats.grammar_masked_rows += static_cast<int64_t>(matchers.size());
  stats.grammar_mask_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

uint64_t Engine::Impl::adapter_key(const Sequence& s) {
  return s.adapter ? s.adapter->cache_key() : 0;
}

// Fair admission (docs/engine.md, "Fairness across adapters"): a preempted sequence first (it
// was running and holds its place at the front), else the oldest waiting sequence of the adapter
// (or the base model) with the fewest running sequences. One busy adapter's backlog then never
// stands between another adapter's request and the next free slot. With more than one tenant
// about, the last eighth of the running slots is kept for tenants holding less than half of
// them, so that a quiet adapter's request finds a slot at once while a busy one fills the rest.
// With one adapter: FIFO over every slot. waiting.end(): admit nothing now.
std::deque<std::shared_ptr<Sequence>>::iterator Engine::Impl::pick_waiting(
    const std::unordered_map<uint64_t, int64_t>& per_adapter) {
  if (waiting.front()->started && !waiting.front()->yielded) return waiting.begin();
  auto best = waiting.begin();
  int64_t best_running = std::numeric_limits<int64_t>::max();
  std::unordered_set<uint64_t> seen;
  for (auto it = waiting.begin(); it != waiting.end(); ++it) {
    const uint64_t key = adapter_key(**it);
    if (!seen.insert(key).second) continue;  // not its adapter's oldest
    const auto r = per_adapter.find(key);
    const int64_t n = r == per_adapter.end() ? 0 : r->second;
    if (n < best_running) {
      best = it;
      best_running = n;
      if (n == 0) return best;
    }
  }
  // Every waiting tenant already runs something; `seen` holds them all.
  const int64_t reserve = std::max<int64_t>(1, opt.max_running_seqs / 8);
  if (static_cast<int64_t>(running.size()) < opt.max_running_seqs - reserve ||
      2 * best_running < opt.max_running_seqs)
    return best;
  for (const auto& [key, n] : per_adapter)
    if (n > 0 && !seen.count(key)) return waiting.end();  // another tenant runs: keep the reserve
  return seen.size() > 1 ? waiting.end() : best;
}

// Fair preemption (docs/engine.md, "Fairness across adapters"): while every slot is taken and
// a tenant waits that runs fewer than its share (max_running_seqs over the tenants about), the
// most recently admitted sequence of the tenant furthest above its share gives its slot up and
// waits again, behind its tenant's queue (its full blocks stay in the prefix cache, so it
// resumes with little recompute). At most kFairPreemptions a step.
void Engine::Impl::preempt_for_fairness() {
  constexpr int kFairPreemptions = 4;
  if (waiting.empty() || static_cast<int64_t>(running.size()) < opt.max_running_seqs) return;
  std::unordered_map<uint64_t, int64_t> per;
  for (const auto& s : running) ++per[adapter_key(*s)];
  std::vector<uint64_t> waiting_tenants;  // in the order of their oldest waiting sequence
  std::unordered_set<uint64_t> tenants;
  for (const auto& s : waiting)
    if (tenants.insert(adapter_key(*s)).second) waiting_tenants.push_back(adapter_key(*s));
  for (const auto& [key, n] : per) tenants.insert(key);
  if (tenants.size() < 2) return;
  const int64_t share =
      std::max<int64_t>(1, opt.max_running_seqs / static_cast<int64_t>(tenants.size()));
  int left = kFairPreemptions;
  for (const uint64_t w : waiting_tenants) {
    if (left == 0) break;
    if (per[w] >= share) continue;
    uint64_t heavy = 0;
    int64_t most = share;
    for (const auto& [key, n] : per) {
      if (n > most) {
        most = n;
        heavy = key;
      }
    }
    if (most == share) break;  // nobody above its share
    auto victim = running.end();
    for (auto it = running.begin(); it != running.end(); ++it) {
      if (adapter_key(**it) == heavy &&
          (victim == running.end() || (*it)->admitted_order > (*victim)->admitted_order))
        victim = it;
    }
    const std::shared_ptr<Sequence> v = *victim;
    running.erase(victim);
    free_blocks(*v);
    v->yielded = true;
    waiting.push_back(v);
    ++stats.preemptions;
    --per[heavy];
    ++per[w];  // the slot it frees is this tenant's at admission
    --left;
  }
}

// Picks this step's work: running sequences first (oldest first, preempting
// the most recently admitted when blocks run out), then waiting ones.
std::vector<StepWork> Engine::Impl::schedule() {
  preempt_for_fairness();
  int64_t budget = opt.max_batch_prefill_tokens;
  std::vector<StepWork> work;
  for (size_t i = 0; i < running.size() && budget > 0;) {
    auto s = running[i];
    const int64_t n =
        std::min<int64_t>(static_cast<int64_t>(s->tokens.size()) - s->n_computed, budget);
    bool ok = reserve(*s, s->n_computed + n);
    while (!ok && running.size() > i + 1) {  // preempt the most recently admitted
      auto victim = running.back();
      running.pop_back();
      free_blocks(*victim);
      waiting.push_front(victim);
      ++stats.preemptions;
      ok = reserve(*s, s->n_computed + n);
    }
    if (!ok) {  // not even alone with the blocks left: requeue it too
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      free_blocks(*s);
      waiting.push_front(s);
      ++stats.preemptions;
      continue;
    }
    work.push_back({s, n});
    budget -= n;
    ++i;
  }
  // Then chunks of waiting prompts (and preempted sequences' recompute), fairly across adapters.
  int64_t held_tokens = 0;
  std::unordered_map<uint64_t, int64_t> per_adapter;  // running sequences per adapter
  for (const auto& s : running) {
    held_tokens += static_cast<int64_t>(s->tokens.size());
    ++per_adapter[adapter_key(*s)];
  }
  while (!waiting.empty() && budget > 0 &&
         static_cast<int64_t>(running.size()) < opt.max_running_seqs) {
    const auto pick = pick_waiting(per_adapter);
    if (pick == waiting.end()) break;
    auto s = *pick;
    const int64_t total = static_cast<int64_t>(s->tokens.size());
    if (!running.empty() &&
        held_tokens + total + s->params.max_new_tokens > opt.max_batch_total_tokens) {
      break;
    }
    const int64_t hit = lookup_prefix(*s);
    const int64_t n = std::min<int64_t>(total - s->n_computed, budget);
    if (!reserve(*s, s->n_computed + n)) {
      if (hit > 0) free_blocks(*s);  // the cached blocks stay cached
      break;
    }
    if (hit > 0) {
      ++stats.prefix_cache_hits;
      stats.prefix_cache_hit_tokens += hit;
    }
    waiting.erase(pick);
    s->yielded = false;
    ++per_adapter[adapter_key(*s)];
    s->admitted_order = admit_counter++;
    if (!s->started) {
      s->started = true;
      s->scheduled = Clock::now();
      s->result.queue_seconds = std::chrono::duration<double>(s->scheduled - s->submitted).count();
    }
    running.push_back(s);
    work.push_back({s, n});
    budget -= n;
    held_tokens += total;
  }
  return work;
}

// Logprob of each prompt token under the model: row at position p gives the
// distribution of token p + 1 (raw logits, TGI's `prefill` details).
void Engine::Impl::record_prompt_logprobs(const StepWork& w, const float* logits, int64_t vocab) {
  Sequence& s = *w.seq;
  for (size_t r = 0; r < w.row_positions.size(); ++r) {
    const int64_t p = w.row_positions[r];
    if (p + 1 >= s.prompt_len || static_cast<int64_t>(s.result.prompt_tokens.size()) != p + 1) {
      continue;
    }
    const float* row = logits + (w.first_row + static_cast<int64_t>(r)) * vocab;
    const float mx = *std::max_element(row, row + vocab);
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(row[i] - mx));
    TokenInfo t;
    t.id = s.tokens[p + 1];
    t.logprob = static_cast<float>(row[t.id] - mx - std::log(sum));
    if (tokenizer) {
      t.text = tokenizer->decode(std::vector<int32_t>{t.id});
      t.special = tokenizer->is_special(t.id);
    }
    s.result.prompt_tokens.push_back(std::move(t));
  }
}

// best_of: at its first sampled token a request's sequence forks into
// best_of candidates. They share its full prompt blocks by reference count;
// the partial last block is never shared, so each recomputes that tail.
std::vector<std::shared_ptr<Sequence>> Engine::Impl::fork_best_of(
    const std::shared_ptr<Sequence>& s) {
  s->forked = true;
  std::vector<std::shared_ptr<Sequence>> children;
  const int64_t n_full = s->n_computed / opt.block_size;
  for (int32_t i = 1; i < s->params.best_of; ++i) {
    auto c = std::make_shared<Sequence>(*s);
    c->blocks.assign(s->blocks.begin(), s->blocks.begin() + n_full);
    for (int32_t b : c->blocks) alloc->retain(b);
    c->n_computed = n_full * opt.block_size;
    if (c->hashes.size() > static_cast<size_t>(n_full)) c->hashes.resize(n_full);
    c->rng.seed(s->result.seed + static_cast<uint64_t>(i));
    c->result.seed = s->result.seed + static_cast<uint64_t>(i);
    c->admitted_order = admit_counter++;
    if (s->matcher) c->matcher = std::make_shared<grammar::Matcher>(s->matcher->fork());
    ++s->group->remaining;
    children.push_back(std::move(c));
  }
  return children;
}

void Engine::Impl::after_sample(const std::shared_ptr<Sequence>& s, const SampledToken& t) {
  const int32_t eos = static_cast<int32_t>(model->config().eos_token_id);
  if (s->matcher && !s->matcher->accept(t.id)) {  // the mask allowed it: a fault of ours
    running.erase(std::find(running.begin(), running.end(), s));
    free_blocks(*s);
    fail(s, "structured output: the sampled token broke the grammar", ErrorKind::kInternal);
    return;
  }
  const size_t text_before = s->result.text.size();
  append_token(s, t);
  ++stats.generated_tokens;
  std::optional<FinishReason> done;
  if (t.id == eos && !s->params.ignore_eos) done = FinishReason::kEosToken;
  // A complete grammar allows only the end of sequence, even under ignore_eos.
  if (s->matcher && s->matcher->terminated()) done = FinishReason::kEosToken;
  // The end-of-sequence token ends the text; it is not part of it (TGI's generated_text).
  if (done == FinishReason::kEosToken) s->result.text.resize(text_before);
  for (const std::string& stop : s->params.stop) {
    if (done) break;
    const size_t from = text_before >= stop.size() ? text_before - stop.size() + 1 : 0;
    const size_t at = s->result.text.find(stop, from);
    if (at != std::string::npos) {
      s->result.text.resize(at);
      done = FinishReason::kStopSequence;
    }
  }
  if (!done && static_cast<int64_t>(s->result.token_ids.size()) >= s->params.max_new_tokens) {
    done = FinishReason::kLength;
  }
  if (done) {
    running.erase(std::find(running.begin(), running.end(), s));
    finish(s, *done);
  }
}

// Builds the batch, runs the model, and samples for the sequences that reach
// the end of their known tokens (the model's time goes to stats.step_seconds).
void Engine::Impl::forward_and_sample(std::vector<StepWork>& work) {
  ForwardBatch b;
  b.cu_seqlens.push_back(0);
  int32_t max_blocks = 1;
  for (const StepWork& w : work) {
    max_blocks = std::max(max_blocks, static_cast<int32_t>(w.seq->blocks.size()));
  }
  b.max_blocks = max_blocks;
  b.block_tables.assign(work.size() * max_blocks, 0);
  std::vector<StepWork*> sampled;
  for (size_t i = 0; i < work.size(); ++i) {
    StepWork& w = work[i];
    Sequence& s = *w.seq;
    const int64_t total = static_cast<int64_t>(s.tokens.size());
    const bool prompt_rows = s.wants_prompt_logprobs();
    w.first_row = static_cast<int64_t>(b.lm_head_indices.size());
    for (int64_t p = s.n_computed; p < s.n_computed + w.n; ++p) {
      if ((prompt_rows && p + 1 < s.prompt_len) || p == total - 1) {
        b.lm_head_indices.push_back(static_cast<int32_t>(b.input_ids.size()));
        w.row_positions.push_back(p);
      }
      b.input_ids.push_back(s.tokens[p]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slots.push_back(kv_slot(s.blocks, opt.block_size, p));
    }
    b.cu_seqlens.push_back(static_cast<int32_t>(b.input_ids.size()));
    b.kv_lens.push_back(static_cast<int32_t>(s.n_computed + w.n));
    std::copy(s.blocks.begin(), s.blocks.end(), b.block_tables.begin() + i * max_blocks);
    if (s.n_computed + w.n == total) sampled.push_back(&w);
    b.adapters.push_back(s.adapter.get());
  }
  if (std::all_of(b.adapters.begin(), b.adapters.end(), [](auto* a) { return !a; }))
    b.adapters.clear();  // no LoRA in this step
  const bool no_rows = b.lm_head_indices.empty();
  if (no_rows) b.lm_head_indices.push_back(0);  // cache-only step
  const auto t_model = Clock::now();
  Tensor dev_logits = model->forward_device(b, *cache);
  // Structured output: the bitmasks fill on this thread while the device runs the forward.
  std::vector<int32_t> mask_rows, bitmask;
  if (!no_rows) fill_grammar_masks(sampled, mask_rows, bitmask);
  ops::synchronize(model->device());
  stats.step_seconds += std::chrono::duration<double>(Clock::now() - t_model).count();
  if (!mask_rows.empty()) {
    ops::apply_token_bitmask(dev_logits, mask_rows, bitmask, grammar_compiler->bitmask_words());
  }
  // On a GPU a step of next-token rows only (no prompt logprobs, no best_of fork)
  // samples there: only ids, logprobs and alternatives come back (sample_rows).
  bool on_device =
      dev_logits.device() != Device::kCpu && !no_rows && b.lm_head_indices.size() == sampled.size();
  for (const StepWork* w : sampled) on_device = on_device && !(w->seq->group && !w->seq->forked);
  const Tensor logits = on_device ? Tensor() : ops::to_host_f32(dev_logits);
  const int64_t vocab = model->config().vocab_size;
  const float* all = on_device ? nullptr : logits.data<float>();
  for (StepWork& w : work) {
    Sequence& s = *w.seq;
    const int64_t old = s.n_computed;
    s.n_computed += w.n;
    if (s.n_computed <= s.prompt_len) stats.computed_prompt_tokens += w.n;
    register_full_blocks(s, old);
    if (!no_rows && s.wants_prompt_logprobs()) record_prompt_logprobs(w, all, vocab);
  }

  if (on_device) {
    std::vector<SampleRow> rows;
    for (const StepWork* w : sampled) {
      Sequence& s = *w->seq;
      rows.push_back({&s.params, &s.seen, &s.generated_counts, &s.rng});
    }
    const std::vector<SampledToken> picked = sample_rows(dev_logits, rows);
    for (size_t i = 0; i < sampled.size(); ++i) after_sample(sampled[i]->seq, picked[i]);
    return;
  }
  std::vector<float> row(vocab);
  for (StepWork* w : sampled) {
    const std::shared_ptr<Sequence> s = w->seq;
    const int64_t r = w->first_row + static_cast<int64_t>(w->row_positions.size()) - 1;
    std::copy_n(all + r * vocab, vocab, row.begin());
    apply_penalties(s->params, s->seen, s->generated_counts, row.data(), vocab);
    std::vector<std::shared_ptr<Sequence>> children;
    if (s->group && !s->forked) children = fork_best_of(s);
    // Each candidate draws from the same row with its own generator.
    std::vector<std::pair<std::shared_ptr<Sequence>, SampledToken>> draws;
    draws.emplace_back(s, sample_token(s->params, row.data(), vocab, s->rng));
    for (auto& c : children) {
      draws.emplace_back(c, sample_token(c->params, row.data(), vocab, c->rng));
      running.push_back(c);
    }
    for (auto& [seq, t] : draws) after_sample(seq, t);
  }
}

// One scheduling step and one batched forward. Returns whether work was done.
bool Engine::Impl::step() {
  const auto t0 = Clock::now();
  std::vector<uint64_t> to_cancel;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& s : incoming) (s->grammar_pending ? compiling : waiting).push_back(std::move(s));
    incoming.clear();
    to_cancel.swap(cancels);
    grammar_ready = false;
  }
  cancel_requested(to_cancel);
  if (!compiling.empty()) admit_compiled();
  std::vector<StepWork> work = schedule();
  double overhead = 0.0;
  if (!work.empty()) {
    const double model_before = stats.step_seconds;
    forward_and_sample(work);
    const double model_secs = stats.step_seconds - model_before;
    overhead = std::chrono::duration<double>(Clock::now() - t0).count() - model_secs;
    stats.schedule_seconds += overhead;
    ++stats.steps;
    stats.last_batch_size = static_cast<int64_t>(work.size());
  }

  std::lock_guard<std::mutex> lock(mu);
  if (!work.empty() && step_overheads.size() < (size_t{1} << 20)) {
    step_overheads.push_back(overhead);
  }
  stats.queue_length = static_cast<int64_t>(waiting.size() + incoming.size() + compiling.size());
  stats.grammar_compiling = static_cast<int64_t>(compiling.size());
  stats.running = static_cast<int64_t>(running.size());
  stats.kv_blocks_free = alloc->num_free();
  stats.kv_blocks_cached = alloc->num_cached_free();
  stats.kv_blocks_used = alloc->num_blocks() - alloc->num_free();
  return !work.empty();
}

}  // namespace kestrel
