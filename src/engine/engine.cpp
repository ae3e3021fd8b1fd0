// The engine's step loop: vLLM-v1-style scheduling (each sequence has tokens
// computed vs tokens known; a per-step token budget goes to decode tokens
// first, then to chunks of waiting prompts), preemption by recompute when KV
// blocks run out, sampling and stop checks, and events back to each request.
#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <unordered_map>

#include "core/error.h"
#include "core/logging.h"
#include "engine/sampler.h"
#include "kv/block_allocator.h"
#include "kv/kv_cache.h"
#include "model/falcon_model.h"
#include "text/tokenizer.h"

namespace kestrel {

using Clock = std::chrono::steady_clock;

// ---- RequestHandle ----

void RequestHandle::push(EngineEvent event) {
  std::function<void(EngineEvent)> cb;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cb = callback_;
    if (!cb) events_.push_back(std::move(event));
  }
  if (cb) {
    cb(std::move(event));
  } else {
    cv_.notify_all();
  }
}

std::optional<EngineEvent> RequestHandle::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_) return std::nullopt;
  cv_.wait(lock, [&] { return !events_.empty(); });
  EngineEvent e = std::move(events_.front());
  events_.pop_front();
  if (e.kind != EngineEvent::Kind::kToken) done_ = true;
  return e;
}

GenerationResult RequestHandle::wait() {
  while (auto e = next()) {
    if (e->kind == EngineEvent::Kind::kFinished) return *e->result;
    if (e->kind == EngineEvent::Kind::kError) throw Error(e->error);
  }
  throw Error("request already finished");
}

// ---- Engine ----

struct Sequence {
  uint64_t id = 0;
  std::shared_ptr<RequestHandle> handle;
  SamplingParams params;
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t prompt_len = 0;
  int64_t n_computed = 0;  // tokens whose K/V are in the cache
  std::vector<int32_t> blocks;
  std::mt19937_64 rng;
  std::unordered_map<int32_t, int32_t> seen, generated_counts;
  GenerationResult result;
  std::optional<text::IncrementalDetokenizer> detok;
  Clock::time_point submitted, scheduled;
  bool started = false;
  int64_t admitted_order = 0;
};

struct Engine::Impl {
  std::shared_ptr<const FalconModel> model;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  EngineOptions opt;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<BlockAllocator> alloc;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Sequence>> incoming;
  std::vector<uint64_t> cancels;
  bool stopping = false;
  bool accepting = true;
  std::atomic<uint64_t> next_id{1};
  EngineStats stats;

  // Owned by the loop thread.
  std::deque<std::shared_ptr<Sequence>> waiting;
  std::vector<std::shared_ptr<Sequence>> running;
  int64_t admit_counter = 0;
  std::thread loop;

  void run();
  bool step();
  void finish(const std::shared_ptr<Sequence>& s, FinishReason reason);
  void free_blocks(Sequence& s) {
    alloc->release(s.blocks);
    s.blocks.clear();
    s.n_computed = 0;
  }
  bool reserve(Sequence& s, int64_t n_tokens) {
    const int64_t need =
        (n_tokens + opt.block_size - 1) / opt.block_size - static_cast<int64_t>(s.blocks.size());
    return need <= 0 || alloc->allocate(static_cast<int32_t>(need), s.blocks);
  }
  void append_token(const std::shared_ptr<Sequence>& s, const SampledToken& t);
};

