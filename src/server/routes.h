// The routes: request -> either an immediate reply or a generation job that
// turns engine events into a dialect's output (TGI JSON or SSE, OpenAI JSON or
// SSE). Knows nothing of sockets: the session (http_server.cpp) does the I/O.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "server/chat_template.h"
#include "server/generate_request.h"
#include "server/metrics.h"

namespace kestrel {
class AdapterStore;
}
namespace kestrel::text {
class Tokenizer;
}

namespace kestrel::server {

struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

Reply json_reply(int status, const json& body);
// {"error": message, "error_type": ...} with the status of `kind` (http_error.h).
Reply error_reply(ErrorKind kind, const std::string& message);

// How a job writes its output; implemented by the session, called on its strand.
class ResponseChannel {
 public:
  virtual ~ResponseChannel() = default;
  virtual void reply(Reply r) = 0;  // a whole response
  virtual void begin_stream(const std::string& content_type) = 0;
  virtual void stream(std::string bytes) = 0;
  virtual void end_stream() = 0;
};

// One generation's output in one dialect. Events arrive in the engine's order.
class GenerationJob {
 public:
  virtual ~GenerationJob() = default;
  virtual void start(ResponseChannel& out) {}
  virtual void on_token(const TokenInfo& token, ResponseChannel& out) = 0;
  virtual void on_finished(const GenerationResult& result, ResponseChannel& out) = 0;
  virtual void on_error(ErrorKind kind, const std::string& message, ResponseChannel& out) = 0;
};

// What the router reads of a request beside its body (headers absent: "").
struct RequestHead {
  std::string method, target;
  std::string authorization, content_type, host, origin;
  std::string accept;                         // GET / with text/html here is the playground page
  std::string access_control_request_method;  // set on a CORS preflight
};

struct Routed {
  std::optional<Reply> reply;  // set: answer this; else submit `request` and drive `job`
  // Headers every response to this request carries (CORS), the reply's and a stream's alike.
  std::vector<std::pair<std::string, std::string>> headers;
  GenerationRequest request;
  std::unique_ptr<GenerationJob> job;
  // Set: the session gets this adapter from ApiOptions::adapters (loaded off its thread) into
  // request.adapter before it submits.
  std::optional<AdapterRef> adapter;
  // Set: the session gets the merge of these adapters (AdapterStore::get_merged) instead.
  struct Merged {
    MergeSpec spec;
    AdapterSource source = AdapterSource::kLocal;
  };
  std::optional<Merged> merged;
  // Set with --max-requests-per-adapter: the name the request's adapter (or merge) loads under,
  // the key of the per-adapter cap.
  std::string adapter_key;
  // Set: the answer comes later, from another thread (an adapter loaded at run time): the session
  // calls this with a function that delivers the reply on its strand.
  std::function<void(std::function<void(Reply)>)> deferred;
};

struct ApiOptions {
  std::string model_id = "kestrel";
  // The model folder's name: like model_id (and ""), OpenAI's `model` set to it means the base.
  std::string base_model_name;
  std::string api_key;  // empty: no auth
  // Host header names (lowercase, no port) accepted: the guard against DNS rebinding. "*"
  // accepts any; allow_ip_hosts accepts any IP literal (a server bound to every address).
  // A request without a Host header (HTTP/1.0) passes.
  std::vector<std::string> allowed_hosts = {"*"};
  bool allow_ip_hosts = false;
  // Origins a browser page may call from (CORS); "*" any; empty: none (no CORS headers).
  std::vector<std::string> cors_origins;
  int64_t max_concurrent_requests = 512;
  size_t max_body_bytes = 2 << 20;
  RequestLimits limits;
  // LoRA adapters (adapter_id, OpenAI `model`); null: adapters are refused with a 422.
  AdapterStore* adapters = nullptr;
  // Generation requests one adapter (or merge) may have in flight before 429; 0: no cap.
  int64_t max_requests_per_adapter = 0;
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter: allowed behind an API key, or
  // without one when this is set (--allow-runtime-adapters: a trusted network only).
  bool runtime_adapters = false;
};

class Api {
 public:
  Api(Engine& engine, const text::Tokenizer& tokenizer, ChatTemplate chat_template,
      ApiOptions options);

  // Never throws: client mistakes become 4xx replies, anything else a 500.
  Routed route(const RequestHead& head, const std::string& body);
  // A JSON request (Content-Type: application/json, no Host or Origin): tests and the fuzzer.
  Routed route(const std::string& method, const std::string& target, const std::string& body,
               const std::string& authorization);

  Engine& engine() { return engine_; }
  Metrics& metrics() { return metrics_; }
  const ApiOptions& options() const { return options_; }

  // The --max-concurrent-requests gate around a generation.
  bool try_acquire();
  void release();
  int64_t in_flight() const { return in_flight_.load(); }
  // The --max-requests-per-adapter gate, by Routed::adapter_key.
  bool try_acquire_adapter(const std::string& key);
  void release_adapter(const std::string& key);
  // While draining, new generations get 503.
  void set_draining() { draining_ = true; }
  bool draining() const { return draining_.load(); }

 private:
  Routed dispatch(const std::string& method, const std::string& path, const std::string& body);
  // Host, API key, Content-Type and CORS, before any route: throws Error of the kind to answer.
  void check_head(const RequestHead& head, const std::string& path) const;
  // The CORS headers for `origin` (none when it is not allowed or absent).
  std::vector<std::pair<std::string, std::string>> cors_headers(const std::string& origin) const;
  Reply preflight(const RequestHead& head, const std::string& path) const;
  Reply playground(const RequestHead& head) const;
  Routed generate(const std::string& body, bool stream_default, bool from_root);
  Routed completions(const std::string& body);
  Routed chat(const std::string& body);
  Reply tokenize(const std::string& body);
  // vLLM's run-time adapter routes (docs/server.md).
  Routed load_lora_adapter(const std::string& body);
  Reply unload_lora_adapter(const std::string& body);
  void check_runtime_adapters() const;
  Reply info() const;
  Reply models() const;
  json adapters_json() const;  // /info's "adapters": the loaded ones
  int64_t max_loaded_adapters() const;
  // OpenAI's `model`: the base model (nullopt) or an adapter id (docs/server.md).
  std::optional<AdapterRef> adapter_for_model(const std::string& model) const;
  // A 422 when adapters are off, a 404 when `ref` names no folder (checked here, before the
  // request waits for a load).
  void check_adapter(const AdapterRef& ref, const char* field);
  // Routed::adapter_key of a request under `ref` / `merged` when the cap is on ("" otherwise).
  std::string adapter_key(const AdapterRef& ref) const;
  std::string adapter_key(const Routed::Merged& merged) const;

  Engine& engine_;
  const text::Tokenizer& tokenizer_;
  ChatTemplate chat_template_;
  ApiOptions options_;
  Metrics metrics_;
  std::atomic<int64_t> in_flight_{0};
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{1};
  std::mutex adapter_mu_;
  std::map<std::string, int64_t> adapter_in_flight_;  // only adapters with requests in flight
};

// The OpenAPI document served at /docs (docs/openapi.json, embedded at build time).
const std::string& openapi_json();
// The browser playground served at GET /playground and at GET / for a browser
// (src/server/playground.html, embedded at build time).
const std::string& playground_html();

}  // namespace kestrel::server
