// Routing and the non-generating routes (/info, /health, /metrics, /docs,
// /tokenize, /v1/models); generating routes build a request and a job.
#include "server/routes.h"

#include <chrono>

#include "core/logging.h"
#include "io/falcon_config.h"
#include "model/falcon_model.h"
#include "server/http_error.h"
#include "server/jobs.h"
#include "text/tokenizer.h"

namespace kestrel::server {
namespace {

constexpr const char* kVersion = "0.1.0";

struct RouteSpec {
  const char* path;
  const char* method;
};
constexpr RouteSpec kRoutes[] = {
    {"/", "POST"},
    {"/generate", "POST"},
    {"/generate_stream", "POST"},
    {"/tokenize", "POST"},
    {"/info", "GET"},
    {"/health", "GET"},
    {"/metrics", "GET"},
    {"/docs", "GET"},
    {"/openapi.json", "GET"},
    {"/api-doc/openapi.json", "GET"},
    {"/v1/models", "GET"},
    {"/v1/completions", "POST"},
    {"/v1/chat/completions", "POST"},
};

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Reply json_reply(int status, const json& body) {
  Reply r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

Reply error_reply(int status, const std::string& error_type, const std::string& message) {
  return json_reply(status, {{"error", message}, {"error_type", error_type}});
}

Api::Api(Engine& engine, const text::Tokenizer& tokenizer, ChatTemplate chat_template,
         ApiOptions options)
    : engine_(engine),
      tokenizer_(tokenizer),
      chat_template_(std::move(chat_template)),
      options_(std::move(options)) {}

bool Api::try_acquire() {
  int64_t n = in_flight_.load();
  do {
    if (n >= options_.max_concurrent_requests) return false;
  } while (!in_flight_.compare_exchange_weak(n, n + 1));
  metrics_.set_in_flight(n + 1);
  return true;
}

void Api::release() {
  metrics_.set_in_flight(--in_flight_);
}

Routed Api::route(const std::string& method, const std::string& target, const std::string& body,
                  const std::string& authorization) {
  const std::string path = target.substr(0, target.find('?'));
  try {
    if (!options_.api_key.empty() && path != "/health" &&
        authorization != "Bearer " + options_.api_key)
      return {error_reply(401, "authentication",
                          "missing or wrong API key (Authorization: Bearer <key>)"),
              {},
              nullptr};
    return dispatch(method, path, body);
  } catch (const HttpError& e) {
    if (e.status() == 422) metrics_.request_failed("validation");
    return {error_reply(e.status(), e.error_type(), e.what()), {}, nullptr};
  } catch (const ValidationError& e) {
    metrics_.request_failed("validation");
    return {error_reply(422, "validation", std::string("Input validation error: ") + e.what()),
            {},
            nullptr};
  } catch (const std::exception& e) {
    spdlog::error("{} {}: {}", method, path, e.what());
    return {error_reply(500, "internal", e.what()), {}, nullptr};
  }
}

Routed Api::dispatch(const std::string& method, const std::string& path, const std::string& body) {
  const bool get = method == "GET", post = method == "POST";
  if (post && path == "/generate") return generate(body, false, false);
  if (post && path == "/generate_stream") return generate(body, true, false);
  if (post && path == "/") return generate(body, false, true);
  if (post && path == "/v1/completions") return completions(body);
  if (post && path == "/v1/chat/completions") return chat(body);
  if (post && path == "/tokenize") return {tokenize(body), {}, nullptr};
  if (get && path == "/health") return {json_reply(200, {{"status", "ok"}}), {}, nullptr};
  if (get && path == "/info") return {info(), {}, nullptr};
  if (get && path == "/v1/models") return {models(), {}, nullptr};
  if (get && path == "/metrics") {
    Reply r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = metrics_.render(engine_.stats());
    return {std::move(r), {}, nullptr};
  }
  if (get && (path == "/docs" || path == "/openapi.json" || path == "/api-doc/openapi.json")) {
    Reply r;
    r.body = openapi_json();
    return {std::move(r), {}, nullptr};
  }
  std::string allow;
  for (const RouteSpec& r : kRoutes)
    if (path == r.path) allow += (allow.empty() ? "" : ", ") + std::string(r.method);
  if (!allow.empty()) {
    Reply r = error_reply(405, "method_not_allowed",
                          method + " is not allowed on " + path + " (allowed: " + allow + ")");
    r.headers.emplace_back("Allow", allow);
    return {std::move(r), {}, nullptr};
  }
  return {error_reply(404, "not_found", "no route " + method + " " + path), {}, nullptr};
}

Routed Api::generate(const std::string& body, bool stream_default, bool from_root) {
  metrics_.request_started();
  GenerateParams g =
      parse_generate_request(parse_json_object(body), stream_default, options_.limits);
  std::vector<int32_t> ids = tokenizer_.encode(g.inputs);
  fit_to_limits(ids, g.truncate, g.max_new_tokens_given, g.sampling, options_.limits);
  Routed r;
  r.request.prompt_ids = std::move(ids);
  r.request.params = g.sampling;
  const int32_t eos = tokenizer_.eos_id().value_or(-1);
  r.job = make_tgi_job(std::move(g), from_root, &tokenizer_, eos);
  return r;
}

Routed Api::completions(const std::string& body) {
  metrics_.request_started();
  OpenAiRequest req = parse_completion_request(parse_json_object(body), options_.limits);
  std::vector<int32_t> ids;
  if (req.prompt_ids) {
    for (int32_t id : *req.prompt_ids)
      if (id >= tokenizer_.vocab_size())
        throw ValidationError("prompt", "`prompt` token id " + std::to_string(id) +
                                            " is beyond the vocabulary (" +
                                            std::to_string(tokenizer_.vocab_size()) + ")");
    ids = *req.prompt_ids;
    req.prompt = tokenizer_.decode(ids);
  } else {
    ids = tokenizer_.encode(req.prompt);
  }
  fit_to_limits(ids, std::nullopt, req.max_tokens_given, req.sampling, options_.limits);
  if (req.echo && req.logprobs >= 0) req.sampling.prompt_logprobs = true;
  Routed r;
  r.request.prompt_ids = std::move(ids);
  r.request.params = req.sampling;
  OpenAiContext ctx{"cmpl-" + std::to_string(next_id_++), unix_now(), options_.model_id,
                    &tokenizer_};
  r.job = make_openai_job(std::move(req), std::move(ctx));
  return r;
}

Routed Api::chat(const std::string& body) {
  metrics_.request_started();
  OpenAiRequest req = parse_chat_request(parse_json_object(body), options_.limits);
  req.prompt = chat_template_.render(req.messages, true);
  std::vector<int32_t> ids = tokenizer_.encode(req.prompt, /*add_special_tokens=*/false);
  fit_to_limits(ids, std::nullopt, req.max_tokens_given, req.sampling, options_.limits);
  Routed r;
  r.request.prompt_ids = std::move(ids);
  r.request.params = req.sampling;
  OpenAiContext ctx{"chatcmpl-" + std::to_string(next_id_++), unix_now(), options_.model_id,
                    &tokenizer_};
  r.job = make_openai_job(std::move(req), std::move(ctx));
  return r;
}

Reply Api::tokenize(const std::string& body) {
  const json j = parse_json_object(body);
  auto it = j.find("inputs");
  if (it == j.end() || !it->is_string())
    throw ValidationError("inputs", "`inputs` is required and must be a string");
  const std::string inputs = it->get<std::string>();
  const std::vector<int32_t> ids = tokenizer_.encode(inputs);
  // Offsets are byte offsets into the decoded text, piece by piece.
  json out = json::array();
  text::IncrementalDetokenizer detok(tokenizer_);
  size_t offset = 0;
  for (int32_t id : ids) {
    const std::string piece = detok.push(id);
    const int32_t one[1] = {id};
    out.push_back({{"id", id},
                   {"text", tokenizer_.decode(one)},
                   {"start", offset},
                   {"stop", offset + piece.size()}});
    offset += piece.size();
  }
  return json_reply(200, out);
}

Reply Api::info() const {
  const EngineOptions& eo = engine_.options();
  const FalconModel& model = engine_.model();
  return json_reply(200,
                    {{"model_id", options_.model_id},
                     {"model_sha", nullptr},
                     {"model_dtype", std::string(dtype_name(model.act_dtype()))},
                     {"model_device_type", model.device() == Device::kCuda ? "cuda" : "cpu"},
                     {"model_summary", model.config().summary()},
                     {"model_pipeline_tag", "text-generation"},
                     {"max_concurrent_requests", options_.max_concurrent_requests},
                     {"max_best_of", options_.limits.max_best_of},
                     {"max_stop_sequences", options_.limits.max_stop_sequences},
                     {"max_input_length", options_.limits.max_input_length},
                     {"max_total_tokens", options_.limits.max_total_tokens},
                     {"max_batch_prefill_tokens", eo.max_batch_prefill_tokens},
                     {"max_batch_total_tokens", eo.max_batch_total_tokens},
                     {"max_running_seqs", eo.max_running_seqs},
                     {"block_size", eo.block_size},
                     {"max_client_batch_size", 1},
                     {"chat_template", chat_template_.is_default() ? "falcon-default" : "model"},
                     {"validation_workers", 0},
                     {"version", kVersion},
                     {"sha", nullptr},
                     {"docker_label", nullptr},
                     {"router", "kestrel"}});
}

Reply Api::models() const {
  json model{
      {"id", options_.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "kestrel"}};
  return json_reply(200, {{"object", "list"}, {"data", json::array({model})}});
}

}  // namespace kestrel::server
