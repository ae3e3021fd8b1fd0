// Parity of the Falcon tokenizer with HF tokenizers and llama.cpp on the shared
// vectors, plus vocabulary accessors, errors and concurrent encoding.
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "test_util.h"

namespace kestrel::text {
namespace {

using testing::falcon;

TEST(TokenizerTest, HfVectorsEncodeAndDecode) {
  const auto vectors = testing::hf_vectors();
  ASSERT_EQ(vectors.size(), 16u);
  for (const auto& v : vectors) {
    EXPECT_EQ(falcon().encode(v.text), v.ids) << v.text;
    EXPECT_EQ(falcon().decode(v.ids), v.decoded) << v.text;
  }
}

TEST(TokenizerTest, LlamaCppVectors) {
  const auto cases = testing::llamacpp_vectors();
  ASSERT_EQ(cases.size(), 46u);
  for (const auto& c : cases) {
    EXPECT_EQ(falcon().encode(c.text), c.ids) << "text: '" << c.text << "'";
    EXPECT_EQ(falcon().decode(c.ids), c.text);
  }
}

TEST(TokenizerTest, VocabularyAccessors) {
  const Tokenizer& t = falcon();
  EXPECT_EQ(t.vocab_size(), 65024);
  EXPECT_EQ(t.token(1079), "Ġworld");
  EXPECT_EQ(t.token_id("Ġworld"), 1079);
  EXPECT_EQ(t.token_id("<|endoftext|>"), 11);
  EXPECT_FALSE(t.token_id("no such token").has_value());
  EXPECT_EQ(t.eos_id(), 11);
  EXPECT_FALSE(t.bos_id().has_value());
  EXPECT_TRUE(t.is_special(11));
  EXPECT_FALSE(t.is_special(1079));
  EXPECT_THROW(t.token(65024), Error);
  EXPECT_THROW(t.token(-1), Error);
}

TEST(TokenizerTest, DecodeSkipsSpecialAndUnknownIds) {
  const std::vector<int32_t> ids = {11, 9856, 99999, 1079, 11};
  EXPECT_EQ(falcon().decode(ids), "<|endoftext|>Hello world<|endoftext|>");
  EXPECT_EQ(falcon().decode(ids, /*skip_special_tokens=*/true), "Hello world");
}

TEST(TokenizerTest, DecodeReplacesInvalidUtf8) {
  // 150 and 133 are the two bytes of 'н'; alone, the first is incomplete.
  const std::vector<int32_t> both = {150, 133}, first = {150};
  EXPECT_EQ(falcon().decode(both), "н");
  EXPECT_EQ(falcon().decode(first), "\xEF\xBF\xBD");
}

TEST(TokenizerTest, EmptyInput) {
  EXPECT_TRUE(falcon().encode("").empty());
  EXPECT_EQ(falcon().decode(std::vector<int32_t>{}), "");
}

TEST(TokenizerTest, InvalidUtf8IsAnError) {
  const std::vector<std::string> bad = {"abc\xff", "\xc3", "\xc0\xaf", "\xed\xa0\x80",
                                        "ok \xf4\x90\x80\x80"};
  for (const auto& s : bad) {
    try {
      falcon().encode(s);
      FAIL() << "no error for invalid UTF-8";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is not valid UTF-8"), std::string::npos) << e.what();
    }
  }
  try {
    falcon().encode("abc\xff");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid byte 0xff at offset 3"), std::string::npos)
        << e.what();
  }
}

TEST(TokenizerTest, LongInputsRoundTrip) {
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "word" + std::to_string(i) + (i % 7 ? " " : "\n\n  ");
  text += std::string(5000, ' ') + std::string(3000, '-') + std::string(4000, '7');
  const auto ids = falcon().encode(text);
  EXPECT_EQ(falcon().decode(ids), text);
}

TEST(TokenizerTest, ConcurrentEncodeMatchesSerial) {
  const auto vectors = testing::llamacpp_vectors();
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        for (size_t i = 0; i < vectors.size(); ++i) {
          const auto& v = vectors[(i + t) % vectors.size()];
          // A per-thread suffix makes words the cache has not seen yet.
          if (falcon().encode(v.text) != v.ids) ++mismatches;
          const std::string extra = " w" + std::to_string(t * 1000 + round);
          const auto ids = falcon().encode(v.text + extra);
          if (falcon().decode(ids) != v.text + extra) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(TokenizerTest, ModelDirAndConfig) {
  const auto dir = std::filesystem::temp_directory_path() / "kestrel_tok_test_model";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(testing::data_path("falcon-tokenizer.json"), dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  {
    std::ofstream cfg(dir / "tokenizer_config.json");
    cfg << R"({"bos_token": ">>TITLE<<", "eos_token": {"content": ">>ABSTRACT<<"},
               "add_bos_token": true, "add_eos_token": true})";
  }
  const auto t = Tokenizer::from_model_dir(dir);
  EXPECT_EQ(t.bos_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_EQ(t.encode("Hello world"), (std::vector<int32_t>{0, 9856, 1079, 1}));
  EXPECT_EQ(t.encode("Hello world", false), (std::vector<int32_t>{9856, 1079}));
  // from_file reads the tokenizer_config.json beside the file too.
  EXPECT_EQ(Tokenizer::from_file(dir / "tokenizer.json").encode("Hello"),
            (std::vector<int32_t>{0, 9856, 1}));
  std::filesystem::remove_all(dir);
  EXPECT_THROW(Tokenizer::from_model_dir(dir), Error);
}

// Expects from_json(falcon tokenizer.json, config) to throw an Error holding `part`.
void expect_config_error(const std::string& config, const std::string& part) {
  static const std::string json = testing::read_all(testing::data_path("falcon-tokenizer.json"));
  try {
    Tokenizer::from_json(json, config);
    FAIL() << "no error, expected: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(TokenizerTest, FalconTokenizerConfig) {
  // tiiuae/falcon-7b's tokenizer_config.json: eos only, no bos, nothing added.
  const std::string json = testing::read_all(testing::data_path("falcon-tokenizer.json"));
  const auto t = Tokenizer::from_json(json, R"({"add_prefix_space": false,
      "eos_token": "<|endoftext|>", "model_max_length": 2048,
      "tokenizer_class": "PreTrainedTokenizerFast"})");
  EXPECT_EQ(t.eos_id(), 11);
  EXPECT_FALSE(t.bos_id().has_value());
  EXPECT_EQ(t.encode("Hello world"), (std::vector<int32_t>{9856, 1079}));
  // bos named but add_bos_token absent or false: known, not added.
  const auto b =
      Tokenizer::from_json(json, R"({"bos_token": ">>TITLE<<", "add_bos_token": false})");
  EXPECT_EQ(b.bos_id(), 0);
  EXPECT_EQ(b.encode("Hello world"), (std::vector<int32_t>{9856, 1079}));
  // A null bos_token and add_bos_token false, as some configs spell "none".
  const auto n = Tokenizer::from_json(json, R"({"bos_token": null, "add_bos_token": false})");
  EXPECT_FALSE(n.bos_id().has_value());
}

TEST(TokenizerTest, TokenizerConfigErrors) {
  expect_config_error(R"({"add_bos_token": true})", "add_bos_token is true but no bos_token");
  expect_config_error(R"({"bos_token": "<s>"})", "bos_token '<s>' is not in the vocabulary");
  expect_config_error(R"({"eos_token": {"lstrip": false}})",
                      "'eos_token' must be a string or {\"content\": ...}");
  expect_config_error(R"([true])", "tokenizer_config.json must be a JSON object");
  expect_config_error(R"({"bos_token": )", "tokenizer_config.json: malformed JSON");
}

}  // namespace
}  // namespace kestrel::text
