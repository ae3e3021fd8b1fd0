// Routing and the non-generating routes (/info, /health, /metrics, /docs,
// /tokenize, /v1/models); generating routes build a request and a job.
#include "server/routes.h"
#include "server/response_format.h"

#include <chrono>
#include <set>

#include "core/logging.h"
#include "io/falcon_config.h"
#include "lora/adapter_store.h"
#include "model/falcon_model.h"
#include "server/http_error.h"
#include "server/jobs.h"
#include "server/request_policy.h"
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
    {"/", "GET"},
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
    {"/playground", "GET"},
    {"/v1/load_lora_adapter", "POST"},
    {"/v1/unload_lora_adapter", "POST"},
};

// "ORG/NAME": what a Hugging Face repo id looks like (not a path: no leading / or ., one /).
Routed answer(Reply r) {
  Routed out;
  out.reply = std::move(r);
  return out;
}

bool looks_like_repo_id(const std::string& id) {
  const size_t slash = id.find('/');
  return slash != std::string::npos && slash > 0 && slash + 1 < id.size() &&
         id.find('/', slash + 1) == std::string::npos && id[0] != '.' && id[0] != '~';
}

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

Reply error_reply(ErrorKind kind, const std::string& message) {
  const HttpStatus s = http_status(kind);
  return json_reply(s.status, {{"error", message}, {"error_type", s.error_type}});
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

bool Api::try_acquire_adapter(const std::string& key) {
  std::lock_guard<std::mutex> lock(adapter_mu_);
  int64_t& n = adapter_in_flight_[key];
  if (n >= options_.max_requests_per_adapter) {
    if (n == 0) adapter_in_flight_.erase(key);
    return false;
  }
  ++n;
  return true;
}

void Api::release_adapter(const std::string& key) {
  std::lock_guard<std::mutex> lock(adapter_mu_);
  auto it = adapter_in_flight_.find(key);
  if (it != adapter_in_flight_.end() && --it->second <= 0) adapter_in_flight_.erase(it);
}

Routed Api::route(const std::string& method, const std::string& target, const std::string& body,
                  const std::string& authorization) {
  RequestHead head;
  head.method = method;
  head.target = target;
  head.authorization = authorization;
  head.content_type = "application/json";
  return route(head, body);
}

Routed Api::route(const RequestHead& head, const std::string& body) {
  const std::string path = head.target.substr(0, head.target.find('?'));
  std::vector<std::pair<std::string, std::string>> cors = cors_headers(head.origin);
  Routed r;
  try {
    check_head(head, path);
    if (head.method == "OPTIONS")
      r = answer(preflight(head, path));
    else if (head.method == "GET" && (path == "/playground" || path == "/"))
      r = answer(playground(head));
    else
      r = dispatch(head.method, path, body);
  } catch (const ValidationError& e) {
    // One failure reason a request: an adapter that cannot be used counts as "adapter".
    const bool adapter =
        e.field() == "adapter_id" || e.field() == "model" || e.field() == "merged_adapters.ids";
    metrics_.request_failed(adapter ? "adapter" : http_status(e.kind()).error_type);
    r = answer(error_reply(e.kind(), validation_message(e)));
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kInternal) spdlog::error("{} {}: {}", head.method, path, e.what());
    if (e.kind() == ErrorKind::kInvalidArgument) metrics_.request_failed("validation");
    r = answer(error_reply(e.kind(), e.kind() == ErrorKind::kInternal
                                         ? "internal error (the server log has the details)"
                                         : e.what()));
    if (e.kind() == ErrorKind::kUnauthenticated)
      r.reply->headers.emplace_back("WWW-Authenticate",
                                    head.authorization.empty()
                                        ? "Bearer realm=\"kestrel\""
                                        : "Bearer realm=\"kestrel\", error=\"invalid_token\"");
  } catch (const std::exception& e) {
    spdlog::error("{} {}: {}", head.method, path, e.what());
    r = answer(
        error_reply(ErrorKind::kInternal, "internal error (the server log has the details)"));
  }
  r.headers = std::move(cors);
  return r;
}

