// OpenAI completions and chat completions: request parsing and response shapes.
#include "server/openai.h"

#include <cmath>

#include "server/generate_response.h"
#include "server/response_format.h"
#include "text/tokenizer.h"

namespace kestrel::server {
namespace {

[[noreturn]] void invalid(const char* field, const std::string& message) {
  throw ValidationError(field, message);
}

// Whether obj[key] is the string `want` (false for any other type: never a type_error).
bool string_is(const json& obj, const char* key, std::string_view want) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() && it->get_ref<const std::string&>() == want;
}

// obj[key] by reference, or a null when absent: request JSON is never copied.
const json& member_or_null(const json& obj, const char* key) {
  static const json kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

// The knobs both OpenAI routes share. OpenAI samples at temperature 1 unless told otherwise.
void parse_common(const json& body, const RequestLimits& limits, OpenAiRequest& r) {
  for (const char* field : {"tools", "functions", "suffix"}) {
    auto it = body.find(field);
    if (it != body.end() && !it->is_null() && !(it->is_array() && it->empty()))
      invalid(field, std::string("`") + field + "` is not supported yet");
  }
  r.constraint = parse_openai_response_format(member_or_null(body, "response_format"));
  if (auto it = body.find("logit_bias");
      it != body.end() && !it->is_null() && !(it->is_object() && it->empty()))
    invalid("logit_bias", "`logit_bias` is not supported yet");
  r.model = opt_string(body, "model").value_or("");
  r.stream = opt_bool(body, "stream").value_or(false);
  if (auto it = body.find("stream_options"); it != body.end() && it->is_object())
    r.include_usage = opt_bool(*it, "include_usage").value_or(false);

  SamplingInput s;
  s.temperature = opt_number(body, "temperature");
  if (s.temperature && *s.temperature > 2)
    invalid("temperature", "`temperature` must be in [0, 2], got " + json(*s.temperature).dump());
  s.top_p = opt_number(body, "top_p");
  s.frequency_penalty = opt_number(body, "frequency_penalty");
  s.presence_penalty = opt_number(body, "presence_penalty");
  s.repetition_penalty = opt_number(body, "repetition_penalty");
  if (auto k = opt_int(body, "top_k")) s.top_k = static_cast<double>(*k);
  s.do_sample = true;  // OpenAI's default temperature is 1: sampling
  apply_sampling(s, r.sampling);

  if (auto n = opt_int(body, "n"); n && *n != 1)
    invalid("n",
            "`n` must be 1 (several choices are not supported yet), got " + std::to_string(*n));
  if (auto seed = opt_int(body, "seed")) {
    if (*seed < 0) invalid("seed", "`seed` must be >= 0, got " + std::to_string(*seed));
    r.sampling.seed = static_cast<uint64_t>(*seed);
  }
  r.sampling.stop = opt_string_list(body, "stop");
  if (static_cast<int64_t>(r.sampling.stop.size()) > limits.max_stop_sequences)
    invalid("stop", "`stop` supports up to " + std::to_string(limits.max_stop_sequences) +
                        " sequences. Given: " + std::to_string(r.sampling.stop.size()));
  for (const std::string& st : r.sampling.stop)
    if (st.empty()) invalid("stop", "`stop` sequences cannot be empty");
  r.sampling.ignore_eos = opt_bool(body, "ignore_eos").value_or(false);

  std::optional<int64_t> max_tokens = opt_int(body, "max_tokens");
  if (!max_tokens && r.chat) max_tokens = opt_int(body, "max_completion_tokens");
  if (max_tokens) {
    const char* field = body.contains("max_tokens") ? "max_tokens" : "max_completion_tokens";
    if (*max_tokens < 1 || *max_tokens > limits.max_total_tokens)
      invalid(field, std::string("`") + field + "` must be in [1, " +
                         std::to_string(limits.max_total_tokens) + "] (max_total_tokens), got " +
                         std::to_string(*max_tokens));
    r.sampling.max_new_tokens = *max_tokens;
    r.max_tokens_given = true;
  } else {
    // Completions default to 16 tokens (OpenAI's default); chat to the rest of the budget.
    r.sampling.max_new_tokens = r.chat ? limits.max_total_tokens : 16;
  }
}

std::string content_text(const json& content, size_t index) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array())
    invalid("messages", "`messages[" + std::to_string(index) +
                            "].content` must be a string or an array of text parts");
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || !string_is(part, "type", "text") || !part.contains("text") ||
        !part["text"].is_string())
      invalid("messages", "`messages[" + std::to_string(index) +
                              "].content` parts must be {\"type\": \"text\", \"text\": ...}");
    text += part["text"].get<std::string>();
  }
  return text;
}

