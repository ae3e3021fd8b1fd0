// Request parsing and validation: LoRAX / TGI and OpenAI bodies into
// SamplingParams, and the 400 / 422 errors that name the field.
#include <gtest/gtest.h>

#include "server/generate_request.h"
#include "server/http_error.h"
#include "server/openai.h"
#include "server/response_format.h"

namespace kestrel::server {
namespace {

GenerateParams parse(const std::string& body, bool stream = false, RequestLimits limits = {}) {
  return parse_generate_request(parse_json_object(body), stream, limits);
}

std::string field_of(const std::string& body) {
  try {
    parse(body);
  } catch (const ValidationError& e) {
    return e.field();
  }
  return "";
}

TEST(GenerateRequest, Defaults) {
  GenerateParams g = parse(R"({"inputs": "Hello"})");
  EXPECT_EQ(g.inputs, "Hello");
  EXPECT_FALSE(g.sampling.do_sample);
  EXPECT_EQ(g.sampling.max_new_tokens, 20);
  EXPECT_FALSE(g.max_new_tokens_given);
  EXPECT_FALSE(g.stream);
  EXPECT_FALSE(g.details);
}

TEST(GenerateRequest, AllParameters) {
  GenerateParams g = parse(R"({"inputs": "x", "stream": true, "parameters": {
      "temperature": 0.7, "top_k": 5, "top_p": 0.9, "typical_p": 0.95, "repetition_penalty": 1.1,
      "frequency_penalty": 0.5, "presence_penalty": -0.5, "max_new_tokens": 7, "seed": 42,
      "stop": ["\n", "###"], "ignore_eos_token": true, "details": true, "decoder_input_details": true,
      "return_full_text": true, "truncate": 10, "return_k_alternatives": 3,
      "adapter_id": null, "watermark": false, "response_format": null}})");
  EXPECT_TRUE(g.stream);
  EXPECT_TRUE(g.sampling.do_sample);  // warpers imply sampling, as in TGI
  EXPECT_FLOAT_EQ(g.sampling.temperature, 0.7f);
  EXPECT_EQ(g.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(g.sampling.top_p, 0.9f);
  EXPECT_FLOAT_EQ(g.sampling.typical_p, 0.95f);
  EXPECT_FLOAT_EQ(g.sampling.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(g.sampling.frequency_penalty, 0.5f);
  EXPECT_FLOAT_EQ(g.sampling.presence_penalty, -0.5f);
  EXPECT_EQ(g.sampling.max_new_tokens, 7);
  EXPECT_EQ(g.sampling.seed, 42u);
  EXPECT_EQ(g.sampling.stop, (std::vector<std::string>{"\n", "###"}));
  EXPECT_TRUE(g.sampling.ignore_eos);
  EXPECT_TRUE(g.details && g.decoder_input_details && g.return_full_text);
  EXPECT_TRUE(g.sampling.prompt_logprobs);
  EXPECT_EQ(g.truncate, 10);
  EXPECT_EQ(g.sampling.top_n_tokens, 3);
}

TEST(GenerateRequest, TemperatureZeroIsGreedy) {
  GenerateParams g =
      parse(R"({"inputs": "x", "parameters": {"temperature": 0, "do_sample": true}})");
  EXPECT_FALSE(g.sampling.do_sample);
  EXPECT_GT(g.sampling.temperature, 0.0f);
  g = parse(R"({"inputs": "x", "parameters": {"temperature": 1.0}})");
  EXPECT_FALSE(g.sampling.do_sample);  // no warper: greedy, as TGI
  g = parse(R"({"inputs": "x", "parameters": {"do_sample": true}})");
  EXPECT_TRUE(g.sampling.do_sample);
}

TEST(GenerateRequest, ValidationNamesTheField) {
  EXPECT_EQ(field_of(R"({"parameters": {}})"), "inputs");
  EXPECT_EQ(field_of(R"({"inputs": 5})"), "inputs");
  EXPECT_EQ(field_of(R"({"inputs": ""})"), "inputs");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"temperature": -1}})"), "temperature");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"temperature": "hot"}})"), "temperature");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"top_p": 1.5}})"), "top_p");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"top_p": 0}})"), "top_p");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"top_k": -1}})"), "top_k");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"typical_p": 2}})"), "typical_p");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"repetition_penalty": 0}})"),
            "repetition_penalty");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"frequency_penalty": 3}})"),
            "frequency_penalty");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"max_new_tokens": 0}})"), "max_new_tokens");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"max_new_tokens": 1000000000}})"),
            "max_new_tokens");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"max_new_tokens": 2.5}})"),
            "max_new_tokens");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"seed": -3}})"), "seed");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"stop": ["a","b","c","d","e"]}})"), "stop");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"stop": [1]}})"), "stop");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"truncate": 0}})"), "truncate");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"best_of": 2}})"), "best_of");
  EXPECT_EQ(
      field_of(R"({"inputs": "x", "parameters": {"best_of": 2, "do_sample": true, "seed": 1}})"),
      "seed");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": 3})"), "parameters");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"details": "yes"}})"), "details");
}

