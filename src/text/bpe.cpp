// BPE: loading vocab and merges, and the merge loop. Merges run lowest rank
// first, leftmost first among equal ranks, one pair at a time (HF's
// Word::merge_all), over a linked list of symbols and a binary heap.
#include "text/bpe.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/unicode.h"

namespace kestrel::text {

namespace {

constexpr uint64_t kEmptyKey = ~uint64_t{0};

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

// Parses one merge, either "a b" or ["a", "b"].
std::pair<std::string, std::string> parse_merge(const nlohmann::json& m, size_t index) {
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const size_t sp = s.find(' ');
    KESTREL_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                  "BPE merge #", index, " '", s, "' is not two tokens separated by one space");
    return {s.substr(0, sp), s.substr(sp + 1)};
  }
  KESTREL_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                "BPE merge #", index, " must be \"a b\" or [\"a\", \"b\"], got ", m.dump());
  return {m[0].get<std::string>(), m[1].get<std::string>()};
}

std::optional<std::string> optional_string(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  KESTREL_CHECK(j[key].is_string(), "BPE field '", key, "' must be a string or null");
  return j[key].get<std::string>();
}

bool optional_bool(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return false;
  KESTREL_CHECK(j[key].is_boolean(), "BPE field '", key, "' must be a boolean");
  return j[key].get<bool>();
}

}  // namespace

size_t StringHash::operator()(std::string_view s) const noexcept {
  // FNV-1a over 8-byte words, then a final mix: fast for short tokens.
  uint64_t h = 0xcbf29ce484222325ULL ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ULL;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0x100000001b3ULL;
  return static_cast<size_t>(mix(h));
}

std::unique_ptr<Bpe> Bpe::from_json(const nlohmann::json& model) {
  KESTREL_CHECK(model.is_object(), "tokenizer.json: 'model' must be an object");
  if (model.contains("type")) {
    KESTREL_CHECK(model["type"].is_string(), "tokenizer.json: model 'type' must be a string");
    const std::string type = model["type"].get<std::string>();
    if (type != "BPE") KESTREL_FAIL("unsupported model type '", type, "' (supported: BPE)");
  }
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    KESTREL_CHECK(model["dropout"].is_number(), "BPE 'dropout' must be a number or null");
    KESTREL_CHECK(model["dropout"].get<double>() == 0.0,
                  "BPE dropout is not supported (it makes encoding random)");
  }
  auto bpe = std::make_unique<Bpe>();
  KESTREL_CHECK(model.contains("vocab") && model["vocab"].is_object(),
                "tokenizer.json: BPE model needs an object 'vocab'");
  bpe->vocab_.reserve(model["vocab"].size());
  for (const auto& [token, id] : model["vocab"].items()) {
    KESTREL_CHECK(
        id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t{1} << 30),
        "BPE vocab entry '", token, "' has an invalid id ", id.dump());
    const auto i = static_cast<int32_t>(id.get<int64_t>());
    bpe->vocab_[token] = i;
    bpe->max_id_ = std::max(bpe->max_id_, i);
  }
  bpe->unk_token_ = optional_string(model, "unk_token");
  bpe->prefix_ = optional_string(model, "continuing_subword_prefix").value_or("");
  bpe->suffix_ = optional_string(model, "end_of_word_suffix").value_or("");
  bpe->fuse_unk_ = optional_bool(model, "fuse_unk");
  bpe->byte_fallback_ = optional_bool(model, "byte_fallback");
  bpe->ignore_merges_ = optional_bool(model, "ignore_merges");
  if (bpe->unk_token_) {
    KESTREL_CHECK(bpe->vocab_.count(*bpe->unk_token_), "BPE unk_token '", *bpe->unk_token_,
                  "' is not in the vocabulary");
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    bpe->byte_fallback_ids_[b] = bpe->token_id(name).value_or(-1);
  }
  for (char32_t cp = 0; cp < bpe->char_ids_.size(); ++cp) {
    std::string c;
    append_utf8(cp, c);
    bpe->char_ids_[cp] = bpe->token_id(c).value_or(-1);
  }
  KESTREL_CHECK(!model.contains("merges") || model["merges"].is_array(),
                "tokenizer.json: BPE 'merges' must be an array");
  bpe->build_merges(model.contains("merges") ? model["merges"] : nlohmann::json::array());
  return bpe;
}

void Bpe::build_merges(const nlohmann::json& merges) {
  size_t cap = 16;
  while (cap < 2 * merges.size()) cap *= 2;
  pairs_.assign(cap, PairEntry{kEmptyKey, 0, 0});
  pair_mask_ = cap - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    auto [a, b] = parse_merge(merges[rank], rank);
    const auto ia = token_id(a), ib = token_id(b);
    KESTREL_CHECK(ia, "BPE merge #", rank, ": token '", a, "' is not in the vocabulary");
    KESTREL_CHECK(ib, "BPE merge #", rank, ": token '", b, "' is not in the vocabulary");
    const std::string_view b_rest = std::string_view(b).substr(
        !prefix_.empty() && b.compare(0, prefix_.size(), prefix_) == 0 ? prefix_.size() : 0);
    const std::string merged = a + std::string(b_rest);
    const auto im = token_id(merged);
    KESTREL_CHECK(im, "BPE merge #", rank, ": merged token '", merged,
                  "' is not in the vocabulary");
    insert_pair(*ia, *ib, static_cast<uint32_t>(rank), *im);
  }
  n_merges_ = merges.size();
}