void Api::check_head(const RequestHead& head, const std::string& path) const {
  if (!head.host.empty() &&
      !host_allowed(head.host, options_.allowed_hosts, options_.allow_ip_hosts))
    throw Error("the Host header names a host this server does not answer for (--allowed-hosts)",
                ErrorKind::kForbidden);
  if (head.method == "OPTIONS") return;  // a preflight carries no credentials
  // The page asks for the key itself: a browser's navigation cannot carry it.
  const bool page = head.method == "GET" && (path == "/playground" || path == "/");
  if (!options_.api_key.empty() && path != "/health" && !page &&
      !bearer_matches(head.authorization, options_.api_key))
    throw Error("missing or wrong API key (Authorization: Bearer <key>)",
                ErrorKind::kUnauthenticated);
  if (head.method == "POST" && !head.content_type.empty() && !is_json_media_type(head.content_type))
    throw Error("the Content-Type header must be application/json",
                ErrorKind::kUnsupportedMediaType);
}

std::vector<std::pair<std::string, std::string>> Api::cors_headers(
    const std::string& origin) const {
  if (origin.empty() || !origin_allowed(origin, options_.cors_origins)) return {};
  return {{"Access-Control-Allow-Origin", origin}, {"Vary", "Origin"}};
}

Reply Api::playground(const RequestHead& head) const {
  const std::string path = head.target.substr(0, head.target.find('?'));
  if (path == "/" && head.accept.find("text/html") == std::string::npos)
    throw Error(
        "GET / serves the playground page to browsers (Accept: text/html); the API is "
        "POST / (LoRAX / TGI)",
        ErrorKind::kMethodNotAllowed);
  Reply r;
  r.content_type = "text/html; charset=utf-8";
  r.body = playground_html();
  // The page loads nothing from elsewhere and may not be framed by another site.
  r.headers.emplace_back("Content-Security-Policy",
                         "default-src 'self'; script-src 'unsafe-inline'; style-src "
                         "'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'");
  r.headers.emplace_back("X-Content-Type-Options", "nosniff");
  r.headers.emplace_back("Cache-Control", "no-cache");
  return r;
}

Reply Api::preflight(const RequestHead& head, const std::string& path) const {
  std::string allow;
  for (const RouteSpec& r : kRoutes)
    if (path == r.path) allow += (allow.empty() ? "" : ", ") + std::string(r.method);
  if (allow.empty()) throw Error("no route OPTIONS " + path, ErrorKind::kNotFound);
  allow += ", OPTIONS";
  if (!head.access_control_request_method.empty() &&
      (head.origin.empty() || !origin_allowed(head.origin, options_.cors_origins)))
    throw Error(
        "the Origin header names an origin this server does not allow (--cors-allow-origin)",
        ErrorKind::kForbidden);
  Reply r;
  r.status = 204;
  r.content_type = "text/plain";
  r.headers.emplace_back("Allow", allow);
  if (!head.access_control_request_method.empty()) {
    r.headers.emplace_back("Access-Control-Allow-Methods", allow);
    r.headers.emplace_back("Access-Control-Allow-Headers", "Authorization, Content-Type");
    r.headers.emplace_back("Access-Control-Max-Age", "600");
  }
  return r;
}

Routed Api::dispatch(const std::string& method, const std::string& path, const std::string& body) {
  const bool get = method == "GET", post = method == "POST";
  if (post && path == "/generate") return generate(body, false, false);
  if (post && path == "/generate_stream") return generate(body, true, false);
  if (post && path == "/") return generate(body, false, true);
  if (post && path == "/v1/completions") return completions(body);
  if (post && path == "/v1/chat/completions") return chat(body);
  if (post && path == "/tokenize") return answer(tokenize(body));
  if (post && path == "/v1/load_lora_adapter") return load_lora_adapter(body);
  if (post && path == "/v1/unload_lora_adapter") return answer(unload_lora_adapter(body));
  if (get && path == "/health") return answer(json_reply(200, {{"status", "ok"}}));
  if (get && path == "/info") return answer(info());
  if (get && path == "/v1/models") return answer(models());
  if (get && path == "/metrics") {
    Reply r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = metrics_.render(engine_.stats());
    if (auto g = engine_.grammar_stats()) Metrics::render_grammar(*g, r.body);
    return answer(std::move(r));
  }
  if (get && (path == "/docs" || path == "/openapi.json" || path == "/api-doc/openapi.json")) {
    Reply r;
    r.body = openapi_json();
    return answer(std::move(r));
  }
  std::string allow;
  for (const RouteSpec& r : kRoutes)
    if (path == r.path) allow += (allow.empty() ? "" : ", ") + std::string(r.method);
  if (!allow.empty()) {
    Reply r = error_reply(ErrorKind::kMethodNotAllowed,
                          method + " is not allowed on " + path + " (allowed: " + allow + ")");
    r.headers.emplace_back("Allow", allow);
    return answer(std::move(r));
  }
  throw Error("no route " + method + " " + path, ErrorKind::kNotFound);
}