TEST(GenerateRequest, UnsupportedYet) {
  for (const char* body : {R"({"inputs": "x", "parameters": {"watermark": true}})"}) {
    try {
      parse(body);
      ADD_FAILURE() << body;
    } catch (const ValidationError& e) {
      EXPECT_NE(std::string(e.what()).find("not supported yet"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"adapter_parameters": {"ids": []}}})"),
            "adapter_parameters");
}

TEST(GenerateRequest, MergedAdapters) {
  GenerateParams g = parse(R"({"inputs": "x", "parameters": {"merged_adapters": {"ids": ["a", "b"]},
      "adapter_source": "hub"}})");
  ASSERT_TRUE(g.merged);
  EXPECT_FALSE(g.adapter);
  EXPECT_EQ(g.merged->ids, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(g.merged->weights, (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(g.merged->strategy, MergeStrategy::kLinear);
  EXPECT_EQ(g.merged->density, 1.0);
  EXPECT_EQ(g.merged->majority_sign_method, MajoritySignMethod::kTotal);
  EXPECT_EQ(g.merged->seed, 0u);
  EXPECT_EQ(g.merged_source, AdapterSource::kHub);

  // lorax-client sends every field, null where unset.
  g = parse(R"({"inputs": "x", "parameters": {"seed": 7, "adapter_id": null,
      "merged_adapters": {"ids": ["a", "b"], "weights": [0.3, -0.5], "merge_strategy": "dare_ties",
      "density": 0.4, "majority_sign_method": "frequency"}}})");
  ASSERT_TRUE(g.merged);
  EXPECT_EQ(g.merged->weights, (std::vector<double>{0.3, -0.5}));
  EXPECT_EQ(g.merged->strategy, MergeStrategy::kDareTies);
  EXPECT_EQ(g.merged->density, 0.4);
  EXPECT_EQ(g.merged->majority_sign_method, MajoritySignMethod::kFrequency);
  EXPECT_EQ(g.merged->seed, 7u);
  g = parse(R"({"inputs": "x", "parameters": {"merged_adapters": {"ids": ["a"], "weights": null,
      "merge_strategy": null, "density": 1.0, "majority_sign_method": null}}})");
  ASSERT_TRUE(g.merged);
  EXPECT_EQ(g.merged->weights, (std::vector<double>{1.0}));
  EXPECT_FALSE(parse(R"({"inputs": "x", "parameters": {"merged_adapters": null}})").merged);

  const auto merged = [](const std::string& m) {
    return field_of(R"({"inputs": "x", "parameters": {"merged_adapters": )" + m + "}}");
  };
  EXPECT_EQ(merged("{}"), "merged_adapters.ids");
  EXPECT_EQ(merged("3"), "merged_adapters");
  EXPECT_EQ(merged(R"({"ids": []})"), "merged_adapters.ids");
  EXPECT_EQ(merged(R"({"ids": "a"})"), "merged_adapters.ids");
  EXPECT_EQ(merged(R"({"ids": [1]})"), "merged_adapters.ids");
  std::string many = R"({"ids": [)";
  for (int i = 0; i < 33; ++i) many += std::string(i ? "," : "") + "\"a\"";
  EXPECT_EQ(merged(many + "]}"), "merged_adapters.ids");
  many = R"({"ids": [)";
  for (int i = 0; i < 32; ++i) many += std::string(i ? "," : "") + "\"a\"";
  EXPECT_EQ(merged(many + "]}"), "");
  EXPECT_EQ(merged(R"({"ids": ["a", "b"], "weights": [1]})"), "merged_adapters.weights");
  EXPECT_EQ(merged(R"({"ids": ["a"], "weights": ["x"]})"), "merged_adapters.weights");
  EXPECT_EQ(merged(R"({"ids": ["a"], "merge_strategy": "svd"})"), "merged_adapters.merge_strategy");
  EXPECT_EQ(merged(R"({"ids": ["a"], "merge_strategy": 3})"), "merged_adapters.merge_strategy");
  EXPECT_EQ(merged(R"({"ids": ["a"], "density": 1.5})"), "merged_adapters.density");
  EXPECT_EQ(merged(R"({"ids": ["a"], "density": "half"})"), "merged_adapters.density");
  EXPECT_EQ(merged(R"({"ids": ["a"], "majority_sign_method": "mean"})"),
            "merged_adapters.majority_sign_method");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"adapter_id": "a",
      "merged_adapters": {"ids": ["b"]}}})"),
            "merged_adapters");
}

