// LoRA decode steps replayed as CUDA graphs (the adapters' segment tables in the graph's static
// inputs) against the same steps run eagerly on CUDA and on the CPU, fed the same tokens: mixed
// batches (adapter and base rows interleaved), other adapters every step, ranks 2 to 16, F16 and
// bf16 adapters, and an adapter loaded after the captures replaying the same graphs (the
// capture and replay counters say so). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <thread>

#include "backend/ops.h"
#include "fixture_util.h"
#include "model/falcon_model.h"
#include "seq_batch.h"

namespace kestrel {
namespace {

constexpr int64_t kBlockSize = 16;
constexpr int64_t kBlocksPerSeq = 8;  // 128 tokens of room per sequence

using test::Seq;

ForwardBatch make_batch(const std::vector<Seq*>& seqs) {
  return test::make_batch(seqs, kBlockSize, kBlocksPerSeq);
}

double rel(const Tensor& got, const Tensor& ref) {
  double err = 0, mx = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    err = std::max(err, std::abs(double{got.data<float>()[i]} - ref.data<float>()[i]));
    mx = std::max(mx, std::abs(double{ref.data<float>()[i]}));
  }
  return err / mx;
}

// One adapter on both devices (cpu may be null: a CUDA-only adapter, checked against eager).
struct Pair {
  std::shared_ptr<const LoraAdapter> gpu, cpu;
};

// The same schedule on three caches: CUDA with graphs, CUDA eager, and (when given) the CPU.
class LoraGraphRun {
 public:
  LoraGraphRun(FalconModel& gpu, const FalconModel* cpu)
      : gpu_(gpu),
        cpu_(cpu),
        g_(gpu.make_kv_cache(16 * kBlocksPerSeq, kBlockSize)),
        e_(gpu.make_kv_cache(16 * kBlocksPerSeq, kBlockSize)) {
    if (cpu) c_ = std::make_unique<KvCache>(cpu->make_kv_cache(16 * kBlocksPerSeq, kBlockSize));
  }

  Seq* join(int64_t len, const Pair* ad) {
    seqs_.push_back(std::make_unique<Seq>());
    Seq* s = seqs_.back().get();
    s->id = static_cast<int64_t>(seqs_.size()) - 1;
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab() - 1));
    for (int64_t i = 0; i < len; ++i) s->tokens.push_back(tok(rng_));
    step({s}, {ad}, /*decode=*/false);
    return s;
  }

  // One step; ads[i]: sequence i's adapter (null: the base model). Eager CUDA picks the tokens.
  void step(const std::vector<Seq*>& seqs, const std::vector<const Pair*>& ads,
            bool decode = true) {
    ForwardBatch b = make_batch(seqs);
    ForwardBatch bc = b;
    bool any = false;
    for (const Pair* p : ads) {
      b.adapters.push_back(p ? p->gpu.get() : nullptr);
      bc.adapters.push_back(p && p->cpu ? p->cpu.get() : nullptr);
      any = any || p;
    }
    if (!any) b.adapters.clear(), bc.adapters.clear();
    // One new token per sequence replays a graph, a 1-token prompt's prefill too.
    const int64_t expect = b.n_tokens() == b.n_seqs() ? 1 : 0;
    EXPECT_TRUE(!decode || expect == 1);
    const int64_t replays = gpu_.graph_stats().replays;
    const Tensor lg = gpu_.forward(b, g_);
    EXPECT_EQ(gpu_.graph_stats().replays - replays, expect)
        << "a step of " << seqs.size() << " sequences, " << b.n_tokens() << " tokens";
    gpu_.set_cuda_graphs(false);
    const Tensor le = gpu_.forward(b, e_);
    gpu_.set_cuda_graphs(true);
    const double ge = rel(lg, le);
    EXPECT_LE(ge, 1e-2) << "graph vs eager, step of " << seqs.size();
    worst_eager_ = std::max(worst_eager_, ge);
    const bool cpu_ok =
        cpu_ && std::all_of(ads.begin(), ads.end(), [](const Pair* p) { return !p || p->cpu; });
    if (cpu_ok) {
      const Tensor lc = cpu_->forward(bc, *c_);
      const double gc = rel(lg, lc);
      EXPECT_LE(gc, 2e-2) << "graph vs cpu, step of " << seqs.size();
      worst_cpu_ = std::max(worst_cpu_, gc);
    } else if (cpu_) {
      cpu_->forward(bc, *c_);  // keeps the CPU cache in step (its logits are not compared)
    }
    const int64_t v = vocab();
    for (size_t r = 0; r < seqs.size(); ++r) {
      const float* er = le.data<float>() + r * v;
      const float* gr = lg.data<float>() + r * v;
      const int64_t best = std::max_element(er, er + v) - er;
      float second = -INFINITY;
      for (int64_t i = 0; i < v; ++i)
        if (i != best) second = std::max(second, er[i]);
      if (er[best] - second > 0.05f * std::abs(er[best]) + 1e-3f) {
        EXPECT_EQ(std::max_element(gr, gr + v) - gr, best) << "row " << r;
        ++checked_;
      }
      seqs[r]->computed = static_cast<int64_t>(seqs[r]->tokens.size());
      seqs[r]->tokens.push_back(static_cast<int32_t>(best));
    }
  }

  int64_t vocab() const { return gpu_.config().vocab_size; }
  double worst_eager() const { return worst_eager_; }
  double worst_cpu() const { return worst_cpu_; }
  int64_t checked() const { return checked_; }

 private:
  FalconModel& gpu_;
  const FalconModel* cpu_;
  KvCache g_, e_;
  std::unique_ptr<KvCache> c_;
  std::vector<std::unique_ptr<Seq>> seqs_;
  std::mt19937 rng_{11};
  double worst_eager_ = 0, worst_cpu_ = 0;
  int64_t checked_ = 0;
};

class CudaLoraGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (ops::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  }
};

// A lora-* fixture's adapters: steps of 6 sequences (bucket 8) whose adapters rotate every step
// (base rows among them), then 3 (bucket 4); then an adapter loaded after the captures (a fresh
// copy of the first: new device addresses) replays the same graphs.
void run_fixture(const std::string& fixture, const std::string& base,
                 const std::vector<std::string>& names) {
  FalconModel gpu = FalconModel::load(test::fixture_dir(base), Device::kCuda);
  const FalconModel cpu = FalconModel::load(test::fixture_dir(base));
  const std::string dir = test::fixture_dir(fixture) + "/adapters/";
  std::vector<Pair> ads;
  for (const std::string& n : names)
    ads.push_back({gpu.load_adapter(dir + n, n), cpu.load_adapter(dir + n, n)});
  LoraGraphRun run(gpu, &cpu);
  std::vector<Seq*> seqs;
  for (int64_t i = 0; i < 6; ++i)
    seqs.push_back(run.join(3 + 7 * i, i % 3 == 0 ? nullptr : &ads[i % ads.size()]));
  const int64_t n_ads = static_cast<int64_t>(ads.size());
  auto assign = [&](int64_t step, size_t n) {
    std::vector<const Pair*> out;
    for (size_t j = 0; j < n; ++j) {
      const int64_t k = (step + static_cast<int64_t>(j)) % (n_ads + 1);
      out.push_back(k == n_ads ? nullptr : &ads[k]);
    }
    return out;
  };
  for (int64_t st = 0; st < 5; ++st) run.step(seqs, assign(st, seqs.size()));
  const std::vector<Seq*> three(seqs.begin(), seqs.begin() + 3);
  for (int64_t st = 0; st < 3; ++st) run.step(three, assign(st, 3));
  const FalconModel::GraphStats before = gpu.graph_stats();
  EXPECT_GE(before.captures, 2);  // (8, 16, bound) and (4, 16, bound)

  Pair fresh{gpu.load_adapter(dir + names[0], "fresh"), cpu.load_adapter(dir + names[0], "fresh")};
  std::vector<const Pair*> with_fresh = assign(0, seqs.size());
  with_fresh[1] = &fresh;
  with_fresh[4] = &fresh;
  run.step(seqs, with_fresh);
  with_fresh = assign(1, 3);
  with_fresh[0] = &fresh;
  run.step(three, with_fresh);
  const FalconModel::GraphStats after = gpu.graph_stats();
  EXPECT_EQ(after.captures, before.captures) << "a new adapter forced a new capture";
  EXPECT_EQ(after.replays - before.replays, 2);
  EXPECT_GT(run.checked(), 20);
  std::printf(
      "[ lora graphs ] %s: %lld captures, %lld replays, worst rel error vs eager %.3g, vs cpu "
      "%.3g, %lld argmax checked\n",
      fixture.c_str(), static_cast<long long>(after.captures),
      static_cast<long long>(after.replays), run.worst_eager(), run.worst_cpu(),
      static_cast<long long>(run.checked()));
}

// Ranks 8 (bf16, from F32), 4 (r % 8 != 0: scalar b loads) and 16 (F16 kept F16).
TEST_F(CudaLoraGraphTest, Falcon40bGqaAdaptersGraphsMatchEagerAndCpu) {
  run_fixture("lora-falcon40b-gqa", "falcon40b-gqa",
              {"a1-r8-attn", "a2-r4-mlp", "a3-r16-all-rslora-f16"});
}

// Parallel attention with one LayerNorm (qkv and fc1 read the same x), rank 2 qkv-only.
TEST_F(CudaLoraGraphTest, Falcon7bMqaAdaptersGraphsMatchEagerAndCpu) {
  run_fixture("lora-falcon7b-mqa", "falcon7b-mqa-parallel", {"b1-r8-all", "b2-r2-qkv"});
}