Routed Api::generate(const std::string& body, bool stream_default, bool from_root) {
  metrics_.request_started();
  GenerateParams g =
      parse_generate_request(parse_json_object(body), stream_default, options_.limits);
  std::vector<int32_t> ids = tokenizer_.encode(g.inputs);
  fit_to_limits(ids, g.truncate, g.max_new_tokens_given, g.sampling, options_.limits);
  Routed r;
  if (g.adapter) {
    check_adapter(*g.adapter, "adapter_id");
    r.adapter = g.adapter;
  }
  if (g.merged) {
    if (!options_.adapters)
      throw ValidationError("merged_adapters",
                            "`merged_adapters` names adapters, but adapters are not enabled on "
                            "this server");
    r.merged = Routed::Merged{*g.merged, g.merged_source};
    r.adapter_key = adapter_key(*r.merged);
  }
  if (r.adapter) r.adapter_key = adapter_key(*r.adapter);
  r.request.prompt_ids = std::move(ids);
  r.request.params = g.sampling;
  r.request.constraint = g.constraint;
  if (r.request.constraint) keep_schema_order(body, "parameters.", *r.request.constraint);
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
  r.adapter = adapter_for_model(req.model);
  if (r.adapter) {
    check_adapter(*r.adapter, "model");
    r.adapter_key = adapter_key(*r.adapter);
  }
  r.request.prompt_ids = std::move(ids);
  r.request.params = req.sampling;
  r.request.constraint = req.constraint;
  if (r.request.constraint) keep_schema_order(body, "", *r.request.constraint);
  OpenAiContext ctx{"cmpl-" + std::to_string(next_id_++), unix_now(),
                    r.adapter ? r.adapter->id : options_.model_id, &tokenizer_};
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
  r.adapter = adapter_for_model(req.model);
  if (r.adapter) {
    check_adapter(*r.adapter, "model");
    r.adapter_key = adapter_key(*r.adapter);
  }
  r.request.prompt_ids = std::move(ids);
  r.request.params = req.sampling;
  r.request.constraint = req.constraint;
  if (r.request.constraint) keep_schema_order(body, "", *r.request.constraint);
  OpenAiContext ctx{"chatcmpl-" + std::to_string(next_id_++), unix_now(),
                    r.adapter ? r.adapter->id : options_.model_id, &tokenizer_};
  r.job = make_openai_job(std::move(req), std::move(ctx));
  return r;
}

std::optional<AdapterRef> Api::adapter_for_model(const std::string& model) const {
  if (model.empty() || model == options_.model_id || model == options_.base_model_name)
    return std::nullopt;
  if (!options_.adapters)
    throw ValidationError("model", "`model` '" + model + "' is not the served model ('" +
                                       options_.model_id +
                                       "') and adapters are not enabled on this server");
  AdapterRef ref{model, AdapterSource::kLocal};
  // A local adapter (a preloaded name, a name in --adapters-dir) first; else an ORG/NAME id is a
  // hub one. Which of the two it is, check_adapter() says next.
  try {
    options_.adapters->resolve(model, AdapterSource::kLocal);
    return ref;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kNotFound && e.kind() != ErrorKind::kInvalidArgument) throw;
  }
  if (looks_like_repo_id(model)) ref.source = AdapterSource::kHub;
  return ref;
}

void Api::check_adapter(const AdapterRef& ref, const char* field) {
  if (!options_.adapters)
    throw ValidationError(field, std::string("`") + field + "` names the adapter '" + ref.id +
                                     "', but adapters are not enabled on this server");
  try {
    options_.adapters->resolve(ref.id, ref.source);
  } catch (const Error& e) {
    throw ValidationError(field, std::string("`") + field + "`: " + e.what(), e.kind());
  }
}

std::string Api::adapter_key(const AdapterRef& ref) const {
  if (options_.max_requests_per_adapter <= 0 || !options_.adapters) return "";
  return options_.adapters->canonical_name(ref.id, ref.source);  // checked by check_adapter
}

std::string Api::adapter_key(const Routed::Merged& merged) const {
  if (options_.max_requests_per_adapter <= 0 || !options_.adapters) return "";
  try {
    return options_.adapters->merged_name(merged.spec, merged.source);
  } catch (const ValidationError&) {
    throw;
  } catch (const Error& e) {
    throw ValidationError("merged_adapters.ids", std::string("`merged_adapters.ids`: ") + e.what(),
                          e.kind());
  }
}

