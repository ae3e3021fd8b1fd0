// Structured output's compile cache and matchers over xgrammar's C++ core.
#include "grammar/constraint.h"

#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/logging.h"
#include "grammar/schema_check.h"
#include "text/tokenizer.h"

namespace kestrel::grammar {

const char* kind_name(Spec::Kind kind) {
  switch (kind) {
    case Spec::Kind::kJsonSchema:
      return "json_schema";
    case Spec::Kind::kJsonObject:
      return "json_object";
    case Spec::Kind::kRegex:
      return "regex";
  }
  return "unknown";
}

class Compiled {
 public:
  explicit Compiled(xgrammar::CompiledGrammar g) : grammar(std::move(g)) {}
  xgrammar::CompiledGrammar grammar;
};

struct Pending::State {
  std::atomic<bool> ready{false};
  mutable std::mutex mu;
  std::shared_ptr<const Compiled> grammar;
  std::string error;
  double seconds = 0;
  int64_t bytes = 0;  // the compiled grammar's memory, counted while the cache holds it
};

bool Pending::ready() const {
  return state_->ready.load(std::memory_order_acquire);
}
std::shared_ptr<const Compiled> Pending::grammar() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->grammar;
}
std::string Pending::error() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->error;
}
double Pending::seconds() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->seconds;
}

namespace {

// xgrammar's view of the vocabulary: every token as spelled in tokenizer.json (byte-level), the
// special ones as "" (xgrammar never allows those), padded with special ids to the logits' width.
xgrammar::TokenizerInfo tokenizer_info(const text::Tokenizer& tok, int64_t vocab, int32_t eos) {
  const int32_t n = std::min<int32_t>(tok.vocab_size(), static_cast<int32_t>(vocab));
  std::vector<std::string> encoded(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    if (id == eos || tok.is_special(id)) continue;
    try {
      encoded[id] = std::string(tok.token(id));
    } catch (const Error&) {  // an id with no token: never allowed
    }
  }
  return xgrammar::TokenizerInfo(encoded, xgrammar::VocabType::BYTE_LEVEL, static_cast<int>(vocab),
                                 std::vector<int32_t>{eos});
}

// The text requests with the same constraint share: a JSON schema compact, in its own key order
// (the order of `properties` is the order of the output), so whitespace does not split the cache.
std::string cache_key(const Spec& spec, const std::string& text) {
  return std::string(kind_name(spec.kind)) + '\n' + text;
}

// xgrammar's error for a client: without its log prefix ("[12:00:00] /path/file.cc:83: "), one
// line, bounded.
std::string client_message(std::string why) {
  const size_t cc = why.find(".cc:");
  if (!why.empty() && why[0] == '[' && cc != std::string::npos) {
    const size_t colon = why.find(": ", cc + 4);
    if (colon != std::string::npos) why = why.substr(colon + 2);
  }
  for (char& c : why) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!why.empty() && why.back() == ' ') why.pop_back();
  if (why.size() > 300) why = why.substr(0, 300) + "...";
  return why;
}

}  // namespace

struct Compiler::Impl {
  xgrammar::GrammarCompiler compiler;
  Options opt;
  std::function<void()> on_ready;

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  struct Job {
    xgrammar::Grammar grammar;
    std::shared_ptr<Pending::State> state;
    std::string key;
  };
  std::deque<Job> jobs;
  // LRU: most recently used first; the map points into the list.
  std::list<std::pair<std::string, std::shared_ptr<Pending::State>>> lru;
  std::unordered_map<std::string, decltype(lru)::iterator> index;
  CompilerStats stats;
  std::vector<std::thread> workers;

  Impl(const xgrammar::TokenizerInfo& info, Options o)
      : compiler(info, /*max_threads=*/std::max(1, o.threads), /*cache_enabled=*/false), opt(o) {}

  // Drops least recently used entries beyond the entry and byte bounds (never `keep`, the compile
  // that just finished). Requests holding a dropped grammar keep it. Called with mu held.
  void evict(const Pending::State* keep) {
    for (auto it = lru.end(); it != lru.begin() && (lru.size() > opt.cache_entries ||
                                                    stats.cached_bytes > opt.cache_bytes);) {
      --it;
      if (it->second.get() == keep) continue;
      stats.cached_bytes -= it->second->bytes;
      index.erase(it->first);
      it = lru.erase(it);
    }
  }

  void work() {
    for (;;) {
      std::optional<Job> next;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !jobs.empty(); });
        if (stopping) return;
        next.emplace(std::move(jobs.front()));
        jobs.pop_front();
      }
      Job& job = *next;
      const auto t0 = std::chrono::steady_clock::now();
      std::shared_ptr<const Compiled> done;
      std::string error;
      try {
        done = std::make_shared<const Compiled>(compiler.CompileGrammar(job.grammar));
      } catch (const std::exception& e) {
        error = e.what();
        spdlog::warn("grammar compile failed: {}", error);
      }
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const int64_t bytes = done ? static_cast<int64_t>(done->grammar.MemorySizeBytes()) : 0;
      {
        std::lock_guard<std::mutex> lock(job.state->mu);
        job.state->grammar = std::move(done);
        job.state->error = error;
        job.state->seconds = secs;
      }
      std::function<void()> notify;
      {
        std::lock_guard<std::mutex> lock(mu);
        ++stats.compiles;
        if (!error.empty()) ++stats.failures;
        stats.recent_seconds.push_back(secs);
        if (stats.recent_seconds.size() > 1024) {
          stats.recent_seconds.erase(stats.recent_seconds.begin());
        }
        if (index.count(job.key)) {  // still cached: count its memory, evict beyond the bound
          job.state->bytes = bytes;
          stats.cached_bytes += bytes;
          evict(job.state.get());
        }
        notify = on_ready;
      }
      job.state->ready.store(true,
                             std::memory_order_release);  // after the figures: tests read them
      if (notify) notify();
    }
  }
};

