// Pre-tokenizer stages. Each stage finds the segments of a piece, applies the
// split behaviour and passes every kept sub-piece to the next stage, depth
// first, so no list of strings is ever built.
#include "text/pre_tokenizer.h"

#include <algorithm>
#include <array>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/unicode.h"

namespace kestrel::text {

namespace {

// GPT-2's pattern, as HF's ByteLevel pre-tokenizer uses it.
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class StageKind { kPunctuation, kDigits, kSplit, kByteLevel };

// Segments where each character for which pred holds is a one-character match.
template <typename Pred>
void char_segments(std::string_view s, Pred pred, std::vector<Segment>& out) {
  size_t last = 0, i = 0;
  while (i < s.size()) {
    size_t len;
    const char32_t cp = decode_utf8(s, i, len);
    if (pred(cp)) {
      if (last < i) out.push_back({last, i, false});
      out.push_back({i, i + len, true});
      last = i + len;
    }
    i += len;
  }
  if (last < s.size()) out.push_back({last, s.size(), false});
}

// Segments from regex matches (HF's Pattern::find_matches for a regex).
void regex_segments(std::string_view s, const Regex& re, bool invert,
                    std::vector<std::pair<size_t, size_t>>& matches, std::vector<Segment>& out) {
  matches.clear();
  re.find_all(s, matches);
  size_t prev = 0;
  for (const auto& [start, end] : matches) {
    if (prev != start) out.push_back({prev, start, invert});
    out.push_back({start, end, !invert});
    prev = end;
  }
  if (prev != s.size()) out.push_back({prev, s.size(), invert});
}

std::string json_string(const nlohmann::json& j, const char* key, const char* where) {
  KESTREL_CHECK(j.contains(key) && j[key].is_string(), where, " needs a string field '", key, "'");
  return j[key].get<std::string>();
}

bool json_bool(const nlohmann::json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  KESTREL_CHECK(j[key].is_boolean(), "field '", key, "' must be a boolean");
  return j[key].get<bool>();
}

// Byte b in GPT-2's alphabet, as UTF-8 (one or two bytes).
struct MappedByte {
  char bytes[2];
  uint8_t len;
};

const std::array<MappedByte, 256>& mapped_bytes() {
  static const std::array<MappedByte, 256> table = [] {
    std::array<MappedByte, 256> t{};
    for (int b = 0; b < 256; ++b) {
      std::string s;
      append_utf8(byte_to_unicode()[b], s);
      t[b].len = static_cast<uint8_t>(s.size());
      for (size_t k = 0; k < s.size(); ++k) t[b].bytes[k] = s[k];
    }
    return t;
  }();
  return table;
}

}  // namespace

struct PreTokenizer::Stage {
  StageKind kind;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
  std::unique_ptr<Regex> regex;  // Split's pattern, or ByteLevel's when use_regex
};

SplitBehavior parse_split_behavior(std::string_view name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  KESTREL_FAIL("unknown split behavior '", name,
               "' (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
}

void apply_split_behavior(const std::vector<Segment>& segs, SplitBehavior behavior,
                          std::vector<std::pair<size_t, size_t>>& out) {
  // `keep` ranges are built first (with possibly empty ones), then filtered.
  const size_t first = out.size();
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& s : segs) out.emplace_back(s.start, s.end);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& s : segs)
        if (!s.is_match) out.emplace_back(s.start, s.end);
      break;
    case SplitBehavior::kContiguous: {
      bool prev = false;
      for (const auto& s : segs) {
        if (s.is_match == prev && out.size() > first) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.start, s.end);
        }
        prev = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool prev = false;
      for (const auto& s : segs) {
        if (s.is_match && !prev && out.size() > first) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.start, s.end);
        }
        prev = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev = false;
      for (size_t k = segs.size(); k-- > 0;) {
        const auto& s = segs[k];
        if (s.is_match && !prev && out.size() > first) {
          out.back().first = s.start;
        } else {
          out.emplace_back(s.start, s.end);
        }
        prev = s.is_match;
      }
      std::reverse(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
      break;
    }
  }
  size_t w = first;
  for (size_t r = first; r < out.size(); ++r)
    if (out[r].first != out[r].second) out[w++] = out[r];
  out.resize(w);
}

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j) {
  PreTokenizer p;
  if (!j.is_null()) p.add_stage(j);
  return p;
}

