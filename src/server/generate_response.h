// LoRAX / TGI response bodies: /generate's {generated_text, details} and the
// /generate_stream SSE events (every token, the last with generated_text and
// details), shaped as LoRAX's clients (lorax-client, text-generation) parse them.
#pragma once

#include <string>

#include "engine/request.h"
#include "server/generate_request.h"
#include "server/json_util.h"

namespace kestrel::text {
class Tokenizer;
}

namespace kestrel::server {

// "length" or "stop" (OpenAI's spelling; a cancelled request reads "length").
const char* openai_finish_reason(FinishReason reason);

// {"id","text","logprob","special"} plus "alternative_tokens" when there are any.
json token_json(const TokenInfo& token, const text::Tokenizer* tokenizer);

// The /generate body. prompt_text is prepended with return_full_text.
json generate_response(const GenerationResult& result, const GenerateParams& params,
                       const text::Tokenizer* tokenizer);

// One SSE event ("data:<json>\n\n", as TGI writes them).
std::string sse_event(const json& payload);

// {"token":..., "generated_text":null, "details":null}
json stream_token_event(const TokenInfo& token, const text::Tokenizer* tokenizer);
// The last event: the last token with generated_text and details
// {finish_reason, prompt_tokens, generated_tokens, seed}.
json stream_final_event(const TokenInfo& last_token, const GenerationResult& result,
                        const GenerateParams& params, const text::Tokenizer* tokenizer);

// A TGI-style error body {"error": message, "error_type": type}.
json error_json(const std::string& message, const std::string& error_type);

}  // namespace kestrel::server
