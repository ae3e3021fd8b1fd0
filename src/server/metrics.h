// Server metrics in Prometheus text format with LoRAX's names
// (lorax_request_count, lorax_request_duration, ...) plus KV cache usage.
// Every method is thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "grammar/constraint.h"

namespace kestrel {
struct EngineStats;
}

namespace kestrel::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> buckets)
      : bounds_(std::move(buckets)), counts_(bounds_.size(), 0) {}
  void observe(double v);
  // "<name>_bucket{le=...} n" lines, _sum and _count.
  void render(const std::string& name, std::string& out) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound, not cumulative
  uint64_t count_ = 0;
  double sum_ = 0;
};

// What one finished request contributes.
struct RequestRecord {
  double total_seconds = 0;
  double queue_seconds = 0;
  double inference_seconds = 0;
  double first_token_seconds = -1;  // < 0: no token
  int64_t input_length = 0;
  int64_t generated_tokens = 0;
  int64_t max_new_tokens = 0;
  std::string adapter;  // the loaded adapter's canonical name, "" for the base model
};

// Per-adapter series beyond this many share one, adapter="__other__".
inline constexpr size_t kMaxAdapterSeries = 256;
inline constexpr const char* kOtherAdapters = "__other__";

class Metrics {
 public:
  Metrics();
  void request_started();
  void request_succeeded(const RequestRecord& r);
  // err: one of a fixed set ("validation", "overloaded", "generation", "cancelled", "adapter",
  // an error_type of http_error.h, ...), never request text: each is a series.
  void request_failed(const std::string& err);
  void set_in_flight(int64_t n);

  // The full exposition, with the engine's gauges.
  std::string render(const EngineStats& stats) const;
  // Structured output's compile figures (once a constrained request has arrived).
  static void render_grammar(const grammar::CompilerStats& stats, std::string& out);

 private:
  mutable std::mutex mu_;
  uint64_t requests_ = 0;
  uint64_t success_ = 0;
  std::map<std::string, uint64_t> failures_;
  int64_t in_flight_ = 0;
  Histogram duration_, queue_duration_, inference_duration_, time_per_token_, ttft_;
  Histogram generated_tokens_, input_length_, max_new_tokens_;
  struct PerAdapter {
    uint64_t requests = 0;
    uint64_t generated_tokens = 0;
  };
  std::map<std::string, PerAdapter> by_adapter_;  // finished requests; "" : the base model
};

}  // namespace kestrel::server
