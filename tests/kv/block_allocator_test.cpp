// BlockAllocator: free list, reference counts, all-or-nothing allocation, and
// clear errors on misuse; KvCache shapes.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "kv/block_allocator.h"
#include "kv/kv_cache.h"

namespace kestrel {
namespace {

TEST(BlockAllocator, HandsOutEveryBlockOnce) {
  BlockAllocator a(8);
  std::set<int32_t> seen;
  for (int i = 0; i < 8; ++i) {
    auto b = a.allocate();
    ASSERT_TRUE(b.has_value());
    EXPECT_TRUE(seen.insert(*b).second);
    EXPECT_EQ(a.ref_count(*b), 1);
  }
  EXPECT_FALSE(a.allocate().has_value());
  EXPECT_EQ(a.num_free(), 0);
}

TEST(BlockAllocator, AllOrNothing) {
  BlockAllocator a(4);
  std::vector<int32_t> got;
  EXPECT_FALSE(a.allocate(5, got));
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_TRUE(a.allocate(3, got));
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(a.num_free(), 1);
}

TEST(BlockAllocator, RefCountsKeepSharedBlocks) {
  BlockAllocator a(2);
  int32_t b = *a.allocate();
  a.retain(b);
  EXPECT_EQ(a.ref_count(b), 2);
  a.release(b);
  EXPECT_EQ(a.num_free(), 1);
  a.release(b);
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_EQ(a.ref_count(b), 0);
}

TEST(BlockAllocator, MisuseIsAnError) {
  BlockAllocator a(2);
  EXPECT_THROW(a.release(0), Error);  // double free / never allocated
  EXPECT_THROW(a.retain(1), Error);   // retain of a free block
  EXPECT_THROW(a.release(7), Error);  // out of range
  EXPECT_THROW(a.ref_count(-1), Error);
  EXPECT_THROW(BlockAllocator(-1), Error);
}

TEST(KvCache, ShapePerLayer) {
  KvCache cache({3, 10, 16, 2, 64}, DType::kF32, Device::kCpu);
  EXPECT_EQ(cache.k(2).shape(), (Shape{10, 16, 2, 64}));
  EXPECT_EQ(cache.v(0).shape(), (Shape{10, 16, 2, 64}));
  EXPECT_EQ(cache.shape().bytes_per_block(DType::kBF16), 2 * 3 * 16 * 2 * 64 * 2);
  EXPECT_THROW(KvCache({0, 10, 16, 2, 64}, DType::kF32, Device::kCpu), Error);
}

TEST(KvCache, SlotOfToken) {
  std::vector<int32_t> table{5, 2, 9};
  EXPECT_EQ(kv_slot(table, 16, 0), 80);
  EXPECT_EQ(kv_slot(table, 16, 17), 33);
  EXPECT_EQ(kv_slot(table, 16, 47), 159);
}

}  // namespace
}  // namespace kestrel
