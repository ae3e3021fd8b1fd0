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

TEST(PrefixCache, FreedHashedBlocksStayFindableUntilEvicted) {
  BlockAllocator a(3);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(a.allocate(2, blocks));
  a.set_hash(blocks[0], 100);
  a.set_hash(blocks[1], 200);
  EXPECT_FALSE(a.lookup(300).has_value());
  // A hit while referenced adds an owner.
  EXPECT_EQ(a.lookup(100), blocks[0]);
  EXPECT_EQ(a.ref_count(blocks[0]), 2);
  a.release(blocks[0]);
  a.release(blocks);
  // Unreferenced but cached: free for allocate(), still found by hash.
  EXPECT_EQ(a.num_free(), 3);
  EXPECT_EQ(a.num_cached_free(), 2);
  EXPECT_EQ(a.lookup(200), blocks[1]);
  EXPECT_EQ(a.ref_count(blocks[1]), 1);
  EXPECT_EQ(a.num_cached_free(), 1);
  a.release(blocks[1]);
  // Plainly free blocks go first, then the least recently used cached one
  // (block 0, released before block 1), whose hash is then forgotten.
  auto plain = a.allocate();
  ASSERT_TRUE(plain.has_value());
  EXPECT_NE(*plain, blocks[0]);
  EXPECT_NE(*plain, blocks[1]);
  EXPECT_EQ(a.allocate(), blocks[0]);
  EXPECT_FALSE(a.lookup(100).has_value());
  EXPECT_EQ(a.lookup(200), blocks[1]);
  EXPECT_EQ(a.num_free(), 0);
  EXPECT_FALSE(a.allocate().has_value());
}

TEST(PrefixCache, FirstBlockOfAPrefixStaysTheCachedOne) {
  BlockAllocator a(2);
  std::vector<int32_t> b;
  ASSERT_TRUE(a.allocate(2, b));
  a.set_hash(b[0], 7);
  a.set_hash(b[1], 7);  // same prefix computed twice: b[1] stays unhashed
  EXPECT_FALSE(a.has_hash(b[1]));
  a.release(b);
  EXPECT_EQ(a.num_cached_free(), 1);
  EXPECT_EQ(a.lookup(7), b[0]);
  EXPECT_THROW(a.set_hash(b[1], 8), Error);  // free block
}

TEST(PrefixCache, ChainHashCoversTheWholePrefix) {
  const std::vector<int32_t> x{1, 2, 3, 4}, y{1, 2, 3, 5};
  const uint64_t hx = block_prefix_hash(0, x.data(), 4);
  EXPECT_EQ(hx, block_prefix_hash(0, x.data(), 4));
  EXPECT_NE(hx, block_prefix_hash(0, y.data(), 4));
  // The same block after different prefixes hashes differently.
  EXPECT_NE(block_prefix_hash(hx, x.data(), 4),
            block_prefix_hash(block_prefix_hash(0, y.data(), 4), x.data(), 4));
  EXPECT_NE(block_prefix_hash(0, x.data(), 2), block_prefix_hash(0, x.data() + 2, 2));
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