Engine::Engine(std::shared_ptr<const FalconModel> model,
               std::shared_ptr<const text::Tokenizer> tokenizer, EngineOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.model = std::move(model);
  m.tokenizer = std::move(tokenizer);
  m.opt = options;
  const FalconConfig& c = m.model->config();
  KESTREL_CHECK(options.block_size >= 1 && options.block_size <= 1024,
                "--block-size must be in "
                "[1, 1024], got ",
                options.block_size);
  KvCacheShape shape{c.n_layers, 1, options.block_size, c.n_kv_heads, c.head_dim};
  int64_t blocks = options.num_blocks;
  if (blocks <= 0) blocks = options.kv_cache_memory / shape.bytes_per_block(m.model->act_dtype());
  KESTREL_CHECK(blocks >= 1, "the KV cache holds no block: raise --kv-cache-memory");
  shape.num_blocks = blocks;
  m.cache = std::make_unique<KvCache>(shape, m.model->act_dtype(), m.model->device());
  m.alloc = std::make_unique<BlockAllocator>(static_cast<int32_t>(blocks));
  KESTREL_CHECK(
      options.max_input_length >= 1 && options.max_total_tokens > options.max_input_length,
      "--max-total-tokens (", options.max_total_tokens,
      ") must be larger than --max-input-length (", options.max_input_length, ")");
  KESTREL_CHECK(options.max_total_tokens <= c.max_position_embeddings ||
                    c.rope_scaling.kind != RopeScalingKind::kNone,
                "--max-total-tokens ", options.max_total_tokens,
                " is beyond the model's max_position_embeddings ", c.max_position_embeddings);
  KESTREL_CHECK(options.max_batch_prefill_tokens >= 1 && options.max_running_seqs >= 1,
                "--max-batch-prefill-tokens and --max-running-seqs must be positive");
  if (m.opt.max_batch_total_tokens <= 0) m.opt.max_batch_total_tokens = blocks * options.block_size;
  m.stats.kv_blocks_total = blocks;
  spdlog::info("KV cache: {} blocks of {} tokens ({:.1f} MiB)", blocks, options.block_size,
               blocks * shape.bytes_per_block(m.model->act_dtype()) / 1048576.0);
  m.loop = std::thread([&m] { m.run(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->loop.joinable()) impl_->loop.join();
}

const EngineOptions& Engine::options() const {
  return impl_->opt;
}
const FalconModel& Engine::model() const {
  return *impl_->model;
}
const text::Tokenizer* Engine::tokenizer() const {
  return impl_->tokenizer.get();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

std::shared_ptr<RequestHandle> Engine::submit(GenerationRequest req,
                                              std::function<void(EngineEvent)> callback) {
  Impl& m = *impl_;
  validate(req.params);
  const int64_t n = static_cast<int64_t>(req.prompt_ids.size());
  if (n == 0) throw ValidationError("inputs", "`inputs` must not be empty");
  if (n > m.opt.max_input_length) {
    throw ValidationError(
        "inputs",
        "`inputs` tokens + `max_new_tokens` must be <= " + std::to_string(m.opt.max_total_tokens) +
            ". Given: " + std::to_string(n) + " `inputs` tokens; `inputs` must " +
            "have less than " + std::to_string(m.opt.max_input_length) + " tokens");
  }
  if (n + req.params.max_new_tokens > m.opt.max_total_tokens) {
    throw ValidationError(
        "max_new_tokens",
        "`inputs` tokens + `max_new_tokens` must be <= " + std::to_string(m.opt.max_total_tokens) +
            ". Given: " + std::to_string(n) + " `inputs` tokens and " +
            std::to_string(req.params.max_new_tokens) + " `max_new_tokens`");
  }
  const int64_t need = (n + req.params.max_new_tokens + m.opt.block_size - 1) / m.opt.block_size;
  if (need > m.alloc->num_blocks()) {
    throw ValidationError("max_new_tokens", "the request needs " + std::to_string(need) +
                                                " KV blocks, the cache holds " +
                                                std::to_string(m.alloc->num_blocks()));
  }
  if (req.params.best_of > 1)
    throw ValidationError("best_of", "`best_of` > 1 is not supported yet");
  if (req.params.prompt_logprobs) {
    throw ValidationError("decoder_input_details", "`decoder_input_details` is not supported yet");
  }
  if (!req.params.stop.empty() && !m.tokenizer) {
    throw ValidationError("stop", "stop sequences need a tokenizer");
  }
  const int32_t vocab = static_cast<int32_t>(m.model->config().vocab_size);
  for (int32_t id : req.prompt_ids) {
    if (id < 0 || id >= vocab) {
      throw ValidationError("inputs",
                            "token id " + std::to_string(id) + " is outside the vocabulary");
    }
  }

  auto s = std::make_shared<Sequence>();
  s->id = m.next_id++;
  s->handle = std::shared_ptr<RequestHandle>(new RequestHandle(s->id));
  s->handle->callback_ = std::move(callback);
  s->params = req.params;
  s->prompt_len = n;
  s->tokens = std::move(req.prompt_ids);
  const uint64_t seed = req.params.seed ? *req.params.seed : std::random_device{}();
  s->rng.seed(seed);
  s->result.seed = seed;
  s->result.prompt_length = n;
  for (int32_t id : s->tokens) ++s->seen[id];
  if (m.tokenizer) s->detok.emplace(*m.tokenizer, s->tokens);
  s->submitted = Clock::now();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.accepting || m.stopping) throw Error("the engine is shutting down");
    m.incoming.push_back(s);
    ++m.stats.queue_length;
  }
  m.cv.notify_all();
  return s->handle;
}

void Engine::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->cancels.push_back(id);
  }
  impl_->cv.notify_all();
}