void PreTokenizer::add_stage(const nlohmann::json& j) {
  KESTREL_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(),
                "pre_tokenizer must be an object with a string 'type'");
  const std::string type = j["type"].get<std::string>();
  auto stage = std::make_unique<Stage>();
  if (type == "Sequence") {
    KESTREL_CHECK(j.contains("pretokenizers") && j["pretokenizers"].is_array(),
                  "pre_tokenizer Sequence needs an array 'pretokenizers'");
    // A nested Sequence applies its members in order to every piece: flattening is exact.
    for (const auto& sub : j["pretokenizers"]) add_stage(sub);
    return;
  } else if (type == "Punctuation") {
    stage->kind = StageKind::kPunctuation;
    if (j.contains("behavior"))
      stage->behavior = parse_split_behavior(json_string(j, "behavior", "Punctuation"));
  } else if (type == "Digits") {
    stage->kind = StageKind::kDigits;
    stage->behavior = json_bool(j, "individual_digits", false) ? SplitBehavior::kIsolated
                                                               : SplitBehavior::kContiguous;
  } else if (type == "Split") {
    stage->kind = StageKind::kSplit;
    KESTREL_CHECK(
        j.contains("pattern") && j["pattern"].is_object(),
        "pre_tokenizer Split needs an object 'pattern' ({\"String\": ...} or {\"Regex\": ...})");
    const auto& pat = j["pattern"];
    if (pat.contains("String") && pat["String"].is_string()) {
      stage->regex = std::make_unique<Regex>(pat["String"].get<std::string>(), /*literal=*/true);
    } else if (pat.contains("Regex") && pat["Regex"].is_string()) {
      stage->regex = std::make_unique<Regex>(pat["Regex"].get<std::string>());
    } else {
      KESTREL_FAIL("pre_tokenizer Split: pattern must be {\"String\": ...} or {\"Regex\": ...}");
    }
    stage->behavior = parse_split_behavior(json_string(j, "behavior", "pre_tokenizer Split"));
    stage->invert = json_bool(j, "invert", false);
  } else if (type == "ByteLevel") {
    stage->kind = StageKind::kByteLevel;
    stage->add_prefix_space = json_bool(j, "add_prefix_space", true);
    if (json_bool(j, "use_regex", true)) stage->regex = std::make_unique<Regex>(kByteLevelPattern);
    has_byte_level_ = true;
  } else {
    KESTREL_FAIL("unsupported pre_tokenizer type '", type,
                 "' (supported: Sequence, Punctuation, ByteLevel, Digits, Split)");
  }
  stages_.push_back(std::move(stage));
}

void PreTokenizer::run(std::string_view text, Scratch& scratch, WordSink& sink) const {
  if (scratch.levels.size() < stages_.size()) scratch.levels.resize(stages_.size());
  if (!text.empty()) run_stage(0, text, scratch, sink);
}

void PreTokenizer::run_stage(size_t level, std::string_view piece, Scratch& scratch,
                             WordSink& sink) const {
  if (level == stages_.size()) {
    sink.word(piece);
    return;
  }
  const Stage& st = *stages_[level];
  Scratch::Level& lv = scratch.levels[level];
  lv.segments.clear();
  lv.ranges.clear();
  std::string_view src = piece;
  switch (st.kind) {
    case StageKind::kPunctuation:
      char_segments(piece, is_punctuation, lv.segments);
      break;
    case StageKind::kDigits:
      char_segments(piece, is_numeric, lv.segments);
      break;
    case StageKind::kSplit:
      regex_segments(piece, *st.regex, st.invert, lv.matches, lv.segments);
      break;
    case StageKind::kByteLevel:
      if (st.add_prefix_space && piece.front() != ' ') {
        lv.prefixed.assign(1, ' ');
        lv.prefixed.append(piece);
        src = lv.prefixed;
      }
      if (st.regex) {
        regex_segments(src, *st.regex, false, lv.matches, lv.segments);
      } else {
        lv.segments.push_back({0, src.size(), false});
      }
      break;
  }
  apply_split_behavior(lv.segments, st.behavior, lv.ranges);
  if (st.kind != StageKind::kByteLevel) {
    for (size_t r = 0; r < lv.ranges.size(); ++r) {
      const auto [start, end] = lv.ranges[r];
      run_stage(level + 1, piece.substr(start, end - start), scratch, sink);
    }
    return;
  }
  const auto& table = mapped_bytes();
  for (size_t r = 0; r < lv.ranges.size(); ++r) {
    const auto [start, end] = lv.ranges[r];
    lv.mapped.clear();
    for (size_t i = start; i < end; ++i) {
      const MappedByte& m = table[static_cast<unsigned char>(src[i])];
      lv.mapped.append(m.bytes, m.len);
    }
    run_stage(level + 1, lv.mapped, scratch, sink);
  }
}

}  // namespace kestrel::text
