// The pieces of tokenizer.json on small hand-made inputs: split behaviours,
// pre-tokenizers, added-token options, BPE merges, and the loading errors.
// Expected values are what HF tokenizers 0.23 gives for the same input.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../test_data.h"
#include "core/error.h"
#include "text/pre_tokenizer.h"
#include "text/regex.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace kestrel::text {
namespace {

using Words = std::vector<std::string>;

class Collect final : public WordSink {
 public:
  void word(std::string_view w) override { words.emplace_back(w); }
  Words words;
};

Words pre_tokenize(const nlohmann::json& j, std::string_view text) {
  const PreTokenizer p = PreTokenizer::from_json(j);
  PreTokenizer::Scratch scratch;
  Collect sink;
  p.run(text, scratch, sink);
  return sink.words;
}

nlohmann::json split(const char* behavior, bool invert) {
  return {{"type", "Split"},
          {"pattern", {{"String", "-"}}},
          {"behavior", behavior},
          {"invert", invert}};
}

TEST(SplitTest, EveryBehavior) {
  const std::string text = "the-final--countdown-";
  EXPECT_EQ(pre_tokenize(split("Removed", false), text), (Words{"the", "final", "countdown"}));
  EXPECT_EQ(pre_tokenize(split("Isolated", false), text),
            (Words{"the", "-", "final", "-", "-", "countdown", "-"}));
  EXPECT_EQ(pre_tokenize(split("MergedWithPrevious", false), text),
            (Words{"the-", "final-", "-", "countdown-"}));
  EXPECT_EQ(pre_tokenize(split("MergedWithNext", false), text),
            (Words{"the", "-final", "-", "-countdown", "-"}));
  EXPECT_EQ(pre_tokenize(split("Contiguous", false), text),
            (Words{"the", "-", "final", "--", "countdown", "-"}));
}

TEST(SplitTest, EveryBehaviorInverted) {
  const std::string text = "the-final--countdown-";
  EXPECT_EQ(pre_tokenize(split("Removed", true), text), (Words{"-", "-", "-", "-"}));
  EXPECT_EQ(pre_tokenize(split("Isolated", true), text),
            (Words{"the", "-", "final", "-", "-", "countdown", "-"}));
  EXPECT_EQ(pre_tokenize(split("MergedWithPrevious", true), text),
            (Words{"the", "-final", "-", "-countdown", "-"}));
  EXPECT_EQ(pre_tokenize(split("MergedWithNext", true), text),
            (Words{"the-", "final-", "-", "countdown-"}));
  EXPECT_EQ(pre_tokenize(split("Contiguous", true), text),
            (Words{"the", "-", "final", "--", "countdown", "-"}));
}

TEST(SplitTest, RegexWithEmptyMatches) {
  const nlohmann::json j = {
      {"type", "Split"}, {"pattern", {{"Regex", "x*"}}}, {"behavior", "Contiguous"}};
  EXPECT_EQ(pre_tokenize(j, "axxb"), (Words{"a", "xx", "b"}));
}

TEST(SplitTest, UnknownBehaviorIsAnError) {
  try {
    pre_tokenize(split("Sideways", false), "a-b");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown split behavior 'Sideways'"), std::string::npos);
  }
}

TEST(PreTokenizerTest, PunctuationBehaviors) {
  auto punct = [](const char* b) {
    return nlohmann::json{{"type", "Punctuation"}, {"behavior", b}};
  };
  const std::string text = "Hi!! you?..ok";
  EXPECT_EQ(pre_tokenize(punct("Removed"), text), (Words{"Hi", " you", "ok"}));
  EXPECT_EQ(pre_tokenize(punct("Isolated"), text),
            (Words{"Hi", "!", "!", " you", "?", ".", ".", "ok"}));
  EXPECT_EQ(pre_tokenize(punct("MergedWithPrevious"), text),
            (Words{"Hi!", "!", " you?", ".", ".", "ok"}));
  EXPECT_EQ(pre_tokenize(punct("MergedWithNext"), text),
            (Words{"Hi", "!", "! you", "?", ".", ".ok"}));
  EXPECT_EQ(pre_tokenize(punct("Contiguous"), text), (Words{"Hi", "!!", " you", "?..", "ok"}));
}

TEST(PreTokenizerTest, Digits) {
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", false}}, "a123b45"),
            (Words{"a", "123", "b", "45"}));
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", true}}, "a123b45"),
            (Words{"a", "1", "2", "3", "b", "4", "5"}));
}

