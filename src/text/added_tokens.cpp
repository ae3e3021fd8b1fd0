// Added tokens: id assignment (HF AddedVocabulary::add_tokens) and matching
// (AddedVocabulary::find_matches, applied to the raw input and then to the
// pieces left over for normalized tokens).
#include "text/added_tokens.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"
#include "text/unicode.h"

namespace kestrel::text {

namespace {

AddedToken parse_added_token(const nlohmann::json& j, size_t index) {
  KESTREL_CHECK(j.is_object() && j.contains("content") && j["content"].is_string(), "added_tokens[",
                index, "] needs a string 'content'");
  AddedToken t;
  t.content = j["content"].get<std::string>();
  auto flag = [&](const char* key, bool fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    KESTREL_CHECK(j[key].is_boolean(), "added_tokens[", index, "].", key, " must be a boolean");
    return j[key].get<bool>();
  };
  t.special = flag("special", false);
  t.single_word = flag("single_word", false);
  t.lstrip = flag("lstrip", false);
  t.rstrip = flag("rstrip", false);
  t.normalized = flag("normalized", !t.special);
  return t;
}

// The code point ending at s[end) (s valid UTF-8, end > 0).
char32_t last_char(std::string_view s, size_t end, size_t& start) {
  start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t len;
  return decode_utf8(s, start, len);
}

}  // namespace

void AddedTokens::Trie::insert(std::string_view s, int32_t id) {
  int32_t node = 0;
  for (unsigned char c : s) {
    auto& ch = nodes[node].children;
    auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, int32_t{-1}));
    if (it == ch.end() || it->first != c) {
      const auto next = static_cast<int32_t>(nodes.size());
      it = ch.insert(it, {c, next});
      nodes.emplace_back();
    }
    node = it->second;
  }
  first_byte[static_cast<unsigned char>(s[0])] = true;
  nodes[node].id = id;
}

std::pair<size_t, int32_t> AddedTokens::Trie::longest_at(std::string_view text, size_t pos) const {
  std::pair<size_t, int32_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const auto& ch = nodes[node].children;
    auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, int32_t{-1}));
    if (it == ch.end() || it->first != c) break;
    node = it->second;
    if (nodes[node].id >= 0) best = {i + 1 - pos, nodes[node].id};
  }
  return best;
}

AddedTokens AddedTokens::from_json(const nlohmann::json& added, const Bpe& model) {
  AddedTokens at;
  if (added.is_null()) return at;
  KESTREL_CHECK(added.is_array(), "tokenizer.json: 'added_tokens' must be an array");
  std::vector<AddedToken> tokens;
  for (size_t i = 0; i < added.size(); ++i) tokens.push_back(parse_added_token(added[i], i));
  std::vector<const AddedToken*> special_list, plain_list;
  for (const auto& t : tokens) {
    if (t.special && !t.content.empty() && at.special_.insert(t.content).second)
      special_list.push_back(&t);
  }
  const auto model_size = static_cast<int32_t>(model.vocab().size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const AddedToken& t = tokens[i];
    const bool seen = std::any_of(at.by_id_.begin(), at.by_id_.end(),
                                  [&](const auto& kv) { return kv.second == t; });
    if (t.content.empty() || seen) continue;
    int32_t id;
    if (auto known = at.token_id(t.content)) {
      id = *known;
    } else if (auto in_model = model.token_id(t.content)) {
      id = *in_model;
    } else if (at.ids_.empty()) {
      id = model_size;
    } else {
      int32_t max = -1;
      for (const auto& kv : at.ids_) max = std::max(max, kv.second);
      id = (max >= model_size || model_size == 0) ? max + 1 : model_size;
    }
    if (added[i].contains("id") && added[i]["id"].is_number_integer() &&
        added[i]["id"].get<int64_t>() != id) {
      spdlog::warn("tokenizer.json: added token '{}' has id {} but is assigned id {}", t.content,
                   added[i]["id"].get<int64_t>(), id);
    }
    at.ids_[t.content] = id;
    at.by_id_[id] = t;
    at.max_id_ = std::max(at.max_id_, id);
    if (!at.special_.count(t.content)) plain_list.push_back(&t);
  }
  for (const auto* list : {&special_list, &plain_list}) {
    for (const AddedToken* t : *list) {
      const int32_t id = at.ids_.find(t->content)->second;
      if (t->normalized) {
        at.normalized_trie_.insert(t->content, id);
        at.has_normalized_ = true;
      } else {
        at.raw_trie_.insert(t->content, id);
      }
    }
  }
  return at;
}

std::optional<int32_t> AddedTokens::token_id(std::string_view content) const {
  const auto it = ids_.find(content);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

const AddedToken* AddedTokens::token(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

bool AddedTokens::is_special(int32_t id) const {
  const AddedToken* t = token(id);
  return t && special_.count(t->content);
}

void AddedTokens::find_matches(std::string_view s, size_t base, const Trie& trie,
                               std::vector<Piece>& out) const {
  auto push = [&](size_t start, size_t end, int32_t id) {
    if (start < end) out.push_back({base + start, base + end, id});
  };
  size_t start_offset = 0;
  for (size_t pos = 0; pos < s.size();) {
    if (!trie.first_byte[static_cast<unsigned char>(s[pos])]) {
      ++pos;
      continue;
    }
    const auto [len, id] = trie.longest_at(s, pos);
    if (id < 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + len;
    pos = stop;
    const AddedToken& t = by_id_.find(id)->second;
    if (t.single_word) {
      size_t unused, clen;
      const bool word_before = start > 0 && is_word_char(last_char(s, start, unused));
      const bool word_after = stop < s.size() && is_word_char(decode_utf8(s, stop, clen));
      if (word_before || word_after) continue;
    }
    if (t.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t cstart;
        if (!is_whitespace(last_char(s, new_start, cstart))) break;
        new_start = cstart;
      }
      start = std::max(new_start, start_offset);
    }
    if (t.rstrip) {
      size_t clen;
      while (stop < s.size() && is_whitespace(decode_utf8(s, stop, clen))) stop += clen;
      pos = std::max(pos, stop);
    }
    start = std::max(start, start_offset);
    push(start_offset, start, -1);
    out.push_back({base + start, base + stop, id});
    start_offset = stop;
  }
  push(start_offset, s.size(), -1);
}

void AddedTokens::split(std::string_view text, std::vector<Piece>& out) const {
  out.clear();
  if (by_id_.empty()) {
    if (!text.empty()) out.push_back({0, text.size(), -1});
    return;
  }
  find_matches(text, 0, raw_trie_, out);
  if (!has_normalized_) return;
  std::vector<Piece> first;
  first.swap(out);
  for (const Piece& p : first) {
    if (p.id >= 0) {
      out.push_back(p);
    } else {
      find_matches(text.substr(p.start, p.end - p.start), p.start, normalized_trie_, out);
    }
  }
}

}  // namespace kestrel::text