void Api::check_runtime_adapters() const {
  if (!options_.adapters)
    throw ValidationError("lora_name", "adapters are not enabled on this server");
  if (options_.api_key.empty() && !options_.runtime_adapters)
    throw Error(
        "loading and unloading adapters at run time needs an API key on this server (--api-key), "
        "or --allow-runtime-adapters on a trusted network",
        ErrorKind::kForbidden);
}

namespace {

std::string required_string(const json& j, const char* field) {
  std::optional<std::string> v = opt_string(j, field);
  if (!v) throw ValidationError(field, std::string("`") + field + "` is required");
  return *v;
}

}  // namespace

Routed Api::load_lora_adapter(const std::string& body) {
  check_runtime_adapters();
  const json j = parse_json_object(body);
  const std::string name = required_string(j, "lora_name");
  const std::string path = required_string(j, "lora_path");
  const bool replace = opt_bool(j, "load_inplace").value_or(false);
  AdapterSource source = AdapterSource::kLocal;
  if (std::optional<std::string> s = opt_string(j, "adapter_source")) {
    try {
      source = parse_adapter_source(*s);
    } catch (const Error& e) {
      throw ValidationError("adapter_source", std::string("`adapter_source`: ") + e.what());
    }
  }
  Routed r;
  AdapterStore* store = options_.adapters;
  r.deferred = [store, name, path, source, replace](std::function<void(Reply)> done) {
    store->load_named(name, path, source, replace,
                      [done, name](std::shared_ptr<const LoraAdapter> ad, const AdapterError* e) {
                        if (!ad) return done(error_reply(e->kind, e->message));
                        Reply ok;
                        ok.content_type = "text/plain; charset=utf-8";
                        ok.body = "Success: LoRA adapter '" + name + "' added successfully.";
                        done(std::move(ok));
                      });
  };
  return r;
}

Reply Api::unload_lora_adapter(const std::string& body) {
  check_runtime_adapters();
  const json j = parse_json_object(body);
  const std::string name = required_string(j, "lora_name");
  if (!options_.adapters->unload(name))
    throw ValidationError("lora_name", "no adapter named '" + name + "' is loaded",
                          ErrorKind::kNotFound);
  Reply ok;
  ok.content_type = "text/plain; charset=utf-8";
  ok.body = "Success: LoRA adapter '" + name + "' removed successfully.";
  return ok;
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
  const int64_t kv_blocks = engine_.stats().kv_blocks_total;
  return json_reply(200,
                    {{"model_id", options_.model_id},
                     {"model_sha", nullptr},
                     {"model_dtype", std::string(dtype_name(model.act_dtype()))},
                     {"quantize", model.quant().fp8 ? json("fp8") : json(nullptr)},
                     {"weight_dtype", std::string(dtype_name(model.linear_weight_dtype()))},
                     {"weight_bytes", model.weight_bytes()},
                     {"kv_cache_dtype", std::string(dtype_name(model.kv_cache_dtype()))},
                     {"kv_cache_tokens", kv_blocks * eo.block_size},
                     {"kv_cache_bytes", kv_blocks * model.kv_bytes_per_block(eo.block_size)},
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
                     {"router", "kestrel"},
                     {"adapters", adapters_json()},
                     {"max_loaded_adapters", max_loaded_adapters()}});
}

json Api::adapters_json() const {
  json out = json::array();
  if (!options_.adapters) return out;
  for (const LoadedAdapterInfo& a : options_.adapters->loaded())
    out.push_back(
        {{"name", a.name}, {"bytes", a.bytes}, {"rank", a.max_rank}, {"in_use", a.in_use}});
  return out;
}

int64_t Api::max_loaded_adapters() const {
  return options_.adapters ? options_.adapters->options().max_loaded : 0;
}

Reply Api::models() const {
  json data = json::array();
  data.push_back(
      {{"id", options_.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "kestrel"}});
  if (options_.adapters) {
    // The loaded adapters, most recently used first, then the registered names not loaded now
    // (evicted, or loading): every id a request may name without knowing the adapters folder.
    std::set<std::string> listed;
    auto add = [&](const std::string& name) {
      if (!listed.insert(name).second) return;
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "kestrel"},
                      {"parent", options_.model_id},
                      {"root", name}});
    };
    for (const LoadedAdapterInfo& a : options_.adapters->loaded()) add(a.name);
    for (const std::string& name : options_.adapters->registered()) add(name);
  }
  return json_reply(200, {{"object", "list"}, {"data", data}});
}

}  // namespace kestrel::server
