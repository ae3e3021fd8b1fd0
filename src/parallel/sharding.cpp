// The sharding rules (see sharding.h).
#include "parallel/sharding.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace kestrel {

IndexRange even_range(int64_t n, int size, int rank) {
  KESTREL_CHECK(size >= 1 && rank >= 0 && rank < size, "even_range: rank ", rank, " outside [0, ",
                size, ")");
  const int64_t base = n / size, extra = n % size;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

void check_tensor_parallel(const ShardDims& d, int size) {
  KESTREL_CHECK(size >= 1, "--tensor-parallel must be >= 1, got ", size);
  KESTREL_CHECK(d.n_heads >= 1 && d.n_kv_heads >= 1 && d.n_heads % d.n_kv_heads == 0,
                "tensor parallel: ", d.n_heads, " query heads are not a multiple of ", d.n_kv_heads,
                " K/V heads");
  KESTREL_CHECK(size <= d.n_heads, "--tensor-parallel ", size, " is more than the model's ",
                d.n_heads, " query heads (each rank needs at least one)");
  KESTREL_CHECK(size <= d.ffn && size <= d.vocab, "--tensor-parallel ", size,
                " is more than the MLP width ", d.ffn, " or the vocabulary ", d.vocab);
}

RankShard shard_rank(const ShardDims& d, int size, int rank) {
  check_tensor_parallel(d, size);
  RankShard s;
  s.rank = rank;
  s.size = size;
  s.heads = even_range(d.n_heads, size, rank);
  const int64_t group = d.n_heads / d.n_kv_heads;  // queries per K/V head in the checkpoint
  s.kv_heads = {s.heads.begin / group, (s.heads.end - 1) / group + 1};
  s.ffn = even_range(d.ffn, size, rank);
  s.vocab = even_range(d.vocab, size, rank);
  // Slots per local group: the most queries the rank has in any one of its groups.
  for (int64_t g = s.kv_heads.begin; g < s.kv_heads.end; ++g) {
    const int64_t lo = std::max(s.heads.begin, g * group);
    const int64_t hi = std::min(s.heads.end, (g + 1) * group);
    s.local_group = std::max(s.local_group, hi - lo);
  }
  for (int64_t g = s.kv_heads.begin; g < s.kv_heads.end; ++g) {
    const int64_t lo = std::max(s.heads.begin, g * group);
    const int64_t hi = std::min(s.heads.end, (g + 1) * group);
    for (int64_t j = 0; j < s.local_group; ++j) s.local_q_head.push_back(lo + j < hi ? lo + j : -1);
  }
  return s;
}

std::vector<RankShard> shard_all(const ShardDims& d, int size) {
  std::vector<RankShard> out;
  for (int r = 0; r < size; ++r) out.push_back(shard_rank(d, size, r));
  return out;
}

std::vector<int64_t> RankShard::qkv_rows(const ShardDims& d) const {
  const int64_t group = d.n_heads / d.n_kv_heads, hd = d.head_dim;
  std::vector<int64_t> rows;
  rows.reserve((n_local_heads() + 2 * n_local_kv_heads()) * hd);
  auto push_block = [&](int64_t block) {  // block: a head_dim-sized row block of the checkpoint
    for (int64_t i = 0; i < hd; ++i) rows.push_back(block < 0 ? -1 : block * hd + i);
  };
  for (int64_t lg = 0; lg < n_local_kv_heads(); ++lg) {
    const int64_t g = kv_heads.begin + lg;
    const int64_t base = g * (group + 2);  // checkpoint block of group g's first query
    for (int64_t j = 0; j < local_group; ++j) {
      const int64_t h = local_q_head[lg * local_group + j];
      push_block(h < 0 ? -1 : base + (h - g * group));
    }
    push_block(base + group);      // key
    push_block(base + group + 1);  // value
  }
  return rows;
}

std::vector<int64_t> RankShard::dense_cols(const ShardDims& d) const {
  std::vector<int64_t> cols;
  cols.reserve(n_local_heads() * d.head_dim);
  for (int64_t h : local_q_head)
    for (int64_t i = 0; i < d.head_dim; ++i) cols.push_back(h < 0 ? -1 : h * d.head_dim + i);
  return cols;
}

std::string describe(const RankShard& s) {
  std::ostringstream o;
  o << "rank " << s.rank << "/" << s.size << ": query heads [" << s.heads.begin << ", "
    << s.heads.end << "), K/V heads [" << s.kv_heads.begin << ", " << s.kv_heads.end << "), "
    << s.local_group << " query slots per K/V head (" << s.n_local_heads() - s.heads.size()
    << " padding), MLP [" << s.ffn.begin << ", " << s.ffn.end << "), vocab [" << s.vocab.begin
    << ", " << s.vocab.end << ")";
  return o.str();
}

}  // namespace kestrel
