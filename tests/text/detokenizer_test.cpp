// Streaming detokenization: for every vector, the chunks of the incremental
// detokenizer concatenate to the full decode, and each chunk is valid UTF-8.
#include <gtest/gtest.h>

#include "test_util.h"
#include "text/unicode.h"

namespace kestrel::text {
namespace {

using testing::falcon;

// Streams ids one at a time; checks every chunk and returns the concatenation.
std::string stream(const std::vector<int32_t>& ids, bool skip_special = false,
                   std::vector<int32_t> prompt = {}) {
  IncrementalDetokenizer detok(falcon(), std::move(prompt), skip_special);
  std::string all;
  for (int32_t id : ids) {
    const std::string chunk = detok.push(id);
    EXPECT_TRUE(is_valid_utf8(chunk)) << "partial UTF-8 in a chunk";
    EXPECT_FALSE(std::string_view(chunk).ends_with("\xEF\xBF\xBD"));
    all += chunk;
  }
  const std::string rest = detok.flush();
  EXPECT_TRUE(is_valid_utf8(rest));
  return all + rest;
}

TEST(DetokenizerTest, HfVectorsStreamToTheFullDecode) {
  for (const auto& v : testing::hf_vectors()) {
    EXPECT_EQ(stream(v.ids), falcon().decode(v.ids)) << v.text;
    EXPECT_EQ(stream(v.ids, true), falcon().decode(v.ids, true)) << v.text;
  }
}

TEST(DetokenizerTest, LlamaCppVectorsStreamToTheFullDecode) {
  for (const auto& c : testing::llamacpp_vectors()) {
    EXPECT_EQ(stream(c.ids), c.text);
  }
}

TEST(DetokenizerTest, MultiTokenCharactersWaitUntilComplete) {
  // "日本語のテキスト": several characters span two or three byte tokens.
  const auto ids = falcon().encode("日本語のテキスト");
  IncrementalDetokenizer detok(falcon());
  std::vector<std::string> chunks;
  for (int32_t id : ids) chunks.push_back(detok.push(id));
  EXPECT_TRUE(std::find(chunks.begin(), chunks.end(), "") != chunks.end());
  std::string all;
  for (const auto& c : chunks) all += c;
  EXPECT_EQ(all + detok.flush(), "日本語のテキスト");
}

TEST(DetokenizerTest, PromptGivesContextButIsNotEmitted) {
  const auto prompt = falcon().encode("The capital of France is");
  const auto gen = falcon().encode(" Paris, of course.");
  EXPECT_EQ(stream(gen, false, prompt), " Paris, of course.");
}

TEST(DetokenizerTest, IncompleteTailIsFlushed) {
  // 150 alone is the first byte of a two-byte character.
  IncrementalDetokenizer detok(falcon());
  EXPECT_EQ(detok.push(9856), "Hello");
  EXPECT_EQ(detok.push(150), "");
  EXPECT_EQ(detok.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(detok.flush(), "");
}

TEST(DetokenizerTest, LongStreamsKeepWorking) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "línea " + std::to_string(i) + " 🦅 日本\n";
  const auto ids = falcon().encode(text);
  EXPECT_EQ(stream(ids), text);
}

}  // namespace
}  // namespace kestrel::text
