// tokenizer.json's added_tokens: ids assigned as HF's AddedVocabulary does, and
// the split of an input on them (leftmost-longest, before pre-tokenization),
// honouring single_word, lstrip, rstrip and normalized.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/bpe.h"

namespace kestrel::text {

struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  bool operator==(const AddedToken&) const = default;
};

class AddedTokens {
 public:
  // A piece of the input: [start, end) bytes; id >= 0 for an added token.
  struct Piece {
    size_t start;
    size_t end;
    int32_t id;
  };

  // Reads the "added_tokens" array; ids of contents already in `model` are the
  // model's, new ones follow the model's vocabulary, as HF assigns them.
  static AddedTokens from_json(const nlohmann::json& added, const Bpe& model);

  // Splits text into text pieces (id -1) and added tokens; no piece is empty.
  void split(std::string_view text, std::vector<Piece>& out) const;

  std::optional<int32_t> token_id(std::string_view content) const;
  // The token registered under id, or nullptr.
  const AddedToken* token(int32_t id) const;
  bool is_special(int32_t id) const;
  bool empty() const { return by_id_.empty(); }
  int32_t max_id() const { return max_id_; }
  const std::unordered_map<int32_t, AddedToken>& by_id() const { return by_id_; }

 private:
  // Byte trie of token contents, for leftmost-longest matching.
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
      int32_t id = -1;
    };
    std::vector<Node> nodes{1};
    bool first_byte[256] = {};
    void insert(std::string_view s, int32_t id);
    // Longest pattern starting at text[pos]: its length and id, or {0, -1}.
    std::pair<size_t, int32_t> longest_at(std::string_view text, size_t pos) const;
  };

  void find_matches(std::string_view sentence, size_t base, const Trie& trie,
                    std::vector<Piece>& out) const;

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ids_;
  std::unordered_map<int32_t, AddedToken> by_id_;
  std::unordered_set<std::string> special_;
  Trie raw_trie_;         // normalized = false: matched on the input first
  Trie normalized_trie_;  // normalized = true: matched in what is left
  bool has_normalized_ = false;
  int32_t max_id_ = -1;
};

}  // namespace kestrel::text
