// Fair admission across adapters: one adapter's backlog does not stand between another adapter's
// request (or the base model's) and the next free slot; with one adapter, admission stays FIFO.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "lora/lora_adapter.h"

namespace kestrel {
namespace {

const std::vector<LoraModule> kAllModules = {LoraModule::kQkv, LoraModule::kDense, LoraModule::kFc1,
                                             LoraModule::kFc2};

// Runs `requests` with at most `max_running` sequences at once and returns, in order, the first
// event of each request and every request's end: (index, true) at its first token, (index,
// false) when it ends. Events arrive on the engine's thread in step order, and within a step in
// admission order.
std::vector<std::pair<size_t, bool>> first_tokens_and_ends(
    const std::shared_ptr<const FalconModel>& model, std::vector<GenerationRequest> requests,
    int64_t max_running) {
  EngineOptions o;
  o.max_running_seqs = max_running;
  o.kv_cache_memory = 8 << 20;
  Engine engine(model, nullptr, o);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<size_t, bool>> events;
  std::vector<bool> seen(requests.size(), false);
  size_t finished = 0;
  const size_t n = requests.size();
  engine.submit_all(std::move(requests), [&](size_t i, EngineEvent e) {
    std::lock_guard<std::mutex> lock(mu);
    if (e.kind == EngineEvent::Kind::kToken && !seen[i]) {
      seen[i] = true;
      events.emplace_back(i, true);
    }
    if (e.kind != EngineEvent::Kind::kToken) {
      ++finished;
      events.emplace_back(i, false);
    }
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return finished == n; });
  return events;
}

// The order in which requests got their first token (index into `requests`), two at once.
std::vector<int> first_token_order(const std::shared_ptr<const FalconModel>& model,
                                   std::vector<GenerationRequest> requests) {
  std::vector<int> order;
  for (const auto& [i, first] : first_tokens_and_ends(model, std::move(requests), 2))
    if (first) order.push_back(static_cast<int>(i));
  return order;
}

// How many requests start before the first one finishes (the first wave of admissions), with
// `max_running` slots; every request makes the same number of tokens.
size_t first_wave(const std::shared_ptr<const FalconModel>& model,
                  std::vector<GenerationRequest> requests, int64_t max_running) {
  size_t n = 0;
  for (const auto& [i, first] : first_tokens_and_ends(model, std::move(requests), max_running)) {
    if (!first) break;
    ++n;
  }
  return n;
}

GenerationRequest under(std::shared_ptr<const LoraAdapter> adapter, int32_t first_token) {
  GenerationRequest r = test::greedy_request({first_token, 5, 9, 2}, 6);
  r.adapter = std::move(adapter);
  return r;
}

TEST(Fairness, QuietAdapterTakesTheNextSlot) {
  const auto model = test::load_fixture("falcon7b-mqa-parallel");
  const auto busy = model->random_adapter("busy", 4, kAllModules, 1);
  const auto quiet = model->random_adapter("quiet", 4, kAllModules, 2);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(under(busy, 10 + i));
  reqs.push_back(under(quiet, 20));
  const std::vector<int> order = first_token_order(model, std::move(reqs));
  ASSERT_EQ(order.size(), 6u);
  // FIFO would start the quiet request last; fair admission starts it beside the first busy one.
  EXPECT_EQ(order[0], 0);
  EXPECT_EQ(order[1], 5);
  EXPECT_EQ(std::vector<int>(order.begin() + 2, order.end()), (std::vector<int>{1, 2, 3, 4}));
}

TEST(Fairness, BaseModelIsATenantToo) {
  const auto model = test::load_fixture("falcon7b-mqa-parallel");
  const auto busy = model->random_adapter("busy", 4, kAllModules, 1);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(under(busy, 10 + i));
  reqs.push_back(under(nullptr, 30));
  const std::vector<int> order = first_token_order(model, std::move(reqs));
  ASSERT_EQ(order.size(), 5u);
  EXPECT_EQ(order[1], 4);
}

TEST(Fairness, OneAdapterStaysFifo) {
  const auto model = test::load_fixture("falcon7b-mqa-parallel");
  const auto a = model->random_adapter("a", 4, kAllModules, 1);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(under(a, 10 + i));
  EXPECT_EQ(first_token_order(model, std::move(reqs)), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  std::vector<GenerationRequest> base;
  for (int i = 0; i < 6; ++i) base.push_back(under(nullptr, 10 + i));
  EXPECT_EQ(first_token_order(model, std::move(base)), (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST(Fairness, TwoBusyAdaptersAlternate) {
  const auto model = test::load_fixture("falcon7b-mqa-parallel");
  const auto a = model->random_adapter("a", 4, kAllModules, 1);
  const auto b = model->random_adapter("b", 4, kAllModules, 2);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(under(a, 10 + i));  // 0..3
  for (int i = 0; i < 4; ++i) reqs.push_back(under(b, 20 + i));  // 4..7
  const std::vector<int> order = first_token_order(model, std::move(reqs));
  ASSERT_EQ(order.size(), 8u);
  // Two slots: one each; as each pair finishes together, the next of each starts.
  for (size_t k = 0; k < 8; k += 2) {
    std::vector<int> pair = {order[k], order[k + 1]};
    std::sort(pair.begin(), pair.end());
    EXPECT_EQ(pair, (std::vector<int>{static_cast<int>(k / 2), static_cast<int>(4 + k / 2)}))
        << "admission " << k;
  }
}

TEST(Fairness, ReserveKeepsSlotsForOtherTenants) {
  const auto model = test::load_fixture("falcon7b-mqa-parallel");
  const auto busy = model->random_adapter("busy", 4, kAllModules, 1);
  const auto quiet = model->random_adapter("quiet", 4, kAllModules, 2);
  // Alone, a busy adapter takes every slot.
  std::vector<GenerationRequest> alone;
  for (int i = 0; i < 12; ++i) alone.push_back(under(busy, 10 + i));
  EXPECT_EQ(first_wave(model, std::move(alone), 8), 8u);
  // Beside another tenant, it stops short of the last eighth (1 of 8 slots): the quiet request
  // and 6 busy ones start, one slot stays free.
  std::vector<GenerationRequest> mixed;
  for (int i = 0; i < 12; ++i) mixed.push_back(under(busy, 10 + i));
  mixed.push_back(under(quiet, 40));
  EXPECT_EQ(first_wave(model, std::move(mixed), 8), 7u);
}

TEST(Fairness, ATenantBelowItsShareTakesASlotFromOneAbove) {
  const auto model = test::load_fixture("falcon7b-mqa-parallel");
  const auto busy = model->random_adapter("busy", 4, kAllModules, 1);
  const auto quiet = model->random_adapter("quiet", 4, kAllModules, 2);
  auto busy_requests = [&] {
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 4; ++i) {
      GenerationRequest r = under(busy, 10 + i);
      r.params.max_new_tokens = 24;
      reqs.push_back(std::move(r));
    }
    return reqs;
  };
  EngineOptions o;
  o.max_running_seqs = 2;
  o.kv_cache_memory = 8 << 20;
  // Alone: the busy adapter's greedy outputs.
  std::vector<std::vector<int32_t>> alone;
  {
    Engine engine(model, nullptr, o);
    for (const auto& h : engine.submit_all(busy_requests())) alone.push_back(h->wait().token_ids);
  }
  // Both slots busy when the quiet request comes: it starts before any busy request ends, and
  // the busy request that gave its slot up resumes to the same tokens.
  Engine engine(model, nullptr, o);
  std::mutex mu;
  std::condition_variable cv;
  bool busy_started = false, quiet_started = false, busy_finished = false;
  bool quiet_before_finish = false;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  std::vector<std::vector<int32_t>> got(4);
  size_t done = 0;
  engine.submit_all(busy_requests(), [&](size_t i, EngineEvent e) {
    std::lock_guard<std::mutex> lock(mu);
    if (e.kind == EngineEvent::Kind::kToken) busy_started = true;
    if (e.kind == EngineEvent::Kind::kFinished) {
      busy_finished = true;
      got[i] = e.result->token_ids;
      ++done;
    }
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return busy_started; });
  }
  GenerationRequest q = under(quiet, 40);
  engine.submit(std::move(q), [&](EngineEvent e) {
    std::lock_guard<std::mutex> lock(mu);
    if (e.kind == EngineEvent::Kind::kToken && !quiet_started) {
      quiet_started = true;
      quiet_before_finish = !busy_finished;
    }
    if (e.kind != EngineEvent::Kind::kToken) ++done;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == 5; });
  EXPECT_TRUE(quiet_before_finish);
  EXPECT_EQ(got, alone);
  EXPECT_GE(engine.stats().preemptions, 1);
}

}  // namespace
}  // namespace kestrel
