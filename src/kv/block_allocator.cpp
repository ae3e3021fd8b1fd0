// Free-list block allocator with reference counts.
#include "kv/block_allocator.h"

#include "core/error.h"

namespace kestrel {

BlockAllocator::BlockAllocator(int32_t num_blocks) {
  KESTREL_CHECK(num_blocks >= 0, "BlockAllocator: num_blocks must be >= 0, got ", num_blocks);
  ref_counts_.assign(num_blocks, 0);
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::optional<int32_t> BlockAllocator::allocate() {
  if (free_.empty()) return std::nullopt;
  int32_t b = free_.back();
  free_.pop_back();
  ref_counts_[b] = 1;
  return b;
}

bool BlockAllocator::allocate(int32_t n, std::vector<int32_t>& out) {
  KESTREL_CHECK(n >= 0, "BlockAllocator: cannot allocate ", n, " blocks");
  if (n > num_free()) return false;
  for (int32_t i = 0; i < n; ++i) out.push_back(*allocate());
  return true;
}

void BlockAllocator::check_block(int32_t block) const {
  KESTREL_CHECK(block >= 0 && block < num_blocks(), "BlockAllocator: block ", block,
                " out of range [0, ", num_blocks(), ")");
}

void BlockAllocator::retain(int32_t block) {
  check_block(block);
  KESTREL_CHECK(ref_counts_[block] > 0, "BlockAllocator: retain of free block ", block);
  ++ref_counts_[block];
}

void BlockAllocator::release(int32_t block) {
  check_block(block);
  KESTREL_CHECK(ref_counts_[block] > 0, "BlockAllocator: double free of block ", block);
  if (--ref_counts_[block] == 0) free_.push_back(block);
}

void BlockAllocator::release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) release(b);
}

int32_t BlockAllocator::ref_count(int32_t block) const {
  check_block(block);
  return ref_counts_[block];
}

}  // namespace kestrel