json completion_logprobs(const std::vector<const TokenInfo*>& tokens, size_t text_offset0,
                         const text::Tokenizer* tok) {
  json texts = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = text_offset0;
  for (const TokenInfo* t : tokens) {
    texts.push_back(t->text);
    lps.push_back(float_or_null(t->logprob));
    json top = json::object();
    for (const TokenAlternative& a : t->alternatives) top[a.text] = float_or_null(a.logprob);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += t->text.size();
  }
  return {
      {"tokens", texts}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

json chat_logprob_entry(const TokenInfo& t) {
  json top = json::array();
  for (const TokenAlternative& a : t.alternatives)
    top.push_back(
        {{"token", a.text}, {"logprob", float_or_null(a.logprob)}, {"bytes", bytes_of(a.text)}});
  return {{"token", t.text},
          {"logprob", float_or_null(t.logprob)},
          {"bytes", bytes_of(t.text)},
          {"top_logprobs", std::move(top)}};
}

}  // namespace

OpenAiRequest parse_completion_request(const json& body, const RequestLimits& limits) {
  OpenAiRequest r;
  r.chat = false;
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) invalid("prompt", "`prompt` is required");
  const json* prompt = &*it;
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) prompt = &(*prompt)[0];
  if (prompt->is_string()) {
    r.prompt = prompt->get<std::string>();
    if (r.prompt.empty()) invalid("prompt", "`prompt` cannot be empty");
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number_integer()) {
    std::vector<int32_t> ids;
    for (const json& v : *prompt) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
        invalid("prompt", "`prompt` token ids must be non-negative integers");
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    r.prompt_ids = std::move(ids);
  } else {
    invalid("prompt",
            "`prompt` must be a string, one string in an array, or an array of token ids "
            "(several prompts per request are not supported yet)");
  }
  parse_common(body, limits, r);
  if (auto lp = opt_int(body, "logprobs")) {
    if (*lp < 0 || *lp > 5)
      invalid("logprobs", "`logprobs` must be in [0, 5], got " + std::to_string(*lp));
    r.logprobs = static_cast<int32_t>(*lp);
    r.sampling.top_n_tokens = r.logprobs;
  }
  r.echo = opt_bool(body, "echo").value_or(false);
  if (auto b = opt_int(body, "best_of"); b && *b != 1)
    invalid("best_of", "`best_of` must be 1 on /v1/completions (use /generate for best_of)");
  return r;
}

