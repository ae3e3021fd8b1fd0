// The engine benchmark of `kestrel bench`: for each concurrency level C, a
// closed loop keeps C requests in flight (a finished one is replaced at once)
// until R requests are done; requests/s and generated tokens/s over the wall
// time, and the per-step time the engine spends outside the model's forward.
#include "cli/bench_engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>

#include "core/error.h"
#include "engine/engine.h"
#include "model/falcon_model.h"

namespace kestrel::cli {
namespace {

std::vector<int64_t> parse_levels(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream items(s);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    int64_t v = 0;
    try {
      v = std::stoll(item);
    } catch (const std::exception&) {
      KESTREL_FAIL("--engine-concurrency: \"", item, "\" is not a number");
    }
    KESTREL_CHECK(v >= 1, "--engine-concurrency: levels must be >= 1, got ", v);
    out.push_back(v);
  }
  return out;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

struct LevelResult {
  double wall_s = 0;
  int64_t requests = 0, generated = 0;
  EngineStats stats;
  std::vector<double> overheads;
};

LevelResult run_level(const std::shared_ptr<const FalconModel>& model, const EngineBenchArgs& a,
                      int64_t concurrency, int64_t n_requests, std::mt19937& rng) {
  EngineOptions o;
  o.block_size = a.block_size;
  o.max_input_length = a.prompt;
  o.max_total_tokens = a.prompt + a.new_tokens;
  o.max_running_seqs = std::max<int64_t>(concurrency, 1);
  o.num_blocks = concurrency * ((a.prompt + a.new_tokens + a.block_size - 1) / a.block_size) + 1;
  o.prefix_caching = true;
  Engine engine(model, nullptr, o);
  const int32_t vocab = static_cast<int32_t>(model->config().vocab_size);
  auto request = [&] {
    GenerationRequest r;
    r.prompt_ids.resize(a.prompt);
    for (auto& t : r.prompt_ids) t = static_cast<int32_t>(rng() % vocab);
    r.params.max_new_tokens = a.new_tokens;
    r.params.ignore_eos = true;
    return r;
  };
  std::mutex mu;
  std::condition_variable cv;
  int64_t done = 0, failed = 0;
  auto on_event = [&](EngineEvent e) {
    if (e.kind == EngineEvent::Kind::kToken) return;
    std::lock_guard<std::mutex> lock(mu);
    ++done;
    if (e.kind == EngineEvent::Kind::kError) ++failed;
    cv.notify_all();
  };
  const auto t0 = std::chrono::steady_clock::now();
  int64_t submitted = 0;
  for (; submitted < std::min(concurrency, n_requests); ++submitted)
    engine.submit(request(), on_event);
  {
    std::unique_lock<std::mutex> lock(mu);
    while (done < n_requests) {
      const int64_t in_flight = submitted - done;
      if (in_flight < concurrency && submitted < n_requests) {
        lock.unlock();
        engine.submit(request(), on_event);
        lock.lock();
        ++submitted;
        continue;
      }
      cv.wait(lock);
    }
  }
  LevelResult r;
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  KESTREL_CHECK(failed == 0, "engine bench: ", failed, " requests failed");
  r.requests = n_requests;
  engine.drain(std::chrono::milliseconds(1000));
  r.stats = engine.stats();
  r.generated = r.stats.generated_tokens;
  r.overheads = engine.step_overhead_seconds();
  return r;
}

}  // namespace

nlohmann::json run_engine_bench(const FalconModel& model, const EngineBenchArgs& a, bool quiet) {
  KESTREL_CHECK(a.prompt >= 1 && a.new_tokens >= 1,
                "--engine-prompt and --engine-new must be >= 1");
  // The engine shares the model; the caller keeps it alive.
  std::shared_ptr<const FalconModel> shared(&model, [](const FalconModel*) {});
  std::mt19937 rng(4321);
  nlohmann::json out = nlohmann::json::array();
  run_level(shared, a, 1, 1, rng);  // warm-up
  if (!quiet) {
    std::printf("engine, %lld-token prompts, %lld new tokens (greedy), requests kept in flight:\n",
                static_cast<long long>(a.prompt), static_cast<long long>(a.new_tokens));
  }
  for (int64_t c : parse_levels(a.concurrency)) {
    const int64_t n = a.requests > 0 ? a.requests : std::max<int64_t>(4 * c, 16);
    const LevelResult r = run_level(shared, a, c, n, rng);
    const double steps = static_cast<double>(std::max<int64_t>(r.stats.steps, 1));
    const double mean_oh = std::accumulate(r.overheads.begin(), r.overheads.end(), 0.0) /
                           static_cast<double>(std::max<size_t>(r.overheads.size(), 1));
    const double p99_oh = percentile(r.overheads, 0.99);
    const double model_ms = r.stats.step_seconds / steps * 1e3;
    const double mean_batch =
        static_cast<double>(r.stats.generated_tokens + r.stats.computed_prompt_tokens) / steps;
    out.push_back({{"concurrency", c},
                   {"requests", r.requests},
                   {"prompt", a.prompt},
                   {"new", a.new_tokens},
                   {"requests_s", r.requests / r.wall_s},
                   {"tok_s", r.generated / r.wall_s},
                   {"steps", r.stats.steps},
                   {"tokens_per_step", mean_batch},
                   {"model_ms_per_step", model_ms},
                   {"overhead_ms_mean", mean_oh * 1e3},
                   {"overhead_ms_p99", p99_oh * 1e3}});
    if (!quiet) {
      std::printf(
          "engine  c=%-3lld %4lld req %8.2f req/s %9.0f tok/s  %5lld steps  model %7.3f ms/step  "
          "overhead %.3f ms/step mean, %.3f p99\n",
          static_cast<long long>(c), static_cast<long long>(r.requests), r.requests / r.wall_s,
          r.generated / r.wall_s, static_cast<long long>(r.stats.steps), model_ms, mean_oh * 1e3,
          p99_oh * 1e3);
    }
  }
  return out;
}

}  // namespace kestrel::cli
