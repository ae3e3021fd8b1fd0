// KV cache storage.
#include "kv/kv_cache.h"

#include <cstring>

#include "core/error.h"

namespace kestrel {

KvCache::KvCache(const KvCacheShape& shape, DType dtype, Device device) : shape_(shape) {
  KESTREL_CHECK(shape.n_layers > 0 && shape.num_blocks > 0 && shape.block_size > 0 &&
                    shape.n_kv_heads > 0 && shape.head_dim > 0,
                "KvCache: every size must be positive (layers ", shape.n_layers, ", blocks ",
                shape.num_blocks, ", block_size ", shape.block_size, ", kv heads ",
                shape.n_kv_heads, ", head_dim ", shape.head_dim, ")");
  Shape dims{shape.num_blocks, shape.block_size, shape.n_kv_heads, shape.head_dim};
  for (int64_t l = 0; l < shape.n_layers; ++l) {
    k_.push_back(Tensor::empty(dtype, dims, device));
    v_.push_back(Tensor::empty(dtype, dims, device));
    if (device == Device::kCpu) {
      std::memset(k_.back().raw(), 0, k_.back().nbytes());
      std::memset(v_.back().raw(), 0, v_.back().nbytes());
    }
  }
}

KvCache::KvCache(std::vector<KvCache> shards) : shards_(std::move(shards)) {
  KESTREL_CHECK(!shards_.empty(), "KvCache: no rank caches given");
  shape_ = shards_[0].shape();
  shape_.n_kv_heads = 0;
  for (const KvCache& s : shards_) {
    KESTREL_CHECK(
        s.shape().n_layers == shape_.n_layers && s.shape().num_blocks == shape_.num_blocks &&
            s.shape().block_size == shape_.block_size && s.shape().head_dim == shape_.head_dim,
        "KvCache: rank caches differ in layers, blocks, block size or head_dim");
    shape_.n_kv_heads += s.shape().n_kv_heads;
  }
}

}  // namespace kestrel
