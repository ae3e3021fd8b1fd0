// LoRAX / TGI response shapes for /generate and /generate_stream.
#include "server/generate_response.h"

#include "text/tokenizer.h"

namespace kestrel::server {

const char* openai_finish_reason(FinishReason reason) {
  return reason == FinishReason::kEosToken || reason == FinishReason::kStopSequence ? "stop"
                                                                                    : "length";
}

namespace {

bool special_id(const text::Tokenizer* tokenizer, int32_t id) {
  return tokenizer && tokenizer->is_special(id);
}

json alternatives_json(const TokenInfo& token, const text::Tokenizer* tokenizer) {
  json alts = json::array();
  for (const TokenAlternative& a : token.alternatives)
    alts.push_back({{"id", a.id},
                    {"text", a.text},
                    {"logprob", float_or_null(a.logprob)},
                    {"special", special_id(tokenizer, a.id)}});
  return alts;
}

json prefill_json(const GenerationResult& r, bool wanted) {
  json prefill = json::array();
  if (!wanted) return prefill;
  for (const TokenInfo& t : r.prompt_tokens)
    prefill.push_back({{"id", t.id}, {"text", t.text}, {"logprob", float_or_null(t.logprob)}});
  return prefill;
}

json seed_json(const GenerationResult& r, const GenerateParams& g) {
  return g.sampling.do_sample ? json(r.seed) : json(nullptr);
}

json tokens_json(const GenerationResult& r, const text::Tokenizer* tokenizer) {
  json tokens = json::array();
  for (const TokenInfo& t : r.tokens) tokens.push_back(token_json(t, tokenizer));
  return tokens;
}

}  // namespace

json token_json(const TokenInfo& token, const text::Tokenizer* tokenizer) {
  json j{{"id", token.id},
         {"text", token.text},
         {"logprob", float_or_null(token.logprob)},
         {"special", token.special}};
  if (!token.alternatives.empty()) j["alternative_tokens"] = alternatives_json(token, tokenizer);
  return j;
}

json generate_response(const GenerationResult& r, const GenerateParams& g,
                       const text::Tokenizer* tokenizer) {
  json out{{"generated_text", g.return_full_text ? g.inputs + r.text : r.text}};
  if (!g.details) return out;
  json details{{"finish_reason", finish_reason_name(r.finish_reason)},
               {"prompt_tokens", r.prompt_length},
               {"generated_tokens", r.tokens.size()},
               {"seed", seed_json(r, g)},
               {"prefill", prefill_json(r, g.decoder_input_details)},
               {"tokens", tokens_json(r, tokenizer)}};
  if (g.sampling.top_n_tokens > 0) {
    json top = json::array();
    for (const TokenInfo& t : r.tokens) top.push_back(alternatives_json(t, tokenizer));
    details["top_tokens"] = std::move(top);
  }
  if (!r.best_of_sequences.empty()) {
    json seqs = json::array();
    for (const GenerationResult& b : r.best_of_sequences)
      seqs.push_back({{"generated_text", g.return_full_text ? g.inputs + b.text : b.text},
                      {"finish_reason", finish_reason_name(b.finish_reason)},
                      {"generated_tokens", b.tokens.size()},
                      {"seed", seed_json(b, g)},
                      {"prefill", prefill_json(b, g.decoder_input_details)},
                      {"tokens", tokens_json(b, tokenizer)}});
    details["best_of_sequences"] = std::move(seqs);
  }
  out["details"] = std::move(details);
  return out;
}

std::string sse_event(const json& payload) {
  return "data:" + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

json stream_token_event(const TokenInfo& token, const text::Tokenizer* tokenizer) {
  json j{
      {"token", token_json(token, tokenizer)}, {"generated_text", nullptr}, {"details", nullptr}};
  if (!token.alternatives.empty()) j["top_tokens"] = alternatives_json(token, tokenizer);
  return j;
}

json stream_final_event(const TokenInfo& last_token, const GenerationResult& r,
                        const GenerateParams& g, const text::Tokenizer* tokenizer) {
  json j = stream_token_event(last_token, tokenizer);
  j["generated_text"] = g.return_full_text ? g.inputs + r.text : r.text;
  j["details"] = {{"finish_reason", finish_reason_name(r.finish_reason)},
                  {"prompt_tokens", r.prompt_length},
                  {"generated_tokens", r.tokens.size()},
                  {"seed", seed_json(r, g)}};
  return j;
}

json error_json(const std::string& message, const std::string& error_type) {
  return {{"error", message}, {"error_type", error_type}};
}

}  // namespace kestrel::server