TEST(GenerateRequest, StructuredOutputShapes) {
  using Kind = grammar::Spec::Kind;
  GenerateParams g =
      parse(R"({"inputs": "x", "parameters": {"response_format": {"type": "json_object"}}})");
  ASSERT_TRUE(g.constraint);
  EXPECT_EQ(g.constraint->kind, Kind::kJsonObject);
  g = parse(R"({"inputs": "x", "parameters": {"response_format":
      {"type": "json_schema", "schema": {"type": "integer"}}}})");
  ASSERT_TRUE(g.constraint);
  EXPECT_EQ(g.constraint->kind, Kind::kJsonSchema);
  EXPECT_EQ(g.constraint->text, R"({"type":"integer"})");
  EXPECT_EQ(g.constraint->field, "response_format.schema");
  g = parse(
      R"({"inputs": "x", "parameters": {"grammar": {"type": "json", "value": "{\"type\": \"string\"}"}}})");
  ASSERT_TRUE(g.constraint);
  EXPECT_EQ(g.constraint->text, R"({"type":"string"})");
  EXPECT_EQ(g.constraint->field, "grammar.value");
  g = parse(R"({"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": "[a-z]+"}}})");
  ASSERT_TRUE(g.constraint);
  EXPECT_EQ(g.constraint->kind, Kind::kRegex);
  EXPECT_EQ(g.constraint->text, "[a-z]+");
  EXPECT_FALSE(
      parse(R"({"inputs": "x", "parameters": {"response_format": {"type": "text"}}})").constraint);
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"response_format": {"type": "xml"}}})"),
            "response_format.type");
  EXPECT_EQ(
      field_of(R"({"inputs": "x", "parameters": {"response_format": {"type": "json_schema"}}})"),
      "response_format.schema");
  EXPECT_EQ(
      field_of(R"({"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": 3}}})"),
      "grammar.value");
  EXPECT_EQ(
      field_of(R"({"inputs": "x", "parameters": {"grammar": {"type": "json", "value": "{"}}})"),
      "grammar.value");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": "a"},
      "response_format": {"type": "json_object"}}})"),
            "grammar");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"response_format": "json"}})"),
            "response_format");
}

