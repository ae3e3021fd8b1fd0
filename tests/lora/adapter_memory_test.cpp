// The adapter store's memory unit (lora_adapter_bytes in model/memory_plan.h) against the bytes
// that real rank-16 adapters on all four modules hold, at 1 and 3 tensor-parallel ranks.
#include <gtest/gtest.h>

#include "../model/fixture_util.h"
#include "model/falcon_model.h"
#include "model/memory_plan.h"

namespace kestrel {
namespace {

const std::vector<LoraModule> kAll = {LoraModule::kQkv, LoraModule::kDense, LoraModule::kFc1,
                                      LoraModule::kFc2};

TEST(AdapterMemory, RankSixteenUnitIsWhatAnAdapterHolds) {
  for (const char* fixture : {"falcon40b-gqa", "falcon7b-mqa-parallel"}) {
    SCOPED_TRACE(fixture);
    const FalconModel one = FalconModel::load(test::fixture_dir(fixture));
    EXPECT_EQ(lora_adapter_bytes(one, 16), one.random_adapter("r", 16, kAll, 1)->bytes());
    EXPECT_EQ(lora_adapter_bytes(one, 4) * 4, lora_adapter_bytes(one, 16));
    const FalconModel three = FalconModel::load(test::fixture_dir(fixture), Device::kCpu, 3);
    const int64_t held = three.random_adapter("r", 16, kAll, 1)->bytes();
    const int64_t unit = lora_adapter_bytes(three, 16);
    // Replicated halves counted per rank; only padding rows of the sharded qkv are left out.
    EXPECT_LE(unit, held);
    EXPECT_GE(unit, held * 95 / 100);
    EXPECT_GT(unit, lora_adapter_bytes(one, 16));
  }
}

TEST(AdapterMemory, CpuCacheSizeIgnoresTheReserve) {
  const FalconModel m = FalconModel::load(test::fixture_dir("falcon40b-gqa"));
  KvPlanOptions o;
  o.kv_cache_memory = int64_t{1} << 20;
  const KvPlan plain = plan_kv_cache(m, o);
  o.reserved_bytes = int64_t{1} << 19;
  const KvPlan with = plan_kv_cache(m, o);
  EXPECT_EQ(with.num_blocks, plain.num_blocks);
  EXPECT_EQ(with.reserved_bytes, 0);
}

}  // namespace
}  // namespace kestrel