Compiler::Compiler(const text::Tokenizer& tokenizer, int64_t vocab, int32_t eos, Options options)
    : vocab_(vocab) {
  KESTREL_CHECK(vocab >= 1 && eos >= 0 && eos < vocab, "grammar compiler: eos ", eos,
                " outside the vocabulary of ", vocab);
  KESTREL_CHECK(options.cache_entries >= 1, "grammar compiler: the cache needs an entry");
  impl_ = std::make_unique<Impl>(tokenizer_info(tokenizer, vocab, eos), options);
  for (int i = 0; i < std::max(1, options.threads); ++i) {
    impl_->workers.emplace_back([this] { impl_->work(); });
  }
}

Compiler::~Compiler() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->workers) t.join();
}

void Compiler::set_on_ready(std::function<void()> on_ready) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->on_ready = std::move(on_ready);
}

CompilerStats Compiler::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

std::shared_ptr<Pending> Compiler::compile(const Spec& spec) {
  // Check and canonicalise on the caller's thread: a bad constraint is the request's 422.
  std::string text = spec.text;
  if (spec.kind == Spec::Kind::kJsonSchema) {
    const nlohmann::json schema = nlohmann::json::parse(spec.text, nullptr, false);
    if (schema.is_discarded()) throw ValidationError(spec.field, "the schema is not valid JSON");
    check_json_schema(schema, spec.field);
    text = nlohmann::ordered_json::parse(spec.text).dump();
  }
  if (spec.kind == Spec::Kind::kRegex && has_lookaround(spec.text)) {
    throw ValidationError(spec.field, "`" + spec.field +
                                          "` holds a lookaround ((?=, (?!, (?<=, (?<!), which "
                                          "structured output would not enforce");
  }
  const std::string key = cache_key(spec, text);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->index.find(key);
    if (it != impl_->index.end()) {
      impl_->lru.splice(impl_->lru.begin(), impl_->lru, it->second);
      ++impl_->stats.cache_hits;
      return std::make_shared<Pending>(it->second->second);
    }
  }
  // Text to grammar: milliseconds, and where xgrammar finds a regex or grammar invalid.
  xgrammar::Grammar g = [&] {
    try {
      switch (spec.kind) {
        case Spec::Kind::kJsonSchema:
          // Compact JSON with Python's separators (", ", ": "): no whitespace runs for a model to
          // loop in; strict: no properties or items the schema does not name.
          return xgrammar::Grammar::FromJSONSchema(text, /*any_whitespace=*/false);
        case Spec::Kind::kJsonObject:
          return xgrammar::Grammar::FromJSONSchema(R"({"type": "object"})",
                                                   /*any_whitespace=*/false, std::nullopt,
                                                   std::nullopt, /*strict_mode=*/false);
        case Spec::Kind::kRegex:
          return xgrammar::Grammar::FromRegex(spec.text);
      }
    } catch (const std::exception& e) {
      throw ValidationError(spec.field, "`" + spec.field + "` is not a valid " +
                                            kind_name(spec.kind) + ": " + client_message(e.what()));
    }
    throw ValidationError(spec.field, "unknown constraint kind");
  }();
  auto state = std::make_shared<Pending::State>();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->index.find(key);  // another thread may have queued it meanwhile
    if (it != impl_->index.end()) {
      ++impl_->stats.cache_hits;
      return std::make_shared<Pending>(it->second->second);
    }
    impl_->lru.emplace_front(key, state);
    impl_->index[key] = impl_->lru.begin();
    impl_->evict(state.get());
    impl_->jobs.push_back({std::move(g), state, key});
  }
  impl_->cv.notify_one();
  return std::make_shared<Pending>(state);
}

// ---- Matcher ----

struct Matcher::Impl {
  xgrammar::GrammarMatcher m;
};

Matcher::Matcher(const std::shared_ptr<const Compiled>& grammar)
    : impl_(std::make_unique<Impl>(Impl{xgrammar::GrammarMatcher(grammar->grammar)})) {}
Matcher::Matcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Matcher::~Matcher() = default;
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;

Matcher Matcher::fork() const {
  return Matcher(std::make_unique<Impl>(Impl{impl_->m.Fork()}));
}

bool Matcher::accept(int32_t token) {
  return impl_->m.AcceptToken(token);
}

bool Matcher::terminated() const {
  return impl_->m.IsTerminated();
}

void fill_bitmasks(const std::vector<Matcher*>& matchers, int32_t* bitmask, int64_t words,
                   int threads) {
  if (matchers.empty()) return;
  int64_t shape[2] = {static_cast<int64_t>(matchers.size()), words};
  DLTensor t{};
  t.data = bitmask;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 2;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  if (matchers.size() == 1 || threads <= 1) {
    for (size_t i = 0; i < matchers.size(); ++i) {
      matchers[i]->impl().m.FillNextTokenBitmask(&t, static_cast<int>(i));
    }
    return;
  }
  // The batch filler takes matchers by value; they share their state with ours (handles).
  std::vector<xgrammar::GrammarMatcher> ms;
  ms.reserve(matchers.size());
  for (Matcher* m : matchers) ms.push_back(m->impl().m);
  static thread_local std::unique_ptr<xgrammar::BatchGrammarMatcher> batch;
  static thread_local int batch_threads = 0;
  if (!batch || batch_threads != threads) {
    batch = std::make_unique<xgrammar::BatchGrammarMatcher>(threads);
    batch_threads = threads;
  }
  batch->BatchFillNextTokenBitmask(&ms, &t);
}

}  // namespace kestrel::grammar
