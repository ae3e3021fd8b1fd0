// `kestrel bench`'s engine benchmark: closed-loop load on a whole Engine
// (scheduler, batching, sampling) over a model already loaded, at several
// concurrency levels.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace kestrel {
class FalconModel;
}

namespace kestrel::cli {

struct EngineBenchArgs {
  std::string concurrency = "1,8,64";  // requests kept in flight, one run per level
  int64_t prompt = 64;                 // random prompt tokens per request
  int64_t new_tokens = 32;             // generated tokens per request (EOS ignored, greedy)
  int64_t requests = 0;                // per level; 0: max(4 x concurrency, 16)
  int64_t block_size = 16;
};

// One JSON object per level: requests_s, tok_s (generated), and the step
// overhead outside the forward (mean, p99), printed as a table unless quiet.
nlohmann::json run_engine_bench(const FalconModel& model, const EngineBenchArgs& a, bool quiet);

}  // namespace kestrel::cli
