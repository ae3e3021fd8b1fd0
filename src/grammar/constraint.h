// Structured output (docs/structured-output.md): what a request's text must match, compiled once
// per distinct constraint off the step thread, and the per-sequence matcher whose token bitmask
// masks the logits each step.
//
// Compiler::compile checks a constraint on the caller's thread (a schema keyword that would not
// be enforced, an invalid schema or regex: a ValidationError naming the request field) and turns
// it into a grammar there (cheap), then leaves the expensive part, the per-token tables over the
// vocabulary, to a worker thread. Requests with the same constraint share one compile through a
// bounded LRU cache keyed by the constraint's canonical text, in flight or done.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kestrel::text {
class Tokenizer;
}

namespace kestrel::grammar {

struct Spec {
  enum class Kind : uint8_t {
    kJsonSchema,  // text: a JSON Schema (checked by check_json_schema)
    kJsonObject,  // any JSON object (text unused)
    kRegex,       // text: a regular expression the whole output must match
  };
  Kind kind = Kind::kJsonObject;
  std::string text;
  std::string field;  // the request field it came from, named by errors
};

// "json_schema", "json_object", "regex".
const char* kind_name(Spec::Kind kind);

class Compiled;  // a grammar compiled against the vocabulary (opaque; shared, immutable)

// One compile, pending until a worker finishes it; shared by every request that asked for it.
class Pending {
 public:
  bool ready() const;
  // After ready(): the grammar, or null when compiling failed (then error() says why).
  std::shared_ptr<const Compiled> grammar() const;
  std::string error() const;
  double seconds() const;  // the compile's time on its worker

  struct State;  // compiler-internal
  explicit Pending(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

struct CompilerStats {
  int64_t compiles = 0;    // finished compiles (cache misses)
  int64_t cache_hits = 0;  // requests served by a cached or in-flight compile
  int64_t failures = 0;
  int64_t cached_bytes = 0;            // held by the cache's compiled grammars
  std::vector<double> recent_seconds;  // the last compiles' times (at most 1024), oldest first
};

class Compiler {
 public:
  struct Options {
    int threads = 2;                         // compile workers
    size_t cache_entries = 512;              // distinct constraints kept
    int64_t cache_bytes = int64_t{1} << 30;  // and the memory their compiled tables may hold
  };
  // vocab: the width of the logits (the model's vocab_size, >= the tokenizer's); eos: the token
  // that ends a sequence, the only one a complete grammar allows.
  Compiler(const text::Tokenizer& tokenizer, int64_t vocab, int32_t eos, Options options);
  ~Compiler();
  Compiler(const Compiler&) = delete;
  Compiler& operator=(const Compiler&) = delete;

  // Checks `spec` (throws ValidationError naming spec.field) and returns its compile, started on a
  // worker unless the cache has it. on_ready runs on the worker when the compile finishes.
  std::shared_ptr<Pending> compile(const Spec& spec);
  void set_on_ready(std::function<void()> on_ready);

  // Words of one row's bitmask: bit j of word j / 32 set = token j allowed.
  int64_t bitmask_words() const { return (vocab_ + 31) / 32; }
  int64_t vocab() const { return vocab_; }
  CompilerStats stats() const;

  struct Impl;

 private:
  int64_t vocab_;
  std::unique_ptr<Impl> impl_;
};

// The state of one constrained sequence in its grammar.
class Matcher {
 public:
  explicit Matcher(const std::shared_ptr<const Compiled>& grammar);
  ~Matcher();
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;
  // An independent copy of the state (best_of candidates).
  Matcher fork() const;

  // Advances by one generated token; false when the grammar does not allow it (the state is
  // unchanged then).
  bool accept(int32_t token);
  // Whether the grammar accepted the end-of-sequence token: nothing may follow.
  bool terminated() const;

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit Matcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Fills the next-token bitmasks of several matchers, rows of `words` int32 each (row i for
// matchers[i]), on up to `threads` threads.
void fill_bitmasks(const std::vector<Matcher*>& matchers, int32_t* bitmask, int64_t words,
                   int threads);

}  // namespace kestrel::grammar