TEST(PreTokenizerTest, ByteLevelRegexAndPrefixSpace) {
  const nlohmann::json with = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(pre_tokenize(with, "Hello world's  end"),
            (Words{"ĠHello", "Ġworld", "'s", "Ġ", "Ġend"}));
  const nlohmann::json without = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  EXPECT_EQ(pre_tokenize(without, "Hi you é"), (Words{"HiĠyouĠÃ©"}));
}

TEST(PreTokenizerTest, UnsupportedTypeIsNamed) {
  try {
    pre_tokenize({{"type", "Metaspace"}}, "x");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported pre_tokenizer type 'Metaspace'"),
              std::string::npos);
  }
}

TEST(RegexTest, OnigurumaClasses) {
  EXPECT_EQ(onig_to_pcre2(R"(\s+(?!\S))"), R"(\p{White_Space}+(?!\P{White_Space}))");
  EXPECT_EQ(onig_to_pcre2(R"([^\s\w])"), R"([^\p{White_Space}\p{L}\p{M}\p{Nd}\p{Pc}])");
  EXPECT_EQ(onig_to_pcre2(R"(\\s)"), R"(\\s)");
  // U+180E is no White_Space since Unicode 6.3 (PCRE2's own \s still takes it).
  std::vector<std::pair<size_t, size_t>> m;
  Regex(R"(\s)").find_all("\xE1\xA0\x8E", m);
  EXPECT_TRUE(m.empty());
}

// A small byte-level tokenizer: the 256 byte tokens have the byte's value as
// id, "hi" is 256 and the only merge is h + i.
nlohmann::json small_tokenizer(nlohmann::json added) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    std::string c;
    append_utf8(byte_to_unicode()[b], c);
    vocab[c] = b;
  }
  vocab["hi"] = 256;
  nlohmann::json j = nlohmann::json::object();
  j["added_tokens"] = std::move(added);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = nlohmann::json::object();
  j["model"]["type"] = "BPE";
  j["model"]["vocab"] = vocab;
  j["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"h", "i"})});
  return j;
}

nlohmann::json added(const char* content, nlohmann::json options = nlohmann::json::object()) {
  nlohmann::json t = {{"id", 300},       {"content", content}, {"single_word", false},
                      {"lstrip", false}, {"rstrip", false},    {"normalized", false},
                      {"special", true}};
  t.update(options);
  return t;
}

nlohmann::json list(const std::vector<nlohmann::json>& tokens) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& t : tokens) a.push_back(t);
  return a;
}

std::vector<int32_t> encode_with(const std::vector<nlohmann::json>& tokens, std::string_view text) {
  return Tokenizer::from_json(small_tokenizer(list(tokens)).dump()).encode(text);
}

using Ids = std::vector<int32_t>;

TEST(AddedTokensTest, LstripAndRstrip) {
  EXPECT_EQ(encode_with({added("<m>", {{"lstrip", true}, {"rstrip", true}})}, "a  <m>  b"),
            (Ids{97, 257, 98}));
  EXPECT_EQ(encode_with({added("<m>", {{"lstrip", true}})}, "a \t<m> b"), (Ids{97, 257, 32, 98}));
  // U+3000 is White_Space, so rstrip takes it too.
  EXPECT_EQ(encode_with({added("<m>", {{"rstrip", true}})}, "a <m> \u3000b"),
            (Ids{97, 32, 257, 98}));
}

TEST(AddedTokensTest, SingleWord) {
  EXPECT_EQ(encode_with({added("<m>", {{"single_word", true}})}, "<m> x<m> <m>y <m>"),
            (Ids{257, 32, 120, 60, 109, 62, 32, 60, 109, 62, 121, 32, 257}));
}

