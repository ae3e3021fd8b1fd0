// The engine over a tensor-parallel model (2 CPU ranks, in-process communicator): greedy outputs
// equal the single-rank engine's and transformers', alone and inside a busy batch with chunked
// prefill and preemption (checked to happen); the engine sizes one rank cache per rank.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "../model/fixture_util.h"
#include "engine/engine.h"
#include "model/falcon_model.h"

namespace kestrel {
namespace {

using test::Expected;
using test::fixture_dir;

GenerationRequest greedy_request(std::vector<int32_t> prompt, int64_t n) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.params.max_new_tokens = n;
  r.params.ignore_eos = true;
  return r;
}

std::vector<std::vector<int32_t>> serve(const std::shared_ptr<const FalconModel>& model,
                                        const std::vector<std::vector<int32_t>>& prompts,
                                        EngineOptions opt, int64_t* preemptions) {
  Engine engine(model, nullptr, opt);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const auto& p : prompts) handles.push_back(engine.submit(greedy_request(p, 12)));
  std::vector<std::vector<int32_t>> out;
  for (auto& h : handles) out.push_back(h->wait().token_ids);
  // Stats are published at step boundaries: wait for the last step's.
  for (int i = 0; i < 500 && (engine.stats().running || engine.stats().queue_length); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  *preemptions = engine.stats().preemptions;
  return out;
}

TEST(EngineTensorParallel, GreedyEqualsSingleRank) {
  for (const char* name : {"falcon7b-mqa-parallel", "falcon40b-gqa", "rw-mha-sequential-bias"}) {
    SCOPED_TRACE(name);
    const Expected exp(name);
    auto single = std::make_shared<const FalconModel>(FalconModel::load(fixture_dir(name)));
    auto tp =
        std::make_shared<const FalconModel>(FalconModel::load(fixture_dir(name), Device::kCpu, 2));
    // The fixture prompts plus random ones, all at once.
    std::vector<std::vector<int32_t>> prompts = exp.prompts;
    std::mt19937 rng(5);
    for (int i = 0; i < 12; ++i) {
      std::vector<int32_t> p(1 + rng() % 30);
      for (auto& t : p) t = static_cast<int32_t>(rng() % single->config().vocab_size);
      prompts.push_back(p);
    }
    for (EngineOptions opt : {EngineOptions{}, [] {
                                EngineOptions o;  // small budget and cache: chunks, preemption
                                o.max_batch_prefill_tokens = 16;
                                o.num_blocks = 24;
                                o.block_size = 4;
                                o.max_input_length = 64;
                                o.max_total_tokens = 80;
                                return o;
                              }()}) {
      int64_t preempted_single = 0, preempted_tp = 0;
      const auto want = serve(single, prompts, opt, &preempted_single);
      const auto got = serve(tp, prompts, opt, &preempted_tp);
      EXPECT_EQ(got, want);
      if (opt.num_blocks > 0) EXPECT_GT(preempted_tp, 0) << "the small cache should preempt";
      for (size_t p = 0; p < exp.prompts.size(); ++p) {
        std::vector<int32_t> ids(exp.i64("greedy_ids") + p * 12,
                                 exp.i64("greedy_ids") + (p + 1) * 12);
        EXPECT_EQ(got[p], ids) << "prompt " << p;
      }
    }
  }
}

}  // namespace
}  // namespace kestrel
