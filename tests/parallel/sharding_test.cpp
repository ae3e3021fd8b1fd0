// The sharding rules on the real Falcon shapes (falcon-7b MQA, falcon-40b / 180B / Falcon2-11B
// GQA, a multi-head RW model) for every N up to the head count: ranges cover everything exactly
// once, as even as possible, and the local qkv rows / dense columns pick the right checkpoint
// rows (checked against a labelling of the checkpoint layout built independently).
#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "core/error.h"
#include "parallel/sharding.h"

namespace kestrel {
namespace {

struct NamedDims {
  const char* name;
  ShardDims dims;
};

const NamedDims kModels[] = {
    {"falcon-7b", {71, 1, 64, 18176, 65024}},    {"falcon-40b", {128, 8, 64, 32768, 65024}},
    {"falcon-180B", {232, 8, 64, 59392, 65024}}, {"falcon2-11b", {32, 8, 128, 16384, 65024}},
    {"rw-mha", {32, 32, 64, 8192, 50304}},
};

// Label of checkpoint qkv block b (head_dim rows each): ('q', head) / ('k', group) / ('v', group),
// built from the layouts of ARCHITECTURE.md, not from the grouped formula in sharding.cpp.
std::vector<std::pair<char, int64_t>> checkpoint_blocks(const ShardDims& d) {
  std::vector<std::pair<char, int64_t>> blocks;
  if (d.n_kv_heads == 1) {  // multi-query: [heads * d | k | v]
    for (int64_t h = 0; h < d.n_heads; ++h) blocks.push_back({'q', h});
    blocks.push_back({'k', 0});
    blocks.push_back({'v', 0});
  } else if (d.n_kv_heads == d.n_heads) {  // interleaved multi-head: [heads][q, k, v]
    for (int64_t h = 0; h < d.n_heads; ++h) {
      blocks.push_back({'q', h});
      blocks.push_back({'k', h});
      blocks.push_back({'v', h});
    }
  } else {  // new architecture: [kv][queries..., k, v]
    const int64_t g = d.n_heads / d.n_kv_heads;
    for (int64_t kv = 0; kv < d.n_kv_heads; ++kv) {
      for (int64_t j = 0; j < g; ++j) blocks.push_back({'q', kv * g + j});
      blocks.push_back({'k', kv});
      blocks.push_back({'v', kv});
    }
  }
  return blocks;
}

TEST(Sharding, EvenRangesAsTheIssueSays) {
  EXPECT_EQ(even_range(71, 2, 0), (IndexRange{0, 36}));
  EXPECT_EQ(even_range(71, 2, 1), (IndexRange{36, 71}));
  EXPECT_EQ(even_range(71, 3, 0).size(), 24);
  EXPECT_EQ(even_range(71, 3, 1).size(), 24);
  EXPECT_EQ(even_range(71, 3, 2), (IndexRange{48, 71}));
  EXPECT_EQ(even_range(5, 5, 4), (IndexRange{4, 5}));
}

TEST(Sharding, Falcon40bOverThreeReplicatesTheSplitGroups) {
  const auto shards = shard_all(kModels[1].dims, 3);  // 128 heads, groups of 16: 43 + 43 + 42
  EXPECT_EQ(shards[0].heads, (IndexRange{0, 43}));
  EXPECT_EQ(shards[0].kv_heads, (IndexRange{0, 3}));  // group 2 (heads 32..47) split 0 | 1
  EXPECT_EQ(shards[1].heads, (IndexRange{43, 86}));
  EXPECT_EQ(shards[1].kv_heads, (IndexRange{2, 6}));
  EXPECT_EQ(shards[2].kv_heads, (IndexRange{5, 8}));
  EXPECT_EQ(shards[0].local_group, 16);
  EXPECT_EQ(shards[0].n_local_heads(), 48);  // 5 padding slots in group 2
  EXPECT_EQ(shards[0].local_q_head[32], 32);
  EXPECT_EQ(shards[0].local_q_head[42], 42);
  EXPECT_EQ(shards[0].local_q_head[43], -1);
}

TEST(Sharding, MultiQueryKeepsTheOneKvHeadEverywhere) {
  for (int n : {2, 3, 71}) {
    for (const RankShard& s : shard_all(kModels[0].dims, n)) {
      EXPECT_EQ(s.kv_heads, (IndexRange{0, 1}));
      EXPECT_EQ(s.local_group, s.heads.size());
      EXPECT_EQ(s.n_local_heads(), s.heads.size());  // never padding
    }
  }
}

TEST(Sharding, MultiHeadTakesItsOwnKvHeads) {
  for (int n : {2, 5, 32})
    for (const RankShard& s : shard_all(kModels[4].dims, n)) EXPECT_EQ(s.kv_heads, s.heads);
}

TEST(Sharding, EveryModelEveryN) {
  for (const NamedDims& m : kModels) {
    const ShardDims& d = m.dims;
    const auto blocks = checkpoint_blocks(d);
    const int64_t group = d.n_heads / d.n_kv_heads;
    for (int n = 1; n <= d.n_heads; ++n) {
      SCOPED_TRACE(std::string(m.name) + " N=" + std::to_string(n));
      const auto shards = shard_all(d, n);
      int64_t next_head = 0, next_ffn = 0, next_vocab = 0;
      std::map<int64_t, int> head_seen;
      for (const RankShard& s : shards) {
        // Contiguous, covering, near-even (bigger parts first).
        ASSERT_EQ(s.heads.begin, next_head);
        ASSERT_EQ(s.ffn.begin, next_ffn);
        ASSERT_EQ(s.vocab.begin, next_vocab);
        next_head = s.heads.end;
        next_ffn = s.ffn.end;
        next_vocab = s.vocab.end;
        ASSERT_GE(s.heads.size(), 1);
        ASSERT_LE(shards[0].heads.size() - s.heads.size(), 1);
        ASSERT_LE(shards[0].ffn.size() - s.ffn.size(), 1);
        ASSERT_LE(shards[0].vocab.size() - s.vocab.size(), 1);
        // K/V heads: exactly the groups its queries touch.
        ASSERT_EQ(s.kv_heads.begin, s.heads.begin / group);
        ASSERT_EQ(s.kv_heads.end, (s.heads.end - 1) / group + 1);
        ASSERT_EQ(s.n_local_heads(), s.local_group * s.n_local_kv_heads());
        // qkv rows: slot j of local group lg is query head h's rows, then the group's k and v.
        const auto rows = s.qkv_rows(d);
        ASSERT_EQ(static_cast<int64_t>(rows.size()),
                  (s.n_local_heads() + 2 * s.n_local_kv_heads()) * d.head_dim);
        int64_t real = 0;
        for (int64_t lg = 0; lg < s.n_local_kv_heads(); ++lg) {
          const int64_t g = s.kv_heads.begin + lg;
          const int64_t base = lg * (s.local_group + 2) * d.head_dim;
          for (int64_t j = 0; j < s.local_group + 2; ++j) {
            const int64_t first = rows[base + j * d.head_dim];
            for (int64_t i = 1; i < d.head_dim; ++i)
              ASSERT_EQ(rows[base + j * d.head_dim + i], first < 0 ? -1 : first + i);
            if (j < s.local_group) {
              const int64_t h = s.local_q_head[lg * s.local_group + j];
              if (h < 0) {
                ASSERT_EQ(first, -1);
                continue;
              }
              ++real;
              ++head_seen[h];
              ASSERT_TRUE(h >= s.heads.begin && h < s.heads.end && h / group == g);
              ASSERT_EQ(first % d.head_dim, 0);
              ASSERT_EQ(blocks[first / d.head_dim], std::make_pair('q', h));
            } else {
              ASSERT_EQ(blocks[first / d.head_dim],
                        std::make_pair(j == s.local_group ? 'k' : 'v',
                                       d.n_kv_heads == 1 ? int64_t{0} : g));
            }
          }
        }
        ASSERT_EQ(real, s.heads.size());
        const auto cols = s.dense_cols(d);
        ASSERT_EQ(static_cast<int64_t>(cols.size()), s.n_local_heads() * d.head_dim);
        for (int64_t slot = 0; slot < s.n_local_heads(); ++slot) {
          const int64_t h = s.local_q_head[slot];
          ASSERT_EQ(cols[slot * d.head_dim + 3], h < 0 ? -1 : h * d.head_dim + 3);
        }
      }
      ASSERT_EQ(next_head, d.n_heads);
      ASSERT_EQ(next_ffn, d.ffn);
      ASSERT_EQ(next_vocab, d.vocab);
      ASSERT_EQ(static_cast<int64_t>(head_seen.size()), d.n_heads);
      for (const auto& [h, count] : head_seen) ASSERT_EQ(count, 1) << "head " << h;
    }
  }
}

TEST(Sharding, ClearErrors) {
  const ShardDims d = kModels[0].dims;
  EXPECT_THROW(check_tensor_parallel(d, 0), Error);
  EXPECT_THROW(check_tensor_parallel(d, 72), Error);
  EXPECT_NO_THROW(check_tensor_parallel(d, 71));
  try {
    check_tensor_parallel(d, 72);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("71 query heads"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kestrel