TEST(AddedTokensTest, LongestFirstAndIdsAfterTheVocabulary) {
  // The ids in the file (300) are not used: HF numbers new tokens after the vocabulary.
  EXPECT_EQ(encode_with({added("<a>"), added("<a><b>")}, "x<a><b><a>"), (Ids{120, 258, 257}));
}

TEST(AddedTokensTest, NormalizedTokensMatchAfterRawOnes) {
  EXPECT_EQ(encode_with({added("abcd", {{"normalized", true}, {"special", false}}), added("abc")},
                        "abcd"),
            (Ids{258, 100}));
}

TEST(AddedTokensTest, NonSpecialTokensSurviveSkipSpecial) {
  const auto t = Tokenizer::from_json(
      small_tokenizer(list({added("zz", {{"special", false}}), added("<s>")})).dump());
  const auto ids = t.encode("<s>azzb");
  EXPECT_EQ(ids, (Ids{258, 97, 257, 98}));
  EXPECT_EQ(t.decode(ids, true), "azzb");
  EXPECT_FALSE(t.is_special(257));
  EXPECT_TRUE(t.is_special(258));
}

TEST(BpeTest, MergesAsStringsOrPairs) {
  auto j = small_tokenizer(nlohmann::json::array());
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("hih"), (Ids{256, 104}));
  j["model"]["merges"] = {"h i"};
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("hih"), (Ids{256, 104}));
}

// Expects from_json(json) to throw an Error whose message holds `part`.
void expect_load_error(const std::string& json, const std::string& part) {
  try {
    Tokenizer::from_json(json);
    FAIL() << "no error, expected: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(LoadErrorTest, UnknownComponentsAreNamed) {
  auto j = small_tokenizer(nlohmann::json::array());
  auto with = [&](const char* key, nlohmann::json v) {
    auto k = j;
    k[key] = std::move(v);
    return k.dump();
  };
  expect_load_error(with("normalizer", {{"type", "NFC"}}), "unsupported normalizer type 'NFC'");
  expect_load_error(with("pre_tokenizer", {{"type", "Whitespace"}}),
                    "unsupported pre_tokenizer type 'Whitespace'");
  expect_load_error(with("decoder", {{"type", "WordPiece"}}),
                    "unsupported decoder type 'WordPiece'");
  expect_load_error(with("post_processor", {{"type", "TemplateProcessing"}}),
                    "unsupported post_processor type 'TemplateProcessing'");
  expect_load_error(with("model", {{"type", "Unigram"}, {"vocab", nlohmann::json::array()}}),
                    "unsupported model type 'Unigram'");
}

TEST(LoadErrorTest, OptionsThatWouldChangeTheIdsAreRefused) {
  auto j = small_tokenizer(nlohmann::json::array());
  j["model"]["dropout"] = 0.1;
  expect_load_error(j.dump(), "BPE dropout is not supported");
  j["model"]["dropout"] = nullptr;
  EXPECT_EQ(Tokenizer::from_json(j.dump()).encode("hi"), (Ids{256}));
  auto k = j;
  k["truncation"] = {
      {"direction", "Right"}, {"max_length", 512}, {"strategy", "LongestFirst"}, {"stride", 0}};
  expect_load_error(k.dump(), "unsupported 'truncation'");
  k = j;
  k["padding"] = {{"strategy", {{"Fixed", 16}}}, {"pad_id", 0}, {"pad_token", "<pad>"}};
  expect_load_error(k.dump(), "unsupported 'padding'");
  k["padding"] = {{"strategy", "BatchLongest"}, {"pad_to_multiple_of", 8}};
  expect_load_error(k.dump(), "unsupported 'padding'");
  // BatchLongest leaves one text as it is: accepted.
  k["padding"] = {{"strategy", "BatchLongest"}, {"pad_to_multiple_of", nullptr}, {"pad_id", 0}};
  EXPECT_EQ(Tokenizer::from_json(k.dump()).encode("hih"), (Ids{256, 104}));
}

TEST(LoadErrorTest, MalformedJsonAndBadFields) {
  expect_load_error("{\"model\": ", "tokenizer.json: malformed JSON");
  expect_load_error("[1, 2]", "tokenizer.json must be a JSON object");
  auto j = small_tokenizer(nlohmann::json::array());
  j["model"]["merges"] = {"h x"};
  j["model"]["vocab"].erase("x");
  expect_load_error(j.dump(), "BPE merge #0: token 'x' is not in the vocabulary");
  j = small_tokenizer(nlohmann::json::array());
  j["model"]["merges"] = {"hi"};
  expect_load_error(j.dump(), "is not two tokens separated by one space");
  j = small_tokenizer(nlohmann::json::array());
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_load_error(j.dump(), "regex '(unclosed' does not compile");
  j = small_tokenizer(nlohmann::json::array());
  j["model"]["vocab"]["h"] = "seven";
  expect_load_error(j.dump(), "BPE vocab entry 'h' has an invalid id");
}

TEST(LoadErrorTest, MissingFileIsNamed) {
  try {
    Tokenizer::from_file("/nonexistent/tokenizer.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos);
  }
}

// HF's classes of every code point from U+0080 (gen_hf_unicode_classes.py):
// class letter -> sorted [first, last] ranges.
std::map<char, std::vector<std::pair<char32_t, char32_t>>> hf_classes() {
  std::ifstream in(test::test_data_dir() + "/tokenizer/hf-unicode-classes.txt");
  std::map<char, std::vector<std::pair<char32_t, char32_t>>> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line.substr(2));
    for (std::string r; ss >> r;) {
      const size_t dash = r.find('-');
      const auto first = static_cast<char32_t>(std::stoul(r.substr(0, dash), nullptr, 16));
      const auto last = dash == std::string::npos
                            ? first
                            : static_cast<char32_t>(std::stoul(r.substr(dash + 1), nullptr, 16));
      out[line[0]].emplace_back(first, last);
    }
  }
  return out;
}

