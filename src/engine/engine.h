// Engine: owns the model, the paged KV cache and the scheduler, and runs the
// step loop on its own thread. submit() is thread-safe and returns a handle
// that streams the request's tokens; cancel() frees what a request holds at the
// next step boundary.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "engine/request.h"
#include "grammar/constraint.h"

namespace kestrel {

class FalconModel;
namespace text {
class Tokenizer;
}

struct EngineOptions {
  int64_t block_size = 16;
  int64_t num_blocks = 0;                   // KV blocks; 0: from kv_cache_memory
  int64_t kv_cache_memory = 256 << 20;      // bytes, when num_blocks is 0
  int64_t max_batch_prefill_tokens = 4096;  // token budget per step (decode first, then prefill)
  int64_t max_running_seqs = 128;
  int64_t max_input_length = 1024;     // prompt tokens per request
  int64_t max_total_tokens = 2048;     // prompt + new tokens per request
  int64_t max_batch_total_tokens = 0;  // tokens in the KV cache at once; 0: what it holds
  bool prefix_caching = true;          // share full blocks of equal token prefixes (LRU-evicted)
};

struct EngineStats {
  int64_t queue_length = 0;  // waiting (incl. preempted) sequences
  int64_t running = 0;       // sequences holding KV blocks
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;  // free or evictable (cached, unreferenced)
  int64_t kv_blocks_used = 0;  // referenced by a live sequence
  int64_t preemptions = 0;
  int64_t kv_blocks_cached = 0;         // of the free ones: unreferenced prefix-cache blocks
  int64_t prefix_cache_hits = 0;        // admissions that reused cached blocks
  int64_t prefix_cache_hit_tokens = 0;  // tokens served from the prefix cache (not computed)
  int64_t computed_prompt_tokens = 0;   // prompt tokens run through the model
  int64_t generated_tokens = 0;
  int64_t steps = 0;
  int64_t last_batch_size = 0;  // sequences in the last step
  double step_seconds = 0;      // model time over all steps
  double schedule_seconds = 0;  // scheduler + sampling time over all steps
  // Structured output: requests waiting for their grammar's compile, and the time spent filling
  // token bitmasks (rows constrained, over all steps).
  int64_t grammar_compiling = 0;
  int64_t grammar_masked_rows = 0;
  double grammar_mask_seconds = 0;
};

// The consumer's side of one request. Events arrive in order: kToken*, then
// one kFinished or kError.
class RequestHandle {
 public:
  uint64_t id() const { return id_; }
  // Blocks until the next event; nullopt once the final event was taken.
  std::optional<EngineEvent> next();
  // Blocks until the request ends; throws kestrel::Error on kError.
  GenerationResult wait();

 private:
  friend class Engine;
  explicit RequestHandle(uint64_t id) : id_(id) {}
  void push(EngineEvent event);

  uint64_t id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<EngineEvent> events_;
  bool done_ = false;                          // the final event was taken
  std::function<void(EngineEvent)> callback_;  // when set, events go here instead
};

class Engine {
 public:
  // tokenizer may be null (then no token text and no stop sequences).
  Engine(std::shared_ptr<const FalconModel> model, std::shared_ptr<const text::Tokenizer> tokenizer,
         EngineOptions options);
  ~Engine();  // stops the loop; unfinished requests end with a kError of kind kUnavailable
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates (throws ValidationError naming the field: prompt too long for
  // max_input_length, max_new_tokens beyond max_total_tokens, a request that
  // could not fit the KV cache even alone, bad sampling parameters) and queues.
  // With a callback, events are delivered by calling it on the engine thread
  // (it must not block); otherwise they are read from the handle.
  std::shared_ptr<RequestHandle> submit(GenerationRequest request,
                                        std::function<void(EngineEvent)> callback = nullptr);
  // Validates every request (the first bad one throws and none is queued), then
  // queues them all at once, so that they start in the same step: the batches,
  // and so the numerics, do not depend on thread timing (kestrel generate).
  // With a callback, request i's events are delivered by calling it with i (as submit's).
  std::vector<std::shared_ptr<RequestHandle>> submit_all(
      std::vector<GenerationRequest> requests,
      std::function<void(size_t index, EngineEvent)> callback = nullptr);
  // Ends the request at the next step boundary (kFinished with kCancelled)
  // and frees its blocks. Unknown or finished ids are ignored.
  void cancel(uint64_t request_id);

  EngineStats stats() const;
  // Structured output's compile counts and times; nullopt before the first constrained request.
  std::optional<grammar::CompilerStats> grammar_stats() const;
  // Seconds each step spent in the engine outside the model's forward
  // (scheduling, batch building, sampling, stop checks), one per step so far.
  std::vector<double> step_overhead_seconds() const;
  const EngineOptions& options() const;
  const FalconModel& model() const;
  const text::Tokenizer* tokenizer() const;
  // Stops accepting, lets in-flight requests finish (up to `timeout`), stops the loop.
  void drain(std::chrono::milliseconds timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kestrel
