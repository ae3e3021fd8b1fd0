// merged_adapters through the adapter store (AdapterStore::get_merged with FalconModel's hooks):
// the merged adapter it makes gives peft's logits (tests/data/merge-falcon7b) alone and batched
// with an unmerged adapter and the base model; one merge loads once; refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../model/fixture_util.h"
#include "../test_data.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "lora/adapter_store.h"
#include "lora/merge.h"
#include "merge_fixture.h"
#include "model/falcon_model.h"
#include "model/runner.h"

namespace kestrel {
namespace {

using nlohmann::json;

std::string merge_dir() {
  return test::test_data_dir() + "/merge-falcon7b";
}

const json& fixture() {
  static const json j = [] {
    std::ifstream in(merge_dir() + "/fixture.json");
    return json::parse(in);
  }();
  return j;
}

const FalconModel& model() {
  static const FalconModel m =
      FalconModel::load(merge_dir() + "/" + fixture().at("base").get<std::string>());
  return m;
}

MergeSpec spec_of(const json& merge) {
  return test::merge_spec_of(merge);
}

// A store over the fixture's adapters folder with the model's loader and merge hooks; uploads
// counts the merged adapters put on the device, reads the folders read onto the host.
struct Store {
  std::atomic<int> uploads{0}, reads{0};
  const FalconModel& m;
  AdapterStore store;
  explicit Store(const FalconModel& on = model())
      : m(on),
        store([this](const std::string& dir,
                     const std::string& name) { return m.load_adapter(dir, name); },
              [] {
                AdapterStoreOptions o;
                o.adapters_dir = merge_dir() + "/adapters";
                return o;
              }()) {
    store.set_merge_hooks({[this](const std::string& dir) {
                             ++reads;
                             return m.read_host_adapter(dir);
                           },
                           [this](const MergedLora& merged, const std::string& name) {
                             ++uploads;
                             return m.adapter_from_merged(merged, name);
                           }});
  }
};

std::vector<int32_t> prompt() {
  return fixture().at("prompt_ids").get<std::vector<int32_t>>();
}

Tensor logits_alone(const std::vector<int32_t>& ids, const LoraAdapter* adapter) {
  RunnerOptions opt;
  opt.adapters = {adapter};
  BatchRunner runner(model(), {ids}, 0, opt);
  return runner.prefill(/*all_logits=*/true);
}

// Rows [begin, end) of a [n, vocab] F32 tensor.
Tensor rows(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t vocab = t.dim(1);
  Tensor out = Tensor::empty(DType::kF32, {end - begin, vocab});
  std::memcpy(out.raw(), t.data<float>() + begin * vocab, out.nbytes());
  return out;
}

TEST(MergedStore, MergedRequestGivesPeftLogitsAloneAndBatched) {
  Store s;
  const std::vector<int32_t> p = prompt();
  std::vector<int32_t> other(p.rbegin(), p.rend());
  const std::vector<int32_t> base_prompt(p.begin(), p.begin() + 9);
  const auto unmerged = s.store.get_sync("m1-r4-all", AdapterSource::kLocal);
  const Tensor unmerged_alone = logits_alone(other, unmerged.get());
  const Tensor base_alone = logits_alone(base_prompt, nullptr);
  for (const char* name : {"linear", "ties_total", "dare_ties_total_d05"}) {
    SCOPED_TRACE(name);
    const MergeSpec spec = spec_of(fixture().at("merges").at(name));
    const auto merged = s.store.get_merged_sync(spec, AdapterSource::kLocal);
    EXPECT_EQ(merged->name(), s.store.merged_name(spec, AdapterSource::kLocal));
    EXPECT_EQ(merged->name().rfind("merge:", 0), 0u);
    const WeightStore want = WeightStore::open_file(merge_dir() + "/expected_logits_" +
                                                    std::string(name) + ".safetensors");
    const Tensor ref = want.borrow("logits");

    const Tensor alone = logits_alone(p, merged.get());
    ASSERT_EQ(shape_str(alone.shape()), shape_str(ref.shape()));
    EXPECT_LE(test::rel_error(alone, ref), 1e-4);

    // Batched: the base model, the merge, an unmerged adapter, each prompt its own length.
    RunnerOptions opt;
    opt.adapters = {nullptr, merged.get(), unmerged.get()};
    BatchRunner runner(model(), {base_prompt, p, other}, 0, opt);
    const Tensor all = runner.prefill(/*all_logits=*/true);
    const auto n0 = static_cast<int64_t>(base_prompt.size()), n1 = n0 + std::ssize(p);
    EXPECT_LE(test::rel_error(rows(all, n0, n1), ref), 1e-4);
    EXPECT_LE(test::rel_error(rows(all, 0, n0), base_alone), 1e-5);
    EXPECT_LE(test::rel_error(rows(all, n1, all.dim(0)), unmerged_alone), 1e-5);
  }
  EXPECT_EQ(s.uploads.load(), 3);
}

// On a model split over two ranks the merged adapter is sharded like a loaded one: the same
// logits.
TEST(MergedStore, MergedAdapterOnTwoRanks) {
  const FalconModel tp = FalconModel::load(
      merge_dir() + "/" + fixture().at("base").get<std::string>(), Device::kCpu, 2);
  Store s(tp);
  const std::vector<int32_t> p = prompt();
  for (const char* name : {"linear", "dare_ties_total_d05"}) {
    SCOPED_TRACE(name);
    const auto merged =
        s.store.get_merged_sync(spec_of(fixture().at("merges").at(name)), AdapterSource::kLocal);
    ASSERT_EQ(merged->n_ranks(), 2);
    RunnerOptions opt;
    opt.adapters = {merged.get()};
    BatchRunner runner(tp, {p}, 0, opt);
    const Tensor logits = runner.prefill(/*all_logits=*/true);
    const WeightStore want = WeightStore::open_file(merge_dir() + "/expected_logits_" +
                                                    std::string(name) + ".safetensors");
    EXPECT_LE(test::rel_error(logits, want.borrow("logits")), 1e-4);
  }
}

TEST(MergedStore, SameMergeLoadsOnce) {
  Store s;
  MergeSpec spec = spec_of(fixture().at("merges").at("ties_total"));
  const auto first = s.store.get_merged_sync(spec, AdapterSource::kLocal);
  const auto again = s.store.get_merged_sync(spec, AdapterSource::kLocal);
  EXPECT_EQ(first.get(), again.get());
  // The seed does not change ties (no random pruning): the same merge.
  spec.seed = 1234;
  EXPECT_EQ(s.store.get_merged_sync(spec, AdapterSource::kLocal).get(), first.get());
  EXPECT_EQ(s.uploads.load(), 1);
  EXPECT_EQ(s.reads.load(), 3);  // ties_total merges three adapters
  int merges = 0;
  for (const LoadedAdapterInfo& info : s.store.loaded()) {
    if (info.name != first->name()) continue;
    ++merges;
    EXPECT_EQ(info.bytes, first->bytes());
    EXPECT_EQ(info.max_rank, 4);
  }
  EXPECT_EQ(merges, 1);
  EXPECT_TRUE(s.store.is_loaded(first->name()));

  // Concurrent gets of one new merge share one load.
  spec.weights[0] = 0.25;
  std::vector<std::shared_ptr<const LoraAdapter>> got(4);
  std::atomic<int> done{0};
  for (auto& g : got)
    s.store.get_merged(spec, AdapterSource::kLocal,
                       [&g, &done](std::shared_ptr<const LoraAdapter> ad, const AdapterError*) {
                         g = std::move(ad);
                         ++done;
                       });
  while (done.load() < 4) std::this_thread::yield();
  for (const auto& g : got) {
    ASSERT_TRUE(g);
    EXPECT_EQ(g.get(), got[0].get());
  }
  EXPECT_NE(got[0].get(), first.get());
  EXPECT_EQ(s.uploads.load(), 2);

  // An adapter named twice is read once.
  MergeSpec twice;
  twice.ids = {"m1-r4-all", "m1-r4-all"};
  twice.weights = {0.5, 0.25};
  s.reads = 0;
  EXPECT_EQ(s.store.get_merged_sync(twice, AdapterSource::kLocal)->max_rank(), 4);
  EXPECT_EQ(s.reads.load(), 1);

  // DARE below density 1: the seed is part of the merge.
  MergeSpec dare = spec_of(fixture().at("merges").at("dare_ties_total_d05"));
  const std::string n1 = s.store.merged_name(dare, AdapterSource::kLocal);
  dare.seed += 1;
  EXPECT_NE(s.store.merged_name(dare, AdapterSource::kLocal), n1);
}

TEST(MergedStore, Refusals) {
  Store s;
  const auto refused = [&](const MergeSpec& spec, ErrorKind kind, const std::string& part) {
    try {
      s.store.get_merged_sync(spec, AdapterSource::kLocal);
      ADD_FAILURE() << "not refused: " << part;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  MergeSpec spec;
  spec.ids = {"m1-r4-all", "m4-r2-qkv"};
  spec.weights = {0.5, 0.5};
  refused(spec, ErrorKind::kInvalidArgument, "equal ranks");
  spec.strategy = MergeStrategy::kTies;
  spec.density = 1.5;
  refused(spec, ErrorKind::kInvalidArgument, "outside [0, 1]");
  spec.density = 0.5;
  spec.ids = {"m1-r4-all", "no-such-adapter"};
  refused(spec, ErrorKind::kNotFound, "no-such-adapter");
  spec.ids = {"m1-r4-all", "../adapters/m1-r4-all"};
  refused(spec, ErrorKind::kInvalidArgument, "merged_adapters.ids");
  EXPECT_EQ(s.uploads.load(), 0);
  // The store still serves merges after refusals; cat takes unequal ranks.
  spec.ids = {"m1-r4-all", "m4-r2-qkv"};
  spec.strategy = MergeStrategy::kCat;
  EXPECT_EQ(s.store.get_merged_sync(spec, AdapterSource::kLocal)->max_rank(), 6);
}

}  // namespace
}  // namespace kestrel
