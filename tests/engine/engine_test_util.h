// Helpers shared by the engine tests: fixture models, greedy requests, and
// stats read once the engine is idle.
#pragma once

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "../model/fixture_util.h"
#include "engine/engine.h"
#include "model/falcon_model.h"

namespace kestrel::test {

inline std::shared_ptr<const FalconModel> load_fixture(const std::string& name) {
  return std::make_shared<const FalconModel>(FalconModel::load(fixture_dir(name)));
}

inline GenerationRequest greedy_request(std::vector<int32_t> prompt, int64_t n) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.max_new_tokens = n;
  r.params.ignore_eos = true;
  return r;
}

// Stats are published at step boundaries: wait for the step that ended the
// last request to publish them.
inline EngineStats stats_when_idle(const Engine& engine) {
  for (int i = 0; i < 500; ++i) {
    EngineStats st = engine.stats();
    if (st.running == 0 && st.queue_length == 0) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return engine.stats();
}

// Transformers' greedy continuation (12 tokens) of fixture prompt p.
inline std::vector<int32_t> fixture_greedy_ids(const Expected& exp, size_t p) {
  return {exp.i64("greedy_ids") + p * 12, exp.i64("greedy_ids") + (p + 1) * 12};
}

}  // namespace kestrel::test
