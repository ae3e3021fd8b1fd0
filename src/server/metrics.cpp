// Prometheus text exposition of the server's request metrics and the engine's gauges.
#include "server/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/engine.h"

namespace kestrel::server {
namespace {

std::vector<double> exponential(double start, double factor, int n) {
  std::vector<double> b;
  for (int i = 0; i < n; ++i, start *= factor) b.push_back(start);
  return b;
}

std::string fmt(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, const std::string& name, double v) {
  out += name;
  out += ' ';
  out += fmt(v);
  out += '\n';
}

// A Prometheus label value: backslash, double quote and newline escaped.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

void Histogram::observe(double v) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (v <= bounds_[i]) {
      ++counts_[i];
      break;
    }
  }
  ++count_;
  sum_ += v;
}

void Histogram::render(const std::string& name, std::string& out) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + fmt(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  sample(out, name + "_sum", sum_);
  out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : duration_(exponential(0.001, 2, 20)),
      queue_duration_(exponential(0.0001, 2, 20)),
      inference_duration_(exponential(0.001, 2, 20)),
      time_per_token_(exponential(0.0001, 2, 20)),
      ttft_(exponential(0.0005, 2, 20)),
      generated_tokens_(exponential(1, 2, 13)),
      input_length_(exponential(1, 2, 13)),
      max_new_tokens_(exponential(1, 2, 13)) {}

void Metrics::request_started() {
  std::lock_guard lock(mu_);
  ++requests_;
}

void Metrics::request_succeeded(const RequestRecord& r) {
  std::lock_guard lock(mu_);
  ++success_;
  duration_.observe(r.total_seconds);
  queue_duration_.observe(r.queue_seconds);
  inference_duration_.observe(r.inference_seconds);
  if (r.generated_tokens > 0) time_per_token_.observe(r.inference_seconds / r.generated_tokens);
  if (r.first_token_seconds >= 0) ttft_.observe(r.first_token_seconds);
  generated_tokens_.observe(static_cast<double>(r.generated_tokens));
  input_length_.observe(static_cast<double>(r.input_length));
  max_new_tokens_.observe(static_cast<double>(r.max_new_tokens));
  // Series are keyed by the loaded adapter's canonical name, and bounded: past kMaxAdapterSeries
  // names, the rest are counted together under kOtherAdapters.
  auto it = by_adapter_.find(r.adapter);
  if (it == by_adapter_.end())
    it =
        by_adapter_.try_emplace(by_adapter_.size() < kMaxAdapterSeries ? r.adapter : kOtherAdapters)
            .first;
  PerAdapter& a = it->second;
  ++a.requests;
  a.generated_tokens += static_cast<uint64_t>(std::max<int64_t>(0, r.generated_tokens));
}

void Metrics::request_failed(const std::string& err) {
  std::lock_guard lock(mu_);
  ++failures_[err];
}

void Metrics::set_in_flight(int64_t n) {
  std::lock_guard lock(mu_);
  in_flight_ = n;
}

std::string Metrics::render(const EngineStats& s) const {
  std::lock_guard lock(mu_);
  std::string out;
  out.reserve(16 << 10);
  header(out, "lorax_request_count", "counter", "Requests received (valid or not)");
  sample(out, "lorax_request_count", static_cast<double>(requests_));
  header(out, "lorax_request_success", "counter", "Requests that finished");
  sample(out, "lorax_request_success", static_cast<double>(success_));
  header(out, "lorax_request_failure", "counter", "Requests that failed, by error type");
  if (failures_.empty()) out += "lorax_request_failure{err=\"validation\"} 0\n";
  for (const auto& [err, n] : failures_)
    out += "lorax_request_failure{err=\"" + err + "\"} " + std::to_string(n) + "\n";
  header(out, "lorax_request_in_flight", "gauge", "Generation requests being served");
  sample(out, "lorax_request_in_flight", static_cast<double>(in_flight_));

  struct H {
    const char* name;
    const char* help;
    const Histogram* h;
  };
  const H hs[] = {
      {"lorax_request_duration", "Request duration in seconds", &duration_},
      {"lorax_request_queue_duration", "Seconds from submit to first scheduled", &queue_duration_},
      {"lorax_request_inference_duration", "Seconds from first scheduled to finished",
       &inference_duration_},
      {"lorax_request_mean_time_per_token_duration", "Inference seconds per generated token",
       &time_per_token_},
      {"lorax_request_time_to_first_token", "Seconds from arrival to the first generated token",
       &ttft_},
      {"lorax_request_generated_tokens", "Generated tokens per request", &generated_tokens_},
      {"lorax_request_input_length", "Prompt tokens per request", &input_length_},
      {"lorax_request_max_new_tokens", "max_new_tokens per request", &max_new_tokens_},
  };
  for (const H& h : hs) {
    header(out, h.name, "histogram", h.help);
    h.h->render(h.name, out);
  }

  // Per LoRA adapter (adapter="" : the base model, always listed).
  std::map<std::string, PerAdapter> per = by_adapter_;
  per.try_emplace("");
  header(out, "kestrel_adapter_requests_total", "counter",
         "Requests that finished, by adapter (adapter=\"\": the base model)");
  for (const auto& [name, a] : per)
    out += "kestrel_adapter_requests_total{adapter=\"" + label_value(name) + "\"} " +
           std::to_string(a.requests) + "\n";
  header(out, "kestrel_adapter_generated_tokens_total", "counter",
         "Tokens generated by finished requests, by adapter (adapter=\"\": the base model)");
  for (const auto& [name, a] : per)
    out += "kestrel_adapter_generated_tokens_total{adapter=\"" + label_value(name) + "\"} " +
           std::to_string(a.generated_tokens) + "\n";

  const struct {
    const char* name;
    const char* type;
    const char* help;
    double v;
  } gauges[] = {
      {"lorax_queue_length", "gauge", "Sequences waiting (including preempted)",
       double(s.queue_length)},
      {"lorax_batch_current_size", "gauge", "Sequences in the last step",
       double(s.last_batch_size)},
      {"lorax_batch_running", "gauge", "Sequences holding KV blocks", double(s.running)},
      {"kestrel_kv_blocks_total", "gauge", "KV cache blocks", double(s.kv_blocks_total)},
      {"kestrel_kv_blocks_used", "gauge", "KV blocks referenced by live sequences",
       double(s.kv_blocks_used)},
      {"kestrel_kv_blocks_free", "gauge", "KV blocks free or evictable", double(s.kv_blocks_free)},
      {"kestrel_kv_cache_usage", "gauge", "Fraction of KV blocks in use",
       s.kv_blocks_total > 0 ? double(s.kv_blocks_used) / double(s.kv_blocks_total) : 0.0},
      {"kestrel_preemptions_total", "counter", "Sequences preempted for KV blocks",
       double(s.preemptions)},
      {"kestrel_prefix_cache_hit_tokens_total", "counter",
       "Prompt tokens served from the prefix cache", double(s.prefix_cache_hit_tokens)},
      {"kestrel_prefix_cache_hits_total", "counter", "Admissions that reused cached KV blocks",
       double(s.prefix_cache_hits)},
      {"kestrel_kv_blocks_cached", "gauge", "Unreferenced KV blocks kept for the prefix cache",
       double(s.kv_blocks_cached)},
      {"kestrel_prompt_tokens_total", "counter", "Prompt tokens run through the model",
       double(s.computed_prompt_tokens)},
      {"kestrel_generated_tokens_total", "counter", "Tokens generated", double(s.generated_tokens)},
      {"kestrel_engine_steps_total", "counter", "Engine steps", double(s.steps)},
      {"kestrel_engine_step_seconds_total", "counter", "Model time over all steps", s.step_seconds},
      {"kestrel_engine_schedule_seconds_total", "counter", "Scheduling and sampling time",
       s.schedule_seconds},
      {"kestrel_grammar_compiling", "gauge", "Requests waiting for their grammar's compile",
       double(s.grammar_compiling)},
      {"kestrel_grammar_masked_rows_total", "counter", "Constrained rows masked",
       double(s.grammar_masked_rows)},
      {"kestrel_grammar_mask_seconds_total", "counter", "Time filling token bitmasks",
       s.grammar_mask_seconds},
  };
  for (const auto& g : gauges) {
    header(out, g.name, g.type, g.help);
    sample(out, g.name, g.v);
  }
  return out;
}

void Metrics::render_grammar(const grammar::CompilerStats& g, std::string& out) {
  header(out, "kestrel_grammar_compiles_total", "counter", "Grammars compiled (cache misses)");
  sample(out, "kestrel_grammar_compiles_total", double(g.compiles));
  header(out, "kestrel_grammar_compile_failures_total", "counter", "Grammar compiles that failed");
  sample(out, "kestrel_grammar_compile_failures_total", double(g.failures));
  header(out, "kestrel_grammar_cache_hits_total", "counter",
         "Constrained requests served by a cached or in-flight compile");
  sample(out, "kestrel_grammar_cache_hits_total", double(g.cache_hits));
  header(out, "kestrel_grammar_cache_bytes", "gauge", "Memory of the cached compiled grammars");
  sample(out, "kestrel_grammar_cache_bytes", double(g.cached_bytes));
  // Quantiles over the last compiles (at most 1024).
  std::vector<double> t = g.recent_seconds;
  std::sort(t.begin(), t.end());
  header(out, "kestrel_grammar_compile_seconds", "summary", "Grammar compile time (recent)");
  for (const auto& [q, label] : {std::pair{0.5, "0.5"}, {0.9, "0.9"}, {0.99, "0.99"}}) {
    const double v = t.empty() ? 0.0 : t[std::min(t.size() - 1, size_t(q * double(t.size())))];
    out +=
        std::string("kestrel_grammar_compile_seconds{quantile=\"") + label + "\"} " + fmt(v) + "\n";
  }
  double sum = 0;
  for (double v : t) sum += v;
  sample(out, "kestrel_grammar_compile_seconds_sum", sum);
  sample(out, "kestrel_grammar_compile_seconds_count", double(t.size()));
}

}  // namespace kestrel::server