OpenAiRequest parse_chat_request(const json& body, const RequestLimits& limits) {
  OpenAiRequest r;
  r.chat = true;
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) invalid("messages", "`messages` is required");
  if (!it->is_array() || it->empty()) invalid("messages", "`messages` must be a non-empty array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      invalid("messages",
              "`messages[" + std::to_string(i) + "]` must be an object with a string `role`");
    r.messages.push_back(
        {m["role"].get<std::string>(), content_text(member_or_null(m, "content"), i)});
  }
  parse_common(body, limits, r);
  if (auto lp = opt_bool(body, "logprobs"); lp && *lp) {
    const int64_t top = opt_int(body, "top_logprobs").value_or(0);
    if (top < 0 || top > 20)
      invalid("top_logprobs", "`top_logprobs` must be in [0, 20], got " + std::to_string(top));
    r.logprobs = static_cast<int32_t>(std::min<int64_t>(top, limits.max_top_n_tokens));
    r.sampling.top_n_tokens = r.logprobs;
  }
  return r;
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json completion_response(const OpenAiRequest& req, const OpenAiContext& ctx,
                         const GenerationResult& r) {
  std::string text = r.text;
  json logprobs = nullptr;
  if (req.logprobs >= 0) {
    std::vector<const TokenInfo*> tokens;
    if (req.echo)
      for (const TokenInfo& t : r.prompt_tokens) tokens.push_back(&t);
    for (const TokenInfo& t : r.tokens) tokens.push_back(&t);
    logprobs = completion_logprobs(tokens, 0, ctx.tokenizer);
  }
  if (req.echo) text = req.prompt + text;
  json choice{{"index", 0},
              {"text", text},
              {"logprobs", logprobs},
              {"finish_reason", openai_finish_reason(r.finish_reason)}};
  return {{"id", ctx.id},
          {"object", "text_completion"},
          {"created", ctx.created},
          {"model", ctx.model},
          {"system_fingerprint", "kestrel"},
          {"choices", json::array({choice})},
          {"usage", usage_json(r.prompt_length, static_cast<int64_t>(r.tokens.size()))}};
}

json chat_response(const OpenAiRequest& req, const OpenAiContext& ctx, const GenerationResult& r) {
  json logprobs = nullptr;
  if (req.logprobs >= 0) {
    json content = json::array();
    for (const TokenInfo& t : r.tokens) content.push_back(chat_logprob_entry(t));
    logprobs = {{"content", std::move(content)}};
  }
  json choice{{"index", 0},
              {"message", {{"role", "assistant"}, {"content", r.text}}},
              {"logprobs", logprobs},
              {"finish_reason", openai_finish_reason(r.finish_reason)}};
  return {{"id", ctx.id},
          {"object", "chat.completion"},
          {"created", ctx.created},
          {"model", ctx.model},
          {"system_fingerprint", "kestrel"},
          {"choices", json::array({choice})},
          {"usage", usage_json(r.prompt_length, static_cast<int64_t>(r.tokens.size()))}};
}

json completion_chunk(const OpenAiRequest& req, const OpenAiContext& ctx, const std::string& text,
                      const TokenInfo* token, const char* finish_reason, json usage) {
  json logprobs = nullptr;
  if (token && req.logprobs >= 0) logprobs = completion_logprobs({token}, 0, ctx.tokenizer);
  json choices = json::array();
  if (token || finish_reason)
    choices.push_back({{"index", 0},
                       {"text", text},
                       {"logprobs", logprobs},
                       {"finish_reason", finish_reason ? json(finish_reason) : json(nullptr)}});
  json j{{"id", ctx.id},       {"object", "text_completion"},     {"created", ctx.created},
         {"model", ctx.model}, {"system_fingerprint", "kestrel"}, {"choices", std::move(choices)}};
  if (!usage.is_null()) j["usage"] = std::move(usage);
  return j;
}

json chat_chunk(const OpenAiRequest& req, const OpenAiContext& ctx, const std::string* content,
                bool with_role, const TokenInfo* token, const char* finish_reason, json usage) {
  json delta = json::object();
  if (with_role) delta["role"] = "assistant";
  if (content) delta["content"] = *content;
  json logprobs = nullptr;
  if (token && req.logprobs >= 0)
    logprobs = {{"content", json::array({chat_logprob_entry(*token)})}};
  json choices = json::array();
  if (content || with_role || finish_reason)
    choices.push_back({{"index", 0},
                       {"delta", std::move(delta)},
                       {"logprobs", logprobs},
                       {"finish_reason", finish_reason ? json(finish_reason) : json(nullptr)}});
  json j{
      {"id", ctx.id},       {"object", "chat.completion.chunk"}, {"created", ctx.created},
      {"model", ctx.model}, {"system_fingerprint", "kestrel"},   {"choices", std::move(choices)}};
  if (!usage.is_null()) j["usage"] = std::move(usage);
  return j;
}

std::string openai_sse(const json& payload) {
  return "data: " + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace kestrel::server
