// BlockAllocator: hands out KV-cache blocks from a free list and counts
// references, so that sequences sharing a prompt prefix can share full blocks.
// It is also the prefix cache: a full block may carry the chain hash of the
// token prefix it ends; when its last reference goes it stays findable by that
// hash (evictable, LRU) until a block is needed and none is plainly free.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace kestrel {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  // Blocks that allocate() can hand out: plainly free plus cached, unreferenced.
  int32_t num_free() const { return static_cast<int32_t>(free_.size() + lru_.size()); }
  // Cached, unreferenced blocks (evicted least recently used first).
  int32_t num_cached_free() const { return static_cast<int32_t>(lru_.size()); }

  // A free block with reference count 1 (a plainly free one, else the least
  // recently used cached one, whose hash is forgotten), or nullopt.
  std::optional<int32_t> allocate();
  // n blocks or none (all-or-nothing), appended to out.
  bool allocate(int32_t n, std::vector<int32_t>& out);
  // One more owner of an allocated block.
  void retain(int32_t block);
  // Drops one reference; at zero the block becomes free (or evictable when it
  // carries a hash).
  void release(int32_t block);
  void release(const std::vector<int32_t>& blocks);
  int32_t ref_count(int32_t block) const;

  // The cached block holding the prefix with this hash, with one more
  // reference (taken out of the evictable list), or nullopt.
  std::optional<int32_t> lookup(uint64_t hash);
  // Marks an allocated, full block as holding the prefix `hash`. Ignored when
  // another block already holds that prefix (the first one stays the cached one).
  void set_hash(int32_t block, uint64_t hash);
  bool has_hash(int32_t block) const { return hashed_.at(block); }

 private:
  void check_block(int32_t block) const;

  std::vector<int32_t> free_;  // stack: the most recently freed block is reused first
  std::vector<int32_t> ref_counts_;
  std::vector<uint64_t> hash_of_;
  std::vector<bool> hashed_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::list<int32_t> lru_;  // unreferenced hashed blocks, least recently used first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
};

// Chain hash of one full block: the hash of the whole token prefix up to and
// including it, given the previous block's (0 for the first block).
uint64_t block_prefix_hash(uint64_t parent, const int32_t* tokens, int64_t n_tokens);

}  // namespace kestrel