TEST(GenerateRequest, SchemasKeepTheClientsKeyOrder) {
  const std::string body =
      R"({"inputs": "x", "parameters": {"response_format": {"type": "json_object",
          "schema": {"type": "object", "properties": {"z": {"type": "string"}, "a": {}}}}}})";
  GenerateParams g = parse(body);
  ASSERT_TRUE(g.constraint);
  keep_schema_order(body, "parameters.", *g.constraint);
  EXPECT_EQ(g.constraint->text, R"({"type":"object","properties":{"z":{"type":"string"},"a":{}}})");
  const std::string tgi =
      R"({"inputs": "x", "parameters": {"grammar": {"type": "json", "value": "{\"z\": 1, \"a\": 2}"}}})";
  g = parse(tgi);
  keep_schema_order(tgi, "parameters.", *g.constraint);
  EXPECT_EQ(g.constraint->text, R"({"z":1,"a":2})");
}

TEST(GenerateRequest, AdapterIdAndSource) {
  EXPECT_FALSE(parse(R"({"inputs": "x"})").adapter);
  EXPECT_FALSE(parse(R"({"inputs": "x", "parameters": {"adapter_id": null}})").adapter);
  EXPECT_FALSE(parse(R"({"inputs": "x", "parameters": {"adapter_id": ""}})").adapter);  // base

  GenerateParams g = parse(R"({"inputs": "x", "parameters": {"adapter_id": "adapters/e1"}})");
  ASSERT_TRUE(g.adapter);
  EXPECT_EQ(g.adapter->id, "adapters/e1");
  EXPECT_EQ(g.adapter->source, AdapterSource::kLocal);  // LoRAX's default for a null source

  g = parse(
      R"({"inputs": "x", "parameters": {"adapter_id": "org/name", "adapter_source": "hub"}})");
  ASSERT_TRUE(g.adapter);
  EXPECT_EQ(g.adapter->id, "org/name");
  EXPECT_EQ(g.adapter->source, AdapterSource::kHub);
  g = parse(R"({"inputs": "x", "parameters": {"adapter_id": "a", "adapter_source": "local"}})");
  EXPECT_EQ(g.adapter->source, AdapterSource::kLocal);
  g = parse(R"({"inputs": "x", "parameters": {"adapter_id": "a", "adapter_source": null}})");
  EXPECT_EQ(g.adapter->source, AdapterSource::kLocal);

  // Sources kestrel does not read (LoRAX's s3, pbase) are a 422 naming the source.
  for (const char* src : {"s3", "pbase", "HUB", ""}) {
    const std::string body = std::string(R"({"inputs": "x", "parameters": {"adapter_id": "a", )") +
                             R"("adapter_source": ")" + src + "\"}}";
    try {
      parse(body);
      ADD_FAILURE() << body;
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field(), "adapter_source");
      EXPECT_NE(std::string(e.what()).find(std::string("'") + src + "'"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"adapter_id": 5}})"), "adapter_id");
  EXPECT_EQ(field_of(R"({"inputs": "x", "parameters": {"adapter_source": 1}})"), "adapter_source");
}

TEST(GenerateRequest, BestOfNotWhenStreaming) {
  EXPECT_THROW(parse(R"({"inputs": "x", "parameters": {"best_of": 2, "do_sample": true}})", true),
               ValidationError);
  EXPECT_EQ(
      parse(R"({"inputs": "x", "parameters": {"best_of": 2, "do_sample": true}})").sampling.best_of,
      2);
}

// The kind of the Error `f` throws, and its message and field (a ValidationError's) in `what`.
template <typename F>
ErrorKind kind_of(F f, std::string* what = nullptr, std::string* field = nullptr) {
  try {
    f();
  } catch (const ValidationError& e) {
    if (what) *what = e.what();
    if (field) *field = e.field();
    return e.kind();
  } catch (const Error& e) {
    if (what) *what = e.what();
    return e.kind();
  }
  ADD_FAILURE() << "no kestrel::Error";
  return ErrorKind::kInternal;
}