void Engine::drain(std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.accepting = false;
  }
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(m.mu);
      if (m.stats.running == 0 && m.stats.queue_length == 0 && m.incoming.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stopping = true;
  }
  m.cv.notify_all();
  if (m.loop.joinable()) m.loop.join();
}

void Engine::Impl::finish(const std::shared_ptr<Sequence>& s, FinishReason reason) {
  if (s->detok) {
    std::string tail = s->detok->flush();
    if (reason != FinishReason::kStopSequence) s->result.text += tail;
  }
  s->result.finish_reason = reason;
  s->result.inference_seconds =
      s->started ? std::chrono::duration<double>(Clock::now() - s->scheduled).count() : 0.0;
  free_blocks(*s);
  EngineEvent e;
  e.kind = EngineEvent::Kind::kFinished;
  e.result = std::make_shared<GenerationResult>(s->result);
  s->handle->push(std::move(e));
}

void Engine::Impl::append_token(const std::shared_ptr<Sequence>& s, const SampledToken& t) {
  s->tokens.push_back(t.id);
  ++s->seen[t.id];
  ++s->generated_counts[t.id];
  TokenInfo info;
  info.id = t.id;
  info.logprob = t.logprob;
  if (tokenizer) {
    info.special = tokenizer->is_special(t.id);
    info.text = s->detok->push(t.id);
    for (const auto& [id, lp] : t.alternatives) {
      info.alternatives.push_back({id, tokenizer->decode(std::vector<int32_t>{id}), lp});
    }
  } else {
    for (const auto& [id, lp] : t.alternatives) info.alternatives.push_back({id, "", lp});
  }
  s->result.token_ids.push_back(t.id);
  s->result.text += info.text;
  s->result.tokens.push_back(info);
  EngineEvent e;
  e.kind = EngineEvent::Kind::kToken;
  e.token = std::move(info);
  s->handle->push(std::move(e));
}

void Engine::Impl::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] {
        return stopping || !incoming.empty() || !cancels.empty() || !waiting.empty() ||
               !running.empty();
      });
      if (stopping) break;
    }
    try {
      step();
    } catch (const std::exception& e) {
      // A failed step must not take the process down: end what was in it.
      spdlog::error("engine step failed: {}", e.what());
      for (auto* list : {&running}) {
        for (auto& s : *list) {
          free_blocks(*s);
          EngineEvent ev;
          ev.kind = EngineEvent::Kind::kError;
          ev.error = std::string("inference failed: ") + e.what();
          s->handle->push(std::move(ev));
        }
        list->clear();
      }
    }
  }
  // Shutdown: every unfinished request ends with an error.
  std::lock_guard<std::mutex> lock(mu);
  for (auto* q : {&incoming, &waiting}) {
    for (auto& s : *q) {
      EngineEvent ev;
      ev.kind = EngineEvent::Kind::kError;
      ev.error = "engine stopped";
      s->handle->push(std::move(ev));
    }
    q->clear();
  }
  for (auto& s : running) {
    free_blocks(*s);
    EngineEvent ev;
    ev.kind = EngineEvent::Kind::kError;
    ev.error = "engine stopped";
    s->handle->push(std::move(ev));
  }
  running.clear();
}

}  // namespace kestrel

