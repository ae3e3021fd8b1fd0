// Response shapes: LoRAX / TGI JSON and SSE events, OpenAI bodies and chunks,
// the chat template subset and the Prometheus text.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "server/chat_template.h"
#include "server/generate_response.h"
#include "server/metrics.h"
#include "server/openai.h"

namespace kestrel::server {
namespace {

GenerationResult result() {
  GenerationResult r;
  r.token_ids = {5, 6};
  r.text = " world!";
  r.tokens = {{5, " world", -0.5f, false, {{7, " there", -1.5f}}}, {6, "!", -0.25f, false, {}}};
  r.finish_reason = FinishReason::kLength;
  r.prompt_length = 3;
  r.seed = 9;
  return r;
}

TEST(GenerateResponse, Plain) {
  GenerateParams g;
  g.inputs = "Hello";
  json j = generate_response(result(), g, nullptr);
  EXPECT_EQ(j, json({{"generated_text", " world!"}}));
  g.return_full_text = true;
  EXPECT_EQ(generate_response(result(), g, nullptr)["generated_text"], "Hello world!");
}

TEST(GenerateResponse, Details) {
  GenerateParams g;
  g.details = true;
  json j = generate_response(result(), g, nullptr);
  const json& d = j["details"];
  EXPECT_EQ(d["finish_reason"], "length");
  EXPECT_EQ(d["generated_tokens"], 2);
  EXPECT_EQ(d["prompt_tokens"], 3);
  EXPECT_TRUE(d["seed"].is_null());  // greedy
  EXPECT_EQ(d["prefill"], json::array());
  ASSERT_EQ(d["tokens"].size(), 2u);
  EXPECT_EQ(d["tokens"][0]["id"], 5);
  EXPECT_EQ(d["tokens"][0]["text"], " world");
  EXPECT_FLOAT_EQ(d["tokens"][0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(d["tokens"][0]["special"], false);
  EXPECT_EQ(d["tokens"][0]["alternative_tokens"][0]["id"], 7);
}

TEST(GenerateResponse, StreamEvents) {
  GenerateParams g;
  GenerationResult r = result();
  const std::string ev = sse_event(stream_token_event(r.tokens[0], nullptr));
  ASSERT_EQ(ev.rfind("data:", 0), 0u);
  ASSERT_EQ(ev.substr(ev.size() - 2), "\n\n");
  json j = json::parse(ev.substr(5));
  EXPECT_EQ(j["token"]["text"], " world");
  EXPECT_TRUE(j["generated_text"].is_null());
  EXPECT_TRUE(j["details"].is_null());
  json last = stream_final_event(r.tokens[1], r, g, nullptr);
  EXPECT_EQ(last["generated_text"], " world!");
  EXPECT_EQ(last["details"]["finish_reason"], "length");
  EXPECT_EQ(last["details"]["generated_tokens"], 2);
}

TEST(GenerateResponse, NanLogprobIsNull) {
  TokenInfo t{1, "a", std::nanf(""), false, {}};
  EXPECT_TRUE(token_json(t, nullptr)["logprob"].is_null());
}

TEST(OpenAiResponse, CompletionAndChat) {
  OpenAiRequest req;
  OpenAiContext ctx{"cmpl-1", 100, "m", nullptr};
  json c = completion_response(req, ctx, result());
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], " world!");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c["usage"],
            json({{"prompt_tokens", 3}, {"completion_tokens", 2}, {"total_tokens", 5}}));
  req.logprobs = 1;
  c = completion_response(req, ctx, result());
  EXPECT_EQ(c["choices"][0]["logprobs"]["tokens"], json({" world", "!"}));
  EXPECT_EQ(c["choices"][0]["logprobs"]["text_offset"], json({0, 6}));
  req.chat = true;
  json ch = chat_response(req, ctx, result());
  EXPECT_EQ(ch["object"], "chat.completion");
  EXPECT_EQ(ch["choices"][0]["message"]["content"], " world!");
  EXPECT_EQ(ch["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]["token"], " there");
  const std::string s = " w";
  json chunk = chat_chunk(req, ctx, &s, true, nullptr, nullptr, nullptr);
  EXPECT_EQ(chunk["choices"][0]["delta"]["content"], " w");
  EXPECT_EQ(openai_sse(chunk).rfind("data: {", 0), 0u);
}

TEST(ChatTemplate, FalconDefault) {
  ChatTemplate t;
  EXPECT_EQ(t.render({{"system", "Be brief."}, {"user", "Hi"}}),
            "System: Be brief.\nUser: Hi\nAssistant:");
}

TEST(ChatTemplate, FalconInstructJinja) {
  // falcon-7b-instruct's tokenizer_config.json chat_template.
  const std::string src =
      "{% for message in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
      "{% if message['role'] == 'system' %}{{ 'System: ' }}{% elif message['role'] == 'user' %}"
      "{{ 'User: ' }}{% elif message['role'] == 'assistant' %}{{ 'Falcon: ' }}{% endif %}"
      "{{ message['content'] }}{% endfor %}{% if add_generation_prompt %}{{ '\\n' + 'Falcon:' }}{% "
      "endif %}";
  ChatTemplate t = ChatTemplate::from_jinja(src);
  EXPECT_EQ(t.render({{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo"}, {"user", "Bye"}}),
            "System: S\nUser: Hi\nFalcon: Yo\nUser: Bye\nFalcon:");
}

TEST(ChatTemplate, JinjaFeatures) {
  const std::string src =
      "{{ bos_token }}{%- set sys = messages[0].content if messages[0].role == 'system' else none "
      "-%}\n"
      "{% if sys is not none %}[{{ sys | trim | upper }}]{% endif %}\n"
      "{% for m in messages[1:] %}{{ loop.index }}:{{ m.role ~ '=' ~ m.content.strip() }}"
      "{% if not loop.last %}, {% endif %}{% endfor %}"
      "{% if messages | length > 2 and 'x' in 'xyz' %}!{% endif %}"
      "{{ eos_token }}";
  ChatTemplate t = ChatTemplate::from_jinja(src, "<s>", "</s>");
  EXPECT_EQ(t.render({{"system", " be nice "}, {"user", " a "}, {"assistant", "b"}}),
            "<s>[BE NICE]1:user=a, 2:assistant=b!</s>");
}

TEST(ChatTemplate, RaiseException) {
  ChatTemplate t = ChatTemplate::from_jinja(
      "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif "
      "%}ok");
  EXPECT_EQ(t.render({{"user", "x"}}), "ok");
  try {
    t.render({{"assistant", "x"}});
    FAIL();
  } catch (const ValidationError& e) {
    EXPECT_EQ(std::string(e.what()), "first must be user");
  }
  EXPECT_THROW(ChatTemplate::from_jinja("{% macro m() %}{% endmacro %}"), Error);
  EXPECT_THROW(ChatTemplate::from_jinja("{% if x %}"), Error);
}

TEST(Metrics, PrometheusText) {
  Metrics m;
  m.request_started();
  RequestRecord r;
  r.total_seconds = 0.5;
  r.generated_tokens = 4;
  r.input_length = 3;
  r.first_token_seconds = 0.1;
  m.request_succeeded(r);
  m.request_failed("validation");
  EngineStats s;
  s.kv_blocks_total = 10;
  s.kv_blocks_used = 2;
  const std::string text = m.render(s);
  for (const char* needle :
       {"lorax_request_count 1\n", "lorax_request_success 1\n",
        "lorax_request_failure{err=\"validation\"} 1\n",
        "lorax_request_duration_bucket{le=\"+Inf\"} 1\n", "lorax_request_duration_count 1\n",
        "lorax_request_generated_tokens_sum 4\n", "lorax_queue_length 0\n",
        "lorax_batch_current_size 0\n", "kestrel_kv_blocks_used 2\n", "kestrel_kv_cache_usage 0.2",
        "# TYPE lorax_request_duration histogram\n"})
    EXPECT_NE(text.find(needle), std::string::npos) << needle;
}

TEST(Metrics, LabelledByAdapter) {
  Metrics m;
  EngineStats s;
  // Before any request the base model's series is there, at 0.
  std::string text = m.render(s);
  EXPECT_NE(text.find("kestrel_adapter_requests_total{adapter=\"\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("kestrel_adapter_generated_tokens_total{adapter=\"\"} 0\n"),
            std::string::npos);
  RequestRecord r;
  r.generated_tokens = 5;
  m.request_succeeded(r);  // base
  r.adapter = "e1-r8-all";
  r.generated_tokens = 7;
  m.request_succeeded(r);
  m.request_succeeded(r);
  r.adapter = "odd\"name\\x";  // escaped as Prometheus label values are
  r.generated_tokens = 1;
  m.request_succeeded(r);
  text = m.render(s);
  for (const char* needle :
       {"kestrel_adapter_requests_total{adapter=\"\"} 1\n",
        "kestrel_adapter_requests_total{adapter=\"e1-r8-all\"} 2\n",
        "kestrel_adapter_generated_tokens_total{adapter=\"\"} 5\n",
        "kestrel_adapter_generated_tokens_total{adapter=\"e1-r8-all\"} 14\n",
        "kestrel_adapter_requests_total{adapter=\"odd\\\"name\\\\x\"} 1\n",
        "# TYPE kestrel_adapter_requests_total counter\n", "lorax_request_success 4\n",
        "lorax_request_generated_tokens_sum 20\n"})
    EXPECT_NE(text.find(needle), std::string::npos) << needle;
}

}  // namespace
}  // namespace kestrel::server