TEST(JsonBody, MalformedIs400InvalidUtf8Is422) {
  for (const char* body : {R"({"inputs": "x")", "[1, 2]", "", "null", "{inputs: 1}"})
    EXPECT_EQ(kind_of([&] { parse_json_object(body); }), ErrorKind::kMalformed) << body;
  EXPECT_THROW(parse_json_object("{\"inputs\": \"\xff\xfe\"}"), ValidationError);
  std::string what, field;
  EXPECT_EQ(kind_of([] { parse_json_object(R"({"inputs": "\udc00"})"); }, &what, &field),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(field, "inputs");
  EXPECT_NE(what.find("surrogate"), std::string::npos) << what;
  EXPECT_NO_THROW(parse_json_object(R"({"inputs": "caf\u00e9 \ud83d\ude00"})"));
}

std::string nested(const std::string& key, int depth, const char* open, const char* close) {
  std::string s = "{\"" + key + "\": ";
  for (int i = 0; i < depth; ++i) s += open;
  for (int i = 0; i < depth; ++i) s += close;
  return s + "}";
}

// Nesting past kMaxJsonDepth is a 422 naming the field and the path, found while parsing (the
// parser never recurses; a million levels cost nothing but the scan).
TEST(JsonBody, NestingBeyondTheBoundIs422NamingThePath) {
  EXPECT_NO_THROW(parse_json_object(nested("a", kMaxJsonDepth - 1, "[", "]")));
  for (const char* open : {"[", "{\"k\": "}) {
    const char* close = open[0] == '[' ? "]" : "}";
    std::string what, field;
    const std::string body = nested("parameters", 1000000, open, close);
    EXPECT_EQ(kind_of([&] { parse_json_object(body); }, &what, &field),
              ErrorKind::kInvalidArgument);
    EXPECT_EQ(field, "parameters");
    EXPECT_NE(what.find("nests deeper than 64"), std::string::npos) << what;
  }
  // An OpenAI message's content, the field that once overflowed the stack.
  std::string body = R"({"messages": [{"role": "user", "content": )";
  for (int i = 0; i < 200000; ++i) body += "[";
  std::string what, field;
  EXPECT_EQ(kind_of([&] { parse_json_object(body); }, &what, &field), ErrorKind::kInvalidArgument);
  EXPECT_EQ(field, "messages");
  EXPECT_NE(what.find("`messages[0].content[0]"), std::string::npos) << what;
}

TEST(JsonBody, NumberOutOfRangeIs422NamingTheField) {
  for (const char* body :
       {R"({"parameters": {"temperature": 1e400}})", R"({"parameters": {"seed": -1e999}})"}) {
    std::string what, field;
    EXPECT_EQ(kind_of([&] { parse_json_object(body); }, &what, &field), ErrorKind::kInvalidArgument)
        << body;
    EXPECT_EQ(field, "parameters");
    EXPECT_NE(what.find("out of range"), std::string::npos) << what;
    EXPECT_NE(what.find("parameters."), std::string::npos) << what;
  }
  // Big integers are not doubles: they parse, and the typed access refuses them.
  EXPECT_NO_THROW(parse_json_object(R"({"n": 123456789012345678901234567890})"));
}

TEST(Utf8, Validation) {
  EXPECT_TRUE(valid_utf8("plain"));
  EXPECT_TRUE(valid_utf8("caf\xc3\xa9 \xf0\x9f\x98\x80"));
  EXPECT_FALSE(valid_utf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(valid_utf8("\xe2\x82"));          // truncated
  EXPECT_FALSE(valid_utf8("\xf4\x90\x80\x80"));  // beyond U+10FFFF
}

TEST(FitToLimits, TruncateAndBudget) {
  RequestLimits limits;
  limits.max_input_length = 8;
  limits.max_total_tokens = 12;
  SamplingParams p;
  std::vector<int32_t> ids{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_THROW(fit_to_limits(ids, std::nullopt, false, p, limits), ValidationError);
  fit_to_limits(ids, 6, false, p, limits);
  EXPECT_EQ(ids, (std::vector<int32_t>{5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(p.max_new_tokens, 6);  // the default 20, capped by the budget
  p.max_new_tokens = 7;
  EXPECT_THROW(fit_to_limits(ids, std::nullopt, true, p, limits), ValidationError);
}

TEST(OpenAi, Completion) {
  RequestLimits limits;
  OpenAiRequest r = parse_completion_request(
      parse_json_object(R"({"model": "m", "prompt": "Hi", "max_tokens": 5, "temperature": 0,
                            "stop": "\n", "logprobs": 2, "stream": true,
                            "stream_options": {"include_usage": true}})"),
      limits);
  EXPECT_EQ(r.prompt, "Hi");
  EXPECT_FALSE(r.sampling.do_sample);
  EXPECT_EQ(r.sampling.max_new_tokens, 5);
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"\n"}));
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(r.sampling.top_n_tokens, 2);
  EXPECT_TRUE(r.stream && r.include_usage);
  r = parse_completion_request(parse_json_object(R"({"prompt": ["Hi"]})"), limits);
  EXPECT_TRUE(r.sampling.do_sample);  // OpenAI's default temperature 1 samples
  EXPECT_EQ(r.sampling.max_new_tokens, 16);
  r = parse_completion_request(parse_json_object(R"({"prompt": [1, 2, 3]})"), limits);
  EXPECT_EQ(*r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_THROW(parse_completion_request(parse_json_object(R"({"prompt": ["a", "b"]})"), limits),
               ValidationError);
  EXPECT_THROW(parse_completion_request(parse_json_object(R"({"prompt": "a", "n": 2})"), limits),
               ValidationError);
  EXPECT_THROW(parse_completion_request(
                   parse_json_object(R"({"prompt": "a", "temperature": -0.5})"), limits),
               ValidationError);
}

TEST(OpenAi, Chat) {
  RequestLimits limits;
  OpenAiRequest r = parse_chat_request(
      parse_json_object(R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
          "logprobs": true, "top_logprobs": 2, "max_completion_tokens": 9})"),
      limits);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "Hi");
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(r.sampling.max_new_tokens, 9);
  EXPECT_THROW(parse_chat_request(parse_json_object(R"({"messages": []})"), limits),
               ValidationError);
  EXPECT_THROW(parse_chat_request(parse_json_object(R"({"messages": [{"content": "x"}]})"), limits),
               ValidationError);
  EXPECT_THROW(
      parse_chat_request(
          parse_json_object(
              R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})"),
          limits),
      ValidationError);
}