namespace kestrel {

// One scheduling step and one batched forward. Returns whether work was done.
bool Engine::Impl::step() {
  const auto t0 = Clock::now();
  std::vector<uint64_t> to_cancel;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& s : incoming) waiting.push_back(std::move(s));
    incoming.clear();
    to_cancel.swap(cancels);
  }
  for (uint64_t id : to_cancel) {
    auto match = [id](const std::shared_ptr<Sequence>& s) { return s->id == id; };
    if (auto it = std::find_if(running.begin(), running.end(), match); it != running.end()) {
      finish(*it, FinishReason::kCancelled);
      running.erase(it);
    } else if (auto wt = std::find_if(waiting.begin(), waiting.end(), match); wt != waiting.end()) {
      finish(*wt, FinishReason::kCancelled);
      waiting.erase(wt);
    }
  }

  // Decode (and unfinished prefill) of running sequences first, oldest first.
  int64_t budget = opt.max_batch_prefill_tokens;
  std::vector<std::pair<std::shared_ptr<Sequence>, int64_t>> work;
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
    work.emplace_back(s, n);
    budget -= n;
    ++i;
  }
  // Then chunks of waiting prompts (and preempted sequences' recompute).
  int64_t cached_tokens = 0;
  for (const auto& s : running) cached_tokens += static_cast<int64_t>(s->tokens.size());
  while (!waiting.empty() && budget > 0 &&
         static_cast<int64_t>(running.size()) < opt.max_running_seqs) {
    auto s = waiting.front();
    const int64_t total = static_cast<int64_t>(s->tokens.size());
    if (!running.empty() &&
        cached_tokens + total + s->params.max_new_tokens > opt.max_batch_total_tokens) {
      break;
    }
    const int64_t n = std::min<int64_t>(total - s->n_computed, budget);
    if (!reserve(*s, s->n_computed + n)) break;
    waiting.pop_front();
    s->admitted_order = admit_counter++;
    if (!s->started) {
      s->started = true;
      s->scheduled = Clock::now();
      s->result.queue_seconds = std::chrono::duration<double>(s->scheduled - s->submitted).count();
    }
    running.push_back(s);
    work.emplace_back(s, n);
    budget -= n;
    cached_tokens += total;
  }

  if (!work.empty()) {
    ForwardBatch b;
    b.cu_seqlens.push_back(0);
    int32_t max_blocks = 1;
    for (const auto& [s, n] : work) {
      max_blocks = std::max(max_blocks, static_cast<int32_t>(s->blocks.size()));
    }
    b.max_blocks = max_blocks;
    b.block_tables.assign(work.size() * max_blocks, 0);
    std::vector<std::shared_ptr<Sequence>> sampled;
    for (size_t i = 0; i < work.size(); ++i) {
      const auto& [s, n] = work[i];
      for (int64_t p = s->n_computed; p < s->n_computed + n; ++p) {
        b.input_ids.push_back(s->tokens[p]);
        b.positions.push_back(static_cast<int32_t>(p));
        b.slots.push_back(kv_slot(s->blocks, opt.block_size, p));
      }
      b.cu_seqlens.push_back(static_cast<int32_t>(b.input_ids.size()));
      b.kv_lens.push_back(static_cast<int32_t>(s->n_computed + n));
      std::copy(s->blocks.begin(), s->blocks.end(), b.block_tables.begin() + i * max_blocks);
      if (s->n_computed + n == static_cast<int64_t>(s->tokens.size())) {
        b.lm_head_indices.push_back(static_cast<int32_t>(b.input_ids.size() - 1));
        sampled.push_back(s);
      }
    }
    if (b.lm_head_indices.empty()) b.lm_head_indices.push_back(0);  // cache-only step
    const auto t_model = Clock::now();
    Tensor logits = model->forward(b, *cache);
    const double model_secs = std::chrono::duration<double>(Clock::now() - t_model).count();
    for (const auto& [s, n] : work) s->n_computed += n;
    for (const auto& [s, n] : work) {
      if (s->n_computed <= s->prompt_len) stats.computed_prompt_tokens += n;
    }

    const int64_t vocab = model->config().vocab_size;
    const int32_t eos = static_cast<int32_t>(model->config().eos_token_id);
    std::vector<float> row(vocab);
    for (size_t r = 0; r < sampled.size(); ++r) {
      const auto& s = sampled[r];
      std::copy_n(logits.data<float>() + r * vocab, vocab, row.begin());
      apply_penalties(s->params, s->seen, s->generated_counts, row.data(), vocab);
      const SampledToken t = sample_token(s->params, row.data(), vocab, s->rng);
      const size_t text_before = s->result.text.size();
      append_token(s, t);
      ++stats.generated_tokens;
      std::optional<FinishReason> done;
      if (t.id == eos && !s->params.ignore_eos) done = FinishReason::kEosToken;
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
        finish(s, *done);
        running.erase(std::find(running.begin(), running.end(), s));
      }
    }
    stats.step_seconds += model_secs;
    stats.schedule_seconds += std::chrono::duration<double>(Clock::now() - t0).count() - model_secs;
    ++stats.steps;
    stats.last_batch_size = static_cast<int64_t>(work.size());
  }

  std::lock_guard<std::mutex> lock(mu);
  stats.queue_length = static_cast<int64_t>(waiting.size() + incoming.size());
  stats.running = static_cast<int64_t>(running.size());
  stats.kv_blocks_free = alloc->num_free();
  stats.kv_blocks_used = alloc->num_blocks() - alloc->num_free();
  return !work.empty();
}

}  // namespace kestrel