// Whether cp lies in the sorted ranges.
bool in_ranges(const std::vector<std::pair<char32_t, char32_t>>& r, char32_t cp) {
  auto it = std::upper_bound(r.begin(), r.end(), std::make_pair(cp, char32_t{0x10FFFF}));
  return it != r.begin() && cp <= std::prev(it)->second;
}

TEST(UnicodeTest, ClassesOfEveryCodePointAsHf) {
  const auto hf = hf_classes();
  ASSERT_EQ(hf.size(), 5u);
  const Regex byte_level(
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  std::vector<std::pair<size_t, size_t>> m;
  auto one_piece = [&](const char* before, char32_t cp) {
    std::string s = before;
    append_utf8(cp, s);
    m.clear();
    byte_level.find_all(s, m);
    return m.size() == 1;
  };
  for (char32_t cp = 0x80; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    // Punctuation and whitespace: identical everywhere.
    ASSERT_EQ(is_punctuation(cp), in_ranges(hf.at('P'), cp)) << std::hex << "U+" << uint32_t(cp);
    ASSERT_EQ(is_whitespace(cp), in_ranges(hf.at('W'), cp)) << std::hex << "U+" << uint32_t(cp);
    ASSERT_EQ(one_piece("\t", cp), in_ranges(hf.at('W'), cp)) << std::hex << "U+" << uint32_t(cp);
    // Letters and numbers: HF's tables are newer (Unicode 16+) than PCRE2 10.42's
    // (14); the code points added since are added to \p{L} / \p{N} and is_numeric.
    ASSERT_EQ(one_piece("a", cp), in_ranges(hf.at('L'), cp)) << std::hex << "U+" << uint32_t(cp);
    ASSERT_EQ(one_piece("1", cp), in_ranges(hf.at('N'), cp)) << std::hex << "U+" << uint32_t(cp);
    ASSERT_EQ(is_numeric(cp), in_ranges(hf.at('D'), cp)) << std::hex << "U+" << uint32_t(cp);
  }
}

TEST(UnicodeTest, LossyDecodingReplacesMaximalSubparts) {
  EXPECT_EQ(utf8_lossy("a\xE6\x97"), "a\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xE6\x97\xA5"), "\xE6\x97\xA5");
  EXPECT_EQ(utf8_lossy("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98x"), "\xEF\xBF\xBDx");
}

}  // namespace
}  // namespace kestrel::text
