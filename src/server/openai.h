// The OpenAI dialect: /v1/completions and /v1/chat/completions requests
// parsed into SamplingParams (OpenAI's defaults and ranges), and their
// response and stream-chunk bodies.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/generate_request.h"
#include "server/json_util.h"

namespace kestrel::text {
class Tokenizer;
}

namespace kestrel::server {

struct ChatMessage {
  std::string role;
  std::string content;
};

struct OpenAiRequest {
  bool chat = false;
  std::string model;
  std::string prompt;                              // completions: the text
  std::optional<std::vector<int32_t>> prompt_ids;  // completions: a prompt given as token ids
  std::vector<ChatMessage> messages;               // chat
  SamplingParams sampling;
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage only
  int32_t logprobs = -1;       // -1: none; else alternatives per token (completions: 0..5)
  bool echo = false;           // completions: prompt text before the completion
  std::optional<grammar::Spec> constraint;  // response_format (structured output)
};

OpenAiRequest parse_completion_request(const json& body, const RequestLimits& limits);
OpenAiRequest parse_chat_request(const json& body, const RequestLimits& limits);

// Everything a response body needs beside the result.
struct OpenAiContext {
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  const text::Tokenizer* tokenizer = nullptr;
};

json completion_response(const OpenAiRequest& req, const OpenAiContext& ctx,
                         const GenerationResult& result);
json chat_response(const OpenAiRequest& req, const OpenAiContext& ctx,
                   const GenerationResult& result);

// One streamed chunk: `text` (chat: delta content) for `token` when given;
// finish_reason null until the last; `usage` when not null.
json completion_chunk(const OpenAiRequest& req, const OpenAiContext& ctx, const std::string& text,
                      const TokenInfo* token, const char* finish_reason, json usage);
// Chat: first chunk carries delta {role: assistant}.
json chat_chunk(const OpenAiRequest& req, const OpenAiContext& ctx, const std::string* content,
                bool with_role, const TokenInfo* token, const char* finish_reason, json usage);
json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

// OpenAI SSE framing: "data: <json>\n\n"; the stream ends with "data: [DONE]\n\n".
std::string openai_sse(const json& payload);
inline constexpr const char* kOpenAiDone = "data: [DONE]\n\n";

}  // namespace kestrel::server
