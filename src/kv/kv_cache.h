// KvCache: per layer one K and one V tensor [num_blocks, block_size, n_kv_heads,
// head_dim]. Token i of a sequence lives at slot
// block_table[i / block_size] * block_size + i % block_size.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace kestrel {

struct KvCacheShape {
  int64_t n_layers = 0;
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;

  // Bytes one block takes over all layers, K and V.
  int64_t bytes_per_block(DType dtype) const {
    return 2 * n_layers * block_size * n_kv_heads * head_dim *
           static_cast<int64_t>(dtype_size(dtype));
  }
};

class KvCache {
 public:
  KvCache(const KvCacheShape& shape, DType dtype, Device device);
  // Tensor parallelism: one cache per rank (each with only that rank's K/V heads) behind one
  // object, so the engine holds one cache. shape() then sums the ranks' K/V heads (its
  // bytes_per_block is the total); k() / v() are the ranks' own (use shard(r)).
  explicit KvCache(std::vector<KvCache> shards);
  int n_shards() const { return static_cast<int>(shards_.size()); }
  KvCache& shard(int rank) { return shards_.at(rank); }

  const KvCacheShape& shape() const { return shape_; }
  int64_t block_size() const { return shape_.block_size; }
  int64_t num_blocks() const { return shape_.num_blocks; }
  Tensor& k(int64_t layer) { return k_.at(layer); }
  Tensor& v(int64_t layer) { return v_.at(layer); }

 private:
  KvCacheShape shape_;
  std::vector<Tensor> k_;
  std::vector<Tensor> v_;
  std::vector<KvCache> shards_;
};

// The slot of token `pos` of a sequence with this block table.
inline int64_t kv_slot(const std::vector<int32_t>& block_table, int64_t block_size, int64_t pos) {
  return static_cast<int64_t>(block_table.at(pos / block_size)) * block_size + pos % block_size;
}

}  // namespace kestrel
