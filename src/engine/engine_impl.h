// The engine's internals shared by engine.cpp (handles, submit, the loop's
// life cycle) and engine_step.cpp (one scheduling step, the forward, sampling).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "grammar/constraint.h"
#include "kv/block_allocator.h"
#include "kv/kv_cache.h"
#include "text/tokenizer.h"

namespace kestrel {

using Clock = std::chrono::steady_clock;

// The candidates of one best_of request: the request finishes when the last
// of them does, with the best by cumulative logprob.
struct BestOfGroup {
  int32_t remaining = 1;  // candidates not finished (children join at the fork)
  bool failed = false;    // an error was already sent
  std::vector<GenerationResult> results;
};

struct Sequence {
  uint64_t id = 0;  // the request's id (shared by best_of candidates)
  std::shared_ptr<RequestHandle> handle;
  SamplingParams params;
  std::shared_ptr<const LoraAdapter> adapter;  // null: the base model
  std::vector<int32_t> tokens;                 // prompt + generated
  int64_t prompt_len = 0;
  int64_t n_computed = 0;  // tokens whose K/V are in the cache
  std::vector<int32_t> blocks;
  std::vector<uint64_t> hashes;  // chain hashes of the full blocks of `tokens`, as far as computed
  std::mt19937_64 rng;
  std::unordered_map<int32_t, int32_t> seen, generated_counts;
  GenerationResult result;
  std::optional<text::IncrementalDetokenizer> detok;
  Clock::time_point submitted, scheduled;
  bool started = false;
  int64_t admitted_order = 0;
  std::shared_ptr<BestOfGroup> group;  // best_of > 1
  // Structured output: the compile it waits for, then its matcher (from the first step on).
  std::shared_ptr<grammar::Pending> grammar_pending;
  std::shared_ptr<grammar::Matcher> matcher;
  bool forked = false;  // the best_of candidates were created
  // Gave its slot up to a tenant below its share (fair preemption): it waits again like a new
  // request, not ahead of the queue as a sequence preempted for blocks does.
  bool yielded = false;

  // Prompt logprobs asked for and not all computed yet.
  bool wants_prompt_logprobs() const {
    return params.prompt_logprobs && static_cast<int64_t>(result.prompt_tokens.size()) < prompt_len;
  }
};

// One sequence's share of a step: n new tokens from position n_computed.
struct StepWork {
  std::shared_ptr<Sequence> seq;
  int64_t n = 0;
  int64_t first_row = 0;               // its first row in the logits
  std::vector<int64_t> row_positions;  // token position of each of its logits rows
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
  bool grammar_ready = false;  // a compile finished: the loop looks at `compiling`
  std::vector<uint64_t> cancels;
  bool stopping = false;
  bool accepting = true;
  std::atomic<uint64_t> next_id{1};
  EngineStats stats;
  std::vector<double> step_overheads;  // seconds outside forward, per step (bounded)

  // Structured output's compiler, made at the first constrained request.
  std::once_flag grammar_once;
  std::unique_ptr<grammar::Compiler> grammar_compiler;
  grammar::Compiler& compiler();

  // Owned by the loop thread.
  std::deque<std::shared_ptr<Sequence>> compiling;  // waiting for their grammar's compile
  std::deque<std::shared_ptr<Sequence>> waiting;
  std::vector<std::shared_ptr<Sequence>> running;
  int64_t admit_counter = 0;
  std::thread loop;

  void run();
  bool step();
  void cancel_requested(const std::vector<uint64_t>& ids);
  void admit_compiled();  // moves sequences whose grammar is ready from compiling to waiting
  // Fills the bitmasks of the constrained rows among `sampled` (logits row of each: rows).
  void fill_grammar_masks(const std::vector<StepWork*>& sampled, std::vector<int32_t>& rows,
                          std::vector<int32_t>& bitmask);
  std::vector<StepWork> schedule();
  // Gives slots of tenants above their share to tenants waiting below it (a few a step).
  void preempt_for_fairness();
  // Fair admission across adapters: the waiting sequence to admit next (waiting is not empty).
  std::deque<std::shared_ptr<Sequence>>::iterator pick_waiting(
      const std::unordered_map<uint64_t, int64_t>& per_adapter);
  static uint64_t adapter_key(const Sequence& s);  // the adapter's cache key; 0: the base model
  void forward_and_sample(std::vector<StepWork>& work);
  void record_prompt_logprobs(const StepWork& w, const float* logits, int64_t vocab);
  std::vector<std::shared_ptr<Sequence>> fork_best_of(const std::shared_ptr<Sequence>& s);
  void after_sample(const std::shared_ptr<Sequence>& s, const SampledToken& t);
  void finish(const std::shared_ptr<Sequence>& s, FinishReason reason);
  void fail(const std::shared_ptr<Sequence>& s, const std::string& message, ErrorKind kind);
  void append_token(const std::shared_ptr<Sequence>& s, const SampledToken& t);
  // submit's two halves: validate and build a sequence; queue sequences at once.
  std::shared_ptr<Sequence> prepare(GenerationRequest req,
                                    std::function<void(EngineEvent)> callback);
  void enqueue(const std::vector<std::shared_ptr<Sequence>>& seqs);

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
  // Prefix cache: the hash of full block k of s (computed on first use).
  uint64_t block_hash(Sequence& s, size_t k);
  // Takes the longest cached prefix of a sequence holding no block (never its
  // last token, so there are logits); returns the tokens it covers.
  int64_t lookup_prefix(Sequence& s);
  // Publishes the blocks of s that became full since `old_computed`.
  void register_full_blocks(Sequence& s, int64_t old_computed);
};

}  // namespace kestrel