TEST(OpenAi, ResponseFormat) {
  RequestLimits limits;
  auto chat = [&](const std::string& rf) {
    return parse_chat_request(
        parse_json_object(
            R"({"messages": [{"role": "user", "content": "x"}], "response_format": )" + rf + "}"),
        limits);
  };
  EXPECT_FALSE(chat(R"({"type": "text"})").constraint);
  EXPECT_EQ(chat(R"({"type": "json_object"})").constraint->kind, grammar::Spec::Kind::kJsonObject);
  const OpenAiRequest r = chat(
      R"({"type": "json_schema", "json_schema": {"name": "n", "strict": true, "schema": {"type": "boolean"}}})");
  ASSERT_TRUE(r.constraint);
  EXPECT_EQ(r.constraint->text, R"({"type":"boolean"})");
  EXPECT_EQ(r.constraint->field, "response_format.json_schema.schema");
  for (const char* bad :
       {R"({"type": "json_schema"})", R"({"type": "json_schema", "json_schema": {}})",
        R"({"type": "yaml"})", R"("json")", R"({"type": 1})"}) {
    EXPECT_THROW(chat(bad), ValidationError) << bad;
  }
  const OpenAiRequest c = parse_completion_request(
      parse_json_object(R"({"prompt": "x", "response_format": {"type": "json_object"}})"), limits);
  ASSERT_TRUE(c.constraint);
}

}  // namespace
}  // namespace kestrel::server
