// The engine's life cycle: request handles, submit and its validation, cancel,
// drain, the loop thread, and how a request ends (finish, best_of selection,
// errors). One step of the loop is in engine_step.cpp.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/logging.h"
#include "engine/engine_impl.h"
#include "model/falcon_model.h"

namespace kestrel {

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
    if (e->kind == EngineEvent::Kind::kError) throw Error(e->error, e->error_kind);
  }
  throw Error("request already finished");
}

// ---- Engine ----

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
  // The model shapes the cache: with tensor parallelism one rank cache per rank.
  const int64_t block_bytes = m.model->kv_bytes_per_block(options.block_size);
  int64_t blocks = options.num_blocks;
  if (blocks <= 0) blocks = options.kv_cache_memory / block_bytes;
  KESTREL_CHECK(blocks >= 1, "the KV cache holds no block: raise --kv-cache-memory");
  m.cache = std::make_unique<KvCache>(m.model->make_kv_cache(blocks, options.block_size));
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
               blocks * block_bytes / 1048576.0);
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

std::vector<double> Engine::step_overhead_seconds() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->step_overheads;
}

grammar::Compiler& Engine::Impl::compiler() {
  std::call_once(grammar_once, [this] {
    const FalconConfig& c = model->config();
    grammar::Compiler::Options o;
    // Workers: several new schemas at once each compile on their own (up to 8).
    o.threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u));
    grammar_compiler = std::make_unique<grammar::Compiler>(*tokenizer, c.vocab_size,
                                                           static_cast<int32_t>(c.eos_token_id), o);
    grammar_compiler->set_on_ready([this] {
      {
        std::lock_guard<std::mutex> lock(mu);
        grammar_ready = true;
      }
      cv.notify_all();
    });
  });
  return *grammar_compiler;
}

std::optional<grammar::CompilerStats> Engine::grammar_stats() const {
  if (!impl_->grammar_compiler) return std::nullopt;
  return impl_->grammar_compiler->stats();
}

// Validates one request and makes its sequence (not yet queued).
std::shared_ptr<Sequence> Engine::Impl::prepare(GenerationRequest req,
                                                std::function<void(EngineEvent)> callback) {
  Impl& m = *this;
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
  s->adapter = req.adapter;
  s->prompt_len = n;
  s->tokens = std::move(req.prompt_ids);
  const uint64_t seed = req.params.seed ? *req.params.seed : std::random_device{}();
  s->rng.seed(seed);
  s->result.seed = seed;
  s->result.prompt_length = n;
  for (int32_t id : s->tokens) ++s->seen[id];
  if (m.tokenizer) s->detok.emplace(*m.tokenizer, s->tokens);
  if (s->params.prompt_logprobs) {  // the first prompt token has no logprob
    TokenInfo first;
    first.id = s->tokens[0];
    first.logprob = std::numeric_limits<float>::quiet_NaN();
    if (m.tokenizer) first.text = m.tokenizer->decode(std::vector<int32_t>{first.id});
    s->result.prompt_tokens.push_back(std::move(first));
  }
  if (s->params.best_of > 1) s->group = std::make_shared<BestOfGroup>();
  if (req.constraint) {
    if (!m.tokenizer) {
      throw ValidationError(req.constraint->field, "structured output needs the model's tokenizer");
    }
    s->grammar_pending = m.compiler().compile(*req.constraint);  // checks it; compiles off-thread
  }
  s->submitted = Clock::now();
  return s;
}

void Engine::Impl::enqueue(const std::vector<std::shared_ptr<Sequence>>& seqs) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!accepting || stopping) throw Error("the engine is shutting down", ErrorKind::kUnavailable);
    for (const auto& s : seqs) incoming.push_back(s);
    stats.queue_length += static_cast<int64_t>(seqs.size());
  }
  cv.notify_all();
}

std::shared_ptr<RequestHandle> Engine::submit(GenerationRequest req,
                                              std::function<void(EngineEvent)> callback) {
  auto s = impl_->prepare(std::move(req), std::move(callback));
  impl_->enqueue({s});
  return s->handle;
}

std::vector<std::shared_ptr<RequestHandle>> Engine::submit_all(
    std::vector<GenerationRequest> reqs, std::function<void(size_t, EngineEvent)> callback) {
  std::vector<std::shared_ptr<Sequence>> seqs;
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::function<void(EngineEvent)> cb;
    if (callback) cb = [callback, i](EngineEvent e) { callback(i, std::move(e)); };
    seqs.push_back(impl_->prepare(std::move(reqs[i]), std::move(cb)));
  }
  impl_->enqueue(seqs);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const auto& s : seqs) handles.push_back(s->handle);
  return handles;
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

static double cumulative_logprob(const GenerationResult& r) {
  double sum = 0.0;
  for (const TokenInfo& t : r.tokens) sum += t.logprob;
  return sum;
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
  if (!s->group) {
    e.result = std::make_shared<GenerationResult>(s->result);
    s->handle->push(std::move(e));
    return;
  }
  // best_of: the request ends with its last candidate, the best (highest
  // cumulative logprob) as the result and the others after it, best first.
  BestOfGroup& g = *s->group;
  g.results.push_back(s->result);
  if (--g.remaining > 0 || g.failed) return;
  std::stable_sort(g.results.begin(), g.results.end(),
                   [](const GenerationResult& a, const GenerationResult& b) {
                     return cumulative_logprob(a) > cumulative_logprob(b);
                   });
  auto best = std::make_shared<GenerationResult>(std::move(g.results.front()));
  best->best_of_sequences.assign(std::make_move_iterator(g.results.begin() + 1),
                                 std::make_move_iterator(g.results.end()));
  g.results.clear();
  e.result = std::move(best);
  s->handle->push(std::move(e));
}

void Engine::Impl::fail(const std::shared_ptr<Sequence>& s, const std::string& message,
                        ErrorKind kind) {
  if (s->group) {
    if (s->group->failed) return;
    s->group->failed = true;
  }
  EngineEvent ev;
  ev.kind = EngineEvent::Kind::kError;
  ev.error = message;
  ev.error_kind = kind;
  s->handle->push(std::move(ev));
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
  if (s->group) return;  // best_of candidates do not stream
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
               !running.empty() || grammar_ready;
      });
      if (stopping) break;
    }
    try {
      step();
    } catch (const std::exception& e) {
      // A failed step must not take the process down: end what was in it.
      spdlog::error("engine step failed: {}", e.what());
      for (auto& s : running) {
        free_blocks(*s);
        fail(s, "inference failed (the server log has the details)", ErrorKind::kInternal);
      }
      running.clear();
    }
  }
  // Shutdown: every unfinished request ends with an error.
  std::lock_guard<std::mutex> lock(mu);
  for (auto* q : {&incoming, &compiling, &waiting}) {
    for (auto& s : *q)
      fail(s, "the server is shutting down: the request did not finish in time",
           ErrorKind::kUnavailable);
    q->clear();
  }
  for (auto& s : running) {
    free_blocks(*s);
    fail(s, "the server is shutting down: the request did not finish in time",
         ErrorKind::kUnavailable);
  }
  running.clear();
}

}  // namespace kestrel