void Bpe::insert_pair(int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
  const uint64_t key = pair_key(a, b);
  for (uint64_t slot = mix(key) & pair_mask_;; slot = (slot + 1) & pair_mask_) {
    PairEntry& e = pairs_[slot];
    if (e.key == kEmptyKey || e.key == key) {
      // A repeated merge keeps its last rank, as HF's HashMap collect does.
      e = PairEntry{key, rank, new_id};
      return;
    }
  }
}

const Bpe::PairEntry* Bpe::find_pair(int32_t a, int32_t b) const {
  const uint64_t key = pair_key(a, b);
  for (uint64_t slot = mix(key) & pair_mask_;; slot = (slot + 1) & pair_mask_) {
    const PairEntry& e = pairs_[slot];
    if (e.key == key) return &e;
    if (e.key == kEmptyKey) return nullptr;
  }
}

std::optional<int32_t> Bpe::token_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

int32_t Bpe::lookup_char(std::string_view c, bool first, bool last, Scratch& scratch) const {
  const bool decorated = (!first && !prefix_.empty()) || (last && !suffix_.empty());
  if (!decorated) {
    size_t len;
    const char32_t cp = decode_utf8(c, 0, len);
    if (cp < char_ids_.size()) return char_ids_[cp];
    return token_id(c).value_or(-1);
  }
  scratch.piece.clear();
  if (!first) scratch.piece += prefix_;
  scratch.piece += c;
  if (last) scratch.piece += suffix_;
  return token_id(scratch.piece).value_or(-1);
}

void Bpe::word_symbols(std::string_view word, Scratch& scratch) const {
  auto& syms = scratch.symbols;
  syms.clear();
  auto add = [&](int32_t id, uint32_t len) {
    const auto n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, -1, len});
    if (n > 0) syms[n - 1].next = n;
  };
  // A pending unknown token (id -1: none) and the bytes it covers; plain
  // variables, not an optional pair (GCC 12 warns falsely on that).
  int32_t unk = -1;
  uint32_t unk_len = 0;
  for (size_t i = 0; i < word.size();) {
    size_t len;
    decode_utf8(word, i, len);
    const std::string_view c = word.substr(i, len);
    const bool first = i == 0, last = i + len == word.size();
    i += len;
    const int32_t id = lookup_char(c, first, last, scratch);
    if (id >= 0) {
      if (unk >= 0) add(unk, unk_len), unk = -1;
      add(id, static_cast<uint32_t>(len));
      continue;
    }
    if (byte_fallback_) {
      // Byte fallback tokens spell the decorated piece's bytes.
      std::string piece =
          (!first ? prefix_ : std::string()) + std::string(c) + (last ? suffix_ : "");
      const bool all = std::all_of(piece.begin(), piece.end(), [&](char ch) {
        return byte_fallback_ids_[static_cast<unsigned char>(ch)] >= 0;
      });
      if (all) {
        for (char ch : piece) add(byte_fallback_ids_[static_cast<unsigned char>(ch)], 1);
        continue;
      }
    }
    if (unk_token_) {
      const int32_t unk_id = vocab_.find(*unk_token_)->second;
      if (unk >= 0 && fuse_unk_) {
        unk_len += static_cast<uint32_t>(len);
      } else {
        if (unk >= 0) add(unk, unk_len);
        unk = unk_id;
        unk_len = static_cast<uint32_t>(len);
      }
    }
  }
  if (unk >= 0) add(unk, unk_len);
}

void Bpe::merge_symbols(Scratch& scratch) const {
  auto& syms = scratch.symbols;
  auto& heap = scratch.heap;
  heap.clear();
  // std heap is a max-heap: "greater" puts the lowest (rank, pos) on top.
  auto later = [](const Scratch::Merge& x, const Scratch::Merge& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  auto push = [&](int32_t pos) {
    const int32_t next = syms[pos].next;
    if (next < 0) return;
    if (const PairEntry* e = find_pair(syms[pos].id, syms[next].id)) {
      heap.push_back({e->rank, pos, e->new_id});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Scratch::Merge top = heap.back();
    heap.pop_back();
    Scratch::Symbol& left = syms[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    const int32_t right_pos = left.next;
    const PairEntry* e = find_pair(left.id, syms[right_pos].id);
    if (!e || e->new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    left.len += syms[right_pos].len;
    left.next = syms[right_pos].next;
    syms[right_pos].len = 0;
    if (left.next >= 0) syms[left.next].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
}

void Bpe::encode_word(std::string_view word, Scratch& scratch, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto id = token_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() > 3 && word.size() <= kMaxCachedWordBytes;
  const size_t hash = cacheable ? StringHash{}(word) : 0;
  CacheShard& shard = cache_[(hash >> 7) % kCacheShards];
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mu);
    const auto it = shard.words.find(word);
    if (it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  word_symbols(word, scratch);
  merge_symbols(scratch);
  const size_t first = out.size();
  for (const auto& s : scratch.symbols)
    if (s.len != 0) out.push_back(s.id);
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.words.size() >= kCacheShardCapacity) shard.words.clear();
    shard.words.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace kestrel::text