// Adapters load beside the forward passes (ops::BackgroundDeviceWork: their copies on a stream of
// their own): loaded on another thread while passes run, an adapter equals one loaded while the
// device was idle, and the passes beside the loads give the logits they give alone, bit for bit.
TEST_F(CudaLoraGraphTest, AdapterLoadedBesideForwardsEqualsOneLoadedIdle) {
  FalconModel gpu = FalconModel::load(test::fixture_dir("falcon7b-mqa-parallel"), Device::kCuda);
  gpu.set_cuda_graphs(false);
  const std::string dir = test::fixture_dir("lora-falcon7b-mqa") + "/adapters/b1-r8-all";
  const std::shared_ptr<const LoraAdapter> idle = gpu.load_adapter(dir, "idle");
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(gpu.config().vocab_size - 1));
  std::vector<Seq> seqs(4);
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].id = static_cast<int64_t>(i);
    for (int k = 0; k < 40; ++k) seqs[i].tokens.push_back(tok(rng));
  }
  seqs[1].tokens = seqs[0].tokens;  // rows 0 and 1: the same prompt
  // The four prompts prefilled into a fresh cache; adapters per row (empty: the base model).
  auto logits = [&](const std::vector<const LoraAdapter*>& adapters) {
    KvCache cache = gpu.make_kv_cache(4 * kBlocksPerSeq, kBlockSize);
    std::vector<Seq*> ptrs;
    for (Seq& q : seqs) ptrs.push_back(&q);
    ForwardBatch b = make_batch(ptrs);
    b.adapters = adapters;
    const Tensor out = gpu.forward(b, cache);
    return std::vector<float>(out.data<float>(), out.data<float>() + out.numel());
  };
  const std::vector<float> alone = logits({});

  std::atomic<bool> passes_done{false};
  std::atomic<int> loads{0};
  std::shared_ptr<const LoraAdapter> last;
  std::thread loader([&] {
    do {
      last = gpu.load_adapter(dir, "beside-" + std::to_string(loads.load()));
      ++loads;
    } while (!passes_done);
  });
  int passes = 0, differing = 0;
  for (; passes < 200 && (passes < 20 || loads < 3); ++passes) differing += logits({}) != alone;
  passes_done = true;
  loader.join();
  EXPECT_EQ(differing, 0) << "of " << passes << " base passes beside " << loads << " loads";
  EXPECT_GE(loads.load(), 1);

  const int64_t v = gpu.config().vocab_size;
  const std::vector<float> both_idle = logits({idle.get(), idle.get(), nullptr, nullptr});
  const std::vector<float> mixed = logits({idle.get(), last.get(), nullptr, nullptr});
  EXPECT_TRUE(std::equal(mixed.begin() + v, mixed.begin() + 2 * v, both_idle.begin() + v))
      << "the adapter loaded beside the passes differs from the one loaded idle";
  EXPECT_FALSE(std::equal(mixed.begin(), mixed.begin() + v, alone.begin()))
      << "the adapter changed nothing";
  std::printf("[ lora beside ] %d base passes beside %d adapter loads\n", passes, loads.load());
}

// falcon-7b's shapes, 2 layers, random rank-16 adapters on all four modules: 32 sequences with
// 32 distinct adapters, then 8, then base rows among them; a rank-32 adapter gets its own graph.
TEST_F(CudaLoraGraphTest, Falcon7bShapesManyAdaptersGraphsMatchEager) {
  FalconModel gpu = FalconModel::random(test::falcon7b_shapes(2), Device::kCuda, 3);
  const std::vector<LoraModule> all = {LoraModule::kQkv, LoraModule::kDense, LoraModule::kFc1,
                                       LoraModule::kFc2};
  std::vector<Pair> ads;
  for (uint64_t i = 0; i < 32; ++i) ads.push_back({gpu.random_adapter("r", 16, all, 100 + i)});
  LoraGraphRun run(gpu, nullptr);
  std::vector<Seq*> seqs;
  for (int64_t i = 0; i < 32; ++i) seqs.push_back(run.join(1 + i % 5, nullptr));
  std::vector<const Pair*> a32, a8, mixed;
  for (int64_t i = 0; i < 32; ++i) {
    a32.push_back(&ads[i]);
    a8.push_back(&ads[i / 4]);
    mixed.push_back(i % 3 == 0 ? nullptr : &ads[(7 * i) % 32]);
  }
  for (int st = 0; st < 2; ++st) run.step(seqs, a32);
  for (int st = 0; st < 2; ++st) run.step(seqs, a8);
  run.step(seqs, mixed);
  const int64_t captures = gpu.graph_stats().captures;
  Pair r32{gpu.random_adapter("r32", 32, all, 7)};
  mixed[5] = &r32;
  run.step(seqs, mixed);  // bound 32: one more graph
  EXPECT_EQ(gpu.graph_stats().captures, captures + 1);
  std::printf("[ lora graphs ] falcon-7b shapes: worst rel error vs eager %.3g, %lld checked\n",
              run.worst_eager(), static_cast<long long>(run.checked()));
}

}  // namespace
}  // namespace kestrel
