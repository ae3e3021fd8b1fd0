// Tensor-parallel sharding rules, in one place: which query heads, K/V heads, qkv rows, MLP
// columns and vocabulary rows each of N ranks owns. The loader slices the checkpoint by these and
// the forward pass runs on the slices; nothing has to divide evenly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kestrel {

// [begin, end)
struct IndexRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const IndexRange&) const = default;
};

// Part `rank` of [0, n) cut into `size` contiguous near-even parts: the first n % size parts get
// one more (71 over 2: [0, 36), [36, 71); over 3: 24, 24, 23).
IndexRange even_range(int64_t n, int size, int rank);

// The attention / MLP / vocabulary sizes the rules need (from FalconConfig).
struct ShardDims {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // 1: multi-query; n_heads: multi-head; else grouped (GQA)
  int64_t head_dim = 0;
  int64_t ffn = 0;
  int64_t vocab = 0;
};

// One rank's share. The checkpoint's fused query_key_value is grouped per K/V head:
// [n_kv_heads][n_heads / n_kv_heads queries, key, value][head_dim] (multi-query is one group, the
// original interleaved multi-head layout groups of one; see docs/model.md). The rank's local qkv
// uses the same grouped layout over its K/V heads with `local_group` query slots per group: a
// group the rank holds only part of (GQA split across ranks) gets zero "padding" query slots so
// that every local group has the same size, which is what the attention op needs. Padding slots
// have zero qkv rows and zero dense columns, so they add nothing.
struct RankShard {
  int rank = 0, size = 1;
  IndexRange heads;                   // global query heads
  IndexRange kv_heads;                // global K/V heads (groups) its queries use
  IndexRange ffn;                     // dense_h_to_4h rows = dense_4h_to_h columns
  IndexRange vocab;                   // word embedding / lm_head rows
  int64_t local_group = 0;            // query slots per local K/V head
  std::vector<int64_t> local_q_head;  // [n_local_heads()] global head of each slot, -1: padding

  int64_t n_local_heads() const { return static_cast<int64_t>(local_q_head.size()); }
  int64_t n_local_kv_heads() const { return kv_heads.size(); }
  // Global qkv row of every local qkv row, -1 for a zero (padding) row:
  // [n_local_kv_heads][local_group + 2][head_dim].
  std::vector<int64_t> qkv_rows(const ShardDims& dims) const;
  // Global dense input column of every local one, -1 for a zero (padding) column:
  // [n_local_heads][head_dim].
  std::vector<int64_t> dense_cols(const ShardDims& dims) const;
};

// Throws kestrel::Error (naming the numbers) unless 1 <= size <= n_heads and the dims are sane.
void check_tensor_parallel(const ShardDims& dims, int size);
// Every rank's share (check_tensor_parallel first).
std::vector<RankShard> shard_all(const ShardDims& dims, int size);
RankShard shard_rank(const ShardDims& dims, int size, int rank);

std::string describe(const RankShard& shard);

}  // namespace kestrel
