// The BPE model of tokenizer.json: vocabulary, merges by rank, and the merge
// loop HF tokenizers runs on one word, with a thread-safe word cache.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kestrel::text {

// Hash for string maps looked up by string_view without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept;
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  // Reusable buffers for encode_word(); one per encode call.
  struct Scratch {
    struct Symbol {
      int32_t id;
      int32_t prev;
      int32_t next;
      uint32_t len;  // bytes of the word it covers; 0 once merged away
    };
    struct Merge {
      uint32_t rank;
      int32_t pos;
      int32_t new_id;
    };
    std::vector<Symbol> symbols;
    std::vector<Merge> heap;
    std::string piece;
  };

  // Builds the model from tokenizer.json's "model" object (type BPE). Throws
  // kestrel::Error naming what is malformed or unsupported.
  static std::unique_ptr<Bpe> from_json(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized word. Thread-safe.
  void encode_word(std::string_view word, Scratch& scratch, std::vector<int32_t>& out) const;

  const StringIdMap& vocab() const { return vocab_; }
  std::optional<int32_t> token_id(std::string_view token) const;
  int32_t max_id() const { return max_id_; }
  size_t n_merges() const { return n_merges_; }

 private:
  // Merge table: (left id, right id) -> (rank, merged id), open addressing.
  struct PairEntry {
    uint64_t key;
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }
  const PairEntry* find_pair(int32_t a, int32_t b) const;
  void insert_pair(int32_t a, int32_t b, uint32_t rank, int32_t new_id);
  void build_merges(const nlohmann::json& merges);

  void word_symbols(std::string_view word, Scratch& scratch) const;
  void merge_symbols(Scratch& scratch) const;
  int32_t lookup_char(std::string_view c, bool first, bool last, Scratch& scratch) const;

  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
  };
  static constexpr size_t kCacheShards = 64;
  static constexpr size_t kCacheShardCapacity = 4096;
  static constexpr size_t kMaxCachedWordBytes = 256;

  StringIdMap vocab_;
  int32_t max_id_ = -1;
  std::vector<PairEntry> pairs_;
  uint64_t pair_mask_ = 0;
  size_t n_merges_ = 0;
  // Ids of one-character tokens for code points below 512 (-1: not in vocab).
  std::array<int32_t, 512> char_ids_{};
  std::optional<std::string> unk_token_;
  std::string prefix_;  // continuing_subword_prefix
  std::string suffix_;  // end_of_word_suffix
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::array<int32_t, 256> byte_fallback_ids_{};
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace kestrel::text
