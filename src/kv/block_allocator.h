// BlockAllocator: hands out KV-cache blocks from a free list and counts
// references, so that sequences sharing a prompt prefix can share full blocks.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace kestrel {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

  // A free block with reference count 1, or nullopt when none is left.
  std::optional<int32_t> allocate();
  // n blocks or none (all-or-nothing), appended to out.
  bool allocate(int32_t n, std::vector<int32_t>& out);
  // One more owner of an allocated block.
  void retain(int32_t block);
  // Drops one reference; the block returns to the free list at zero.
  void release(int32_t block);
  void release(const std::vector<int32_t>& blocks);
  int32_t ref_count(int32_t block) const;

 private:
  void check_block(int32_t block) const;

  std::vector<int32_t> free_;  // stack: the most recently freed block is reused first
  std::vector<int32_t> ref_counts_;
};

}  // namespace kestrel
