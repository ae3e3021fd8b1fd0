// Structured output through the engine on the e2e fixture (random weights, the real Falcon
// vocabulary): only the constraint makes the text valid, so every sampled output must parse and
// match; unconstrained requests in the same batch are untouched; bad constraints are refused at
// submit naming the field; a complete grammar ends the request.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "../test_data.h"
#include "engine/engine.h"
#include "engine_test_util.h"
#include "text/tokenizer.h"

namespace kestrel {
namespace {

using test::fixture_dir;
using test::load_fixture;

struct Fixture {
  std::shared_ptr<const FalconModel> model = load_fixture("e2e-falcon7b-fullvocab");
  std::shared_ptr<const text::Tokenizer> tok = std::make_shared<const text::Tokenizer>(
      text::Tokenizer::from_model_dir(fixture_dir("e2e-falcon7b-fullvocab")));
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

GenerationRequest sampled(const std::string& prompt, uint64_t seed, int64_t n = 96) {
  GenerationRequest r;
  r.prompt_ids = fixture().tok->encode(prompt);
  r.params.do_sample = true;
  r.params.seed = seed;
  r.params.max_new_tokens = n;
  return r;
}

grammar::Spec schema(const nlohmann::json& s) {
  return {grammar::Spec::Kind::kJsonSchema, s.dump(), "response_format.schema"};
}

const nlohmann::json kPerson = {{"type", "object"},
                                {"properties",
                                 {{"name", {{"type", "string"}, {"maxLength", 8}}},
                                  {"age", {{"type", "integer"}, {"minimum", 0}, {"maximum", 120}}},
                                  {"role", {{"enum", {"admin", "user", "guest"}}}},
                                  {"tags",
                                   {{"type", "array"},
                                    {"items", {{"type", "string"}, {"maxLength", 4}}},
                                    {"minItems", 1},
                                    {"maxItems", 3}}}}},
                                {"required", {"name", "age", "role", "tags"}}};

void expect_person(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << text;
  ASSERT_TRUE(j.is_object()) << text;
  EXPECT_EQ(j.size(), 4u) << text;  // strict: no property the schema does not name
  ASSERT_TRUE(j["name"].is_string()) << text;
  EXPECT_LE(j["name"].get<std::string>().size(), 8u * 4) << text;  // 8 code points
  ASSERT_TRUE(j["age"].is_number_integer()) << text;
  EXPECT_GE(j["age"].get<int64_t>(), 0) << text;
  EXPECT_LE(j["age"].get<int64_t>(), 120) << text;
  ASSERT_TRUE(j["role"].is_string()) << text;
  const std::string role = j["role"];
  EXPECT_TRUE(role == "admin" || role == "user" || role == "guest") << text;
  ASSERT_TRUE(j["tags"].is_array()) << text;
  EXPECT_GE(j["tags"].size(), 1u) << text;
  EXPECT_LE(j["tags"].size(), 3u) << text;
}

TEST(StructuredOutput, JsonSchemaSampledOutputsAllValidate) {
  Engine engine(fixture().model, fixture().tok, {});
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    GenerationRequest r = sampled("A person as JSON:", seed);
    r.constraint = schema(kPerson);
    handles.push_back(engine.submit(std::move(r)));
  }
  std::set<std::string> distinct;
  for (auto& h : handles) {
    const GenerationResult res = h->wait();
    EXPECT_EQ(res.finish_reason, FinishReason::kEosToken) << res.text;
    expect_person(res.text);
    distinct.insert(res.text);
  }
  EXPECT_GT(distinct.size(), 1u);  // sampled, not one forced string
  const auto g = engine.grammar_stats();
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->compiles, 1);  // one compile shared by the six requests
  EXPECT_EQ(g->cache_hits, 5);
}

TEST(StructuredOutput, RegexAndJsonObject) {
  Engine engine(fixture().model, fixture().tok, {});
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    GenerationRequest r = sampled("Date:", seed);
    r.constraint = grammar::Spec{grammar::Spec::Kind::kRegex, "[0-9]{4}-[0-9]{2}-[0-9]{2}", "re"};
    const GenerationResult res = engine.submit(std::move(r))->wait();
    EXPECT_TRUE(std::regex_match(res.text, std::regex("[0-9]{4}-[0-9]{2}-[0-9]{2}"))) << res.text;
    EXPECT_EQ(res.token_ids.back(), 11);  // ends with EOS once the regex is complete
  }
  // Any JSON object: the random model rarely closes one by itself; give it room.
  GenerationRequest r = sampled("{", 5, 200);
  r.params.temperature = 0.3f;
  r.constraint = grammar::Spec{grammar::Spec::Kind::kJsonObject, "", "response_format"};
  const GenerationResult res = engine.submit(std::move(r))->wait();
  if (res.finish_reason == FinishReason::kEosToken) {
    const nlohmann::json j = nlohmann::json::parse(res.text, nullptr, false);
    EXPECT_TRUE(j.is_object()) << res.text;
  } else {
    EXPECT_EQ(res.text.front(), '{') << res.text;
  }
}

