// Free-list block allocator with reference counts and the prefix cache's
// hash index and LRU of unreferenced cached blocks.
#include "kv/block_allocator.h"

#include "core/error.h"

namespace kestrel {

BlockAllocator::BlockAllocator(int32_t num_blocks) {
  KESTREL_CHECK(num_blocks >= 0, "BlockAllocator: num_blocks must be >= 0, got ", num_blocks);
  ref_counts_.assign(num_blocks, 0);
  hash_of_.assign(num_blocks, 0);
  hashed_.assign(num_blocks, false);
  lru_pos_.assign(num_blocks, lru_.end());
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::optional<int32_t> BlockAllocator::allocate() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {  // evict the least recently used cached block
    b = lru_.front();
    lru_.pop_front();
    lru_pos_[b] = lru_.end();
    by_hash_.erase(hash_of_[b]);
    hashed_[b] = false;
  } else {
    return std::nullopt;
  }
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
  if (--ref_counts_[block] > 0) return;
  if (hashed_[block]) {
    lru_pos_[block] = lru_.insert(lru_.end(), block);
  } else {
    free_.push_back(block);
  }
}

void BlockAllocator::release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) release(b);
}

int32_t BlockAllocator::ref_count(int32_t block) const {
  check_block(block);
  return ref_counts_[block];
}

std::optional<int32_t> BlockAllocator::lookup(uint64_t hash) {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const int32_t b = it->second;
  if (ref_counts_[b] == 0) {
    lru_.erase(lru_pos_[b]);
    lru_pos_[b] = lru_.end();
  }
  ++ref_counts_[b];
  return b;
}

void BlockAllocator::set_hash(int32_t block, uint64_t hash) {
  check_block(block);
  KESTREL_CHECK(ref_counts_[block] > 0, "BlockAllocator: set_hash on free block ", block);
  if (hashed_[block] || by_hash_.count(hash)) return;
  hashed_[block] = true;
  hash_of_[block] = hash;
  by_hash_.emplace(hash, block);
}

uint64_t block_prefix_hash(uint64_t parent, const int32_t* tokens, int64_t n_tokens) {
  // splitmix64-style mixing of the parent hash, then each token, then the count.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(parent ^ 0x6b657374726c0001ull);
  for (int64_t i = 0; i < n_tokens; ++i) h = mix(h ^ static_cast<uint32_t>(tokens[i]));
  return mix(h ^ static_cast<uint64_t>(n_tokens));
}

}  // namespace kestrel
