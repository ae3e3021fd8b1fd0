// Engine events -> TGI and OpenAI response bodies and SSE streams.
#include "server/jobs.h"

#include "server/generate_response.h"
#include "server/http_error.h"
#include "text/tokenizer.h"

namespace kestrel::server {
namespace {

constexpr const char* kSse = "text/event-stream";

class TgiJob : public GenerationJob {
 public:
  TgiJob(GenerateParams p, bool from_root, const text::Tokenizer* tok, int32_t eos_id)
      : p_(std::move(p)), from_root_(from_root), tok_(tok), eos_id_(eos_id) {}

  void start(ResponseChannel& out) override {
    if (p_.stream) out.begin_stream(kSse);
  }

  // TGI sends the last token together with generated_text and details, so a
  // token that may be the last (length reached, EOS, a possible stop sequence)
  // waits for the next event; every other token goes out at once.
  void on_token(const TokenInfo& token, ResponseChannel& out) override {
    if (!p_.stream) return;
    ++n_tokens_;
    if (held_) out.stream(sse_event(stream_token_event(*held_, tok_)));
    held_.reset();
    const bool maybe_last = n_tokens_ >= p_.sampling.max_new_tokens || token.special ||
                            token.id == eos_id_ || !p_.sampling.stop.empty();
    if (maybe_last)
      held_ = token;
    else
      out.stream(sse_event(stream_token_event(token, tok_)));
  }

  void on_finished(const GenerationResult& r, ResponseChannel& out) override {
    if (!p_.stream) {
      json body = generate_response(r, p_, tok_);
      out.reply(json_reply(200, from_root_ ? json::array({std::move(body)}) : std::move(body)));
      return;
    }
    TokenInfo last;
    if (held_) {
      last = *held_;
    } else if (!r.tokens.empty()) {
      last = r.tokens.back();
      last.text.clear();
    }
    out.stream(sse_event(stream_final_event(last, r, p_, tok_)));
    out.end_stream();
  }

  void on_error(ErrorKind kind, const std::string& message, ResponseChannel& out) override {
    if (!p_.stream) {
      out.reply(error_reply(kind, message));
      return;
    }
    out.stream(sse_event(error_json(message, http_status(kind).error_type)));
    out.end_stream();
  }

 private:
  GenerateParams p_;
  bool from_root_;
  const text::Tokenizer* tok_;
  int32_t eos_id_;
  int64_t n_tokens_ = 0;
  std::optional<TokenInfo> held_;
};

class OpenAiJob : public GenerationJob {
 public:
  OpenAiJob(OpenAiRequest r, OpenAiContext ctx) : r_(std::move(r)), ctx_(std::move(ctx)) {}

  void start(ResponseChannel& out) override {
    if (!r_.stream) return;
    out.begin_stream(kSse);
    if (r_.chat) {
      const std::string empty;
      out.stream(openai_sse(chat_chunk(r_, ctx_, &empty, true, nullptr, nullptr, nullptr)));
    } else if (r_.echo) {
      out.stream(openai_sse(completion_chunk(r_, ctx_, r_.prompt, nullptr, nullptr, nullptr)));
    }
  }

  void on_token(const TokenInfo& token, ResponseChannel& out) override {
    if (!r_.stream) return;
    ++n_tokens_;
    // The end-of-sequence token that ends the request is not content (as in the final text).
    const bool ends = ctx_.tokenizer && token.id == ctx_.tokenizer->eos_id().value_or(-1) &&
                      (!r_.sampling.ignore_eos || r_.constraint);
    static const std::string kNone;
    const std::string& text = ends ? kNone : token.text;
    if (r_.chat)
      out.stream(openai_sse(chat_chunk(r_, ctx_, &text, true, &token, nullptr, nullptr)));
    else
      out.stream(openai_sse(completion_chunk(r_, ctx_, text, &token, nullptr, nullptr)));
  }

  void on_finished(const GenerationResult& r, ResponseChannel& out) override {
    if (!r_.stream) {
      out.reply(
          json_reply(200, r_.chat ? chat_response(r_, ctx_, r) : completion_response(r_, ctx_, r)));
      return;
    }
    const char* reason = openai_finish_reason(r.finish_reason);
    json usage = usage_json(r.prompt_length, static_cast<int64_t>(r.tokens.size()));
    json last_usage = r_.include_usage ? json(nullptr) : usage;
    if (r_.chat)
      out.stream(openai_sse(chat_chunk(r_, ctx_, nullptr, true, nullptr, reason, last_usage)));
    else
      out.stream(openai_sse(completion_chunk(r_, ctx_, "", nullptr, reason, last_usage)));
    if (r_.include_usage) {
      out.stream(openai_sse(r_.chat ? chat_chunk(r_, ctx_, nullptr, false, nullptr, nullptr, usage)
                                    : completion_chunk(r_, ctx_, "", nullptr, nullptr, usage)));
    }
    out.stream(kOpenAiDone);
    out.end_stream();
  }

  void on_error(ErrorKind kind, const std::string& message, ResponseChannel& out) override {
    if (!r_.stream) {
      out.reply(error_reply(kind, message));
      return;
    }
    out.stream(openai_sse(error_json(message, http_status(kind).error_type)));
    out.stream(kOpenAiDone);
    out.end_stream();
  }

 private:
  OpenAiRequest r_;
  OpenAiContext ctx_;
  int64_t n_tokens_ = 0;
};

}  // namespace

std::unique_ptr<GenerationJob> make_tgi_job(GenerateParams params, bool from_root,
                                            const text::Tokenizer* tokenizer, int32_t eos_id) {
  return std::make_unique<TgiJob>(std::move(params), from_root, tokenizer, eos_id);
}

std::unique_ptr<GenerationJob> make_openai_job(OpenAiRequest request, OpenAiContext ctx) {
  return std::make_unique<OpenAiJob>(std::move(request), std::move(ctx));
}

}  // namespace kestrel::server