TEST(StructuredOutput, UnconstrainedRowsInTheSameBatchAreUntouched) {
  Engine engine(fixture().model, fixture().tok, {});
  GenerationRequest plain = sampled("Hello there", 42, 24);
  plain.params.ignore_eos = true;
  const GenerationResult alone = engine.submit(plain)->wait();
  std::vector<std::shared_ptr<RequestHandle>> constrained;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    GenerationRequest r = sampled("A person as JSON:", seed);
    r.constraint = schema(kPerson);
    constrained.push_back(engine.submit(std::move(r)));
  }
  const GenerationResult in_batch = engine.submit(plain)->wait();
  EXPECT_EQ(in_batch.token_ids, alone.token_ids);
  for (auto& h : constrained) expect_person(h->wait().text);
}

TEST(StructuredOutput, ComposesWithBestOfPenaltiesAndIgnoreEos) {
  Engine engine(fixture().model, fixture().tok, {});
  GenerationRequest r = sampled("A person as JSON:", 7);
  r.params.best_of = 3;
  r.params.repetition_penalty = 1.3f;
  r.params.top_k = 50;
  r.params.ignore_eos = true;  // a complete grammar still ends the request
  r.constraint = schema(kPerson);
  const GenerationResult res = engine.submit(std::move(r))->wait();
  EXPECT_EQ(res.finish_reason, FinishReason::kEosToken);
  expect_person(res.text);
  ASSERT_EQ(res.best_of_sequences.size(), 2u);
  for (const GenerationResult& other : res.best_of_sequences) expect_person(other.text);
}

TEST(StructuredOutput, ComposesWithLoraAndTensorParallelism) {
  // A LoRA adapter on the base, and the same model split over two ranks: outputs still validate.
  auto tp = std::make_shared<const FalconModel>(
      FalconModel::load(fixture_dir("e2e-falcon7b-fullvocab"), Device::kCpu, 2));
  auto adapter = fixture().model->load_adapter(
      test::test_data_dir() + "/lora-e2e-falcon7b-fullvocab/adapters/e1-r8-all", "e1");
  for (bool use_tp : {false, true}) {
    SCOPED_TRACE(use_tp ? "tensor parallel 2" : "one rank + LoRA");
    Engine engine(use_tp ? tp : fixture().model, fixture().tok, {});
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      GenerationRequest r = sampled("A person as JSON:", seed);
      if (!use_tp) r.adapter = adapter;
      r.constraint = schema(kPerson);
      const GenerationResult res = engine.submit(std::move(r))->wait();
      EXPECT_EQ(res.finish_reason, FinishReason::kEosToken) << res.text;
      expect_person(res.text);
    }
  }
}

TEST(StructuredOutput, BadConstraintsAreRefusedAtSubmitNamingTheField) {
  Engine engine(fixture().model, fixture().tok, {});
  auto refused = [&](grammar::Spec spec, const std::string& needle) {
    GenerationRequest r = sampled("x", 1);
    r.constraint = std::move(spec);
    try {
      engine.submit(std::move(r));
      ADD_FAILURE() << "accepted; expected an error naming " << needle;
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return e.field();
    }
    return std::string();
  };
  EXPECT_EQ(refused(schema({{"type", "array"}, {"uniqueItems", true}}), "uniqueItems"),
            "response_format.schema");
  refused({grammar::Spec::Kind::kJsonSchema, "{not json", "response_format.schema"}, "JSON");
  EXPECT_EQ(refused({grammar::Spec::Kind::kRegex, "(unclosed", "grammar.value"}, "regex"),
            "grammar.value");
  // The engine still serves after the refusals.
  GenerationRequest ok = sampled("x", 1, 4);
  EXPECT_EQ(engine.submit(std::move(ok))->wait().token_ids.size(), 4u);
}

TEST(StructuredOutput, WithoutATokenizerIsRefused) {
  Engine engine(fixture().model, nullptr, {});
  GenerationRequest r;
  r.prompt_ids = {1, 2, 3};
  r.constraint = schema(kPerson);
  EXPECT_THROW(engine.submit(std::move(r)), ValidationError);
}

}  // namespace
}  // namespace kestrel
