// Fuzzes the parse-and-validate path of every HTTP route: Api::route on arbitrary bytes, with the
// e2e fixture's model, tokenizer and engine behind it (route() builds a generation request but
// never runs it). The first byte picks the route; the rest is the body. Checked: route() never
// throws, never answers 5xx to anything a client sends, and every generation it accepts is one
// the engine can take (a prompt within the limits, a known adapter route).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "lora/adapter_store.h"
#include "model/falcon_model.h"
#include "server/routes.h"
#include "text/tokenizer.h"

using namespace kestrel;

namespace {

struct Routes {
  const char* method;
  const char* path;
};
constexpr Routes kRoutes[] = {
    {"POST", "/generate"},
    {"POST", "/generate_stream"},
    {"POST", "/"},
    {"POST", "/v1/completions"},
    {"POST", "/v1/chat/completions"},
    {"POST", "/tokenize"},
    {"GET", "/info"},
    {"GET", "/v1/models"},
    {"GET", "/metrics"},
    {"OPTIONS", "/generate"},
    {"PUT", "/generate"},
    {"GET", "/nope"},
};

struct World {
  std::shared_ptr<const FalconModel> model;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<AdapterStore> store;
  std::unique_ptr<server::Api> api;
  server::ApiOptions options;

  World() {
    const std::string dir = std::string(KESTREL_FUZZ_DATA) + "/e2e-falcon7b-fullvocab";
    model = std::make_shared<const FalconModel>(FalconModel::load(dir));
    tokenizer = std::make_shared<const text::Tokenizer>(text::Tokenizer::from_model_dir(dir));
    EngineOptions eo;
    eo.num_blocks = 64;
    eo.max_input_length = 64;
    eo.max_total_tokens = 128;
    engine = std::make_unique<Engine>(model, tokenizer, eo);
    AdapterStoreOptions so;
    so.adapters_dir = std::string(KESTREL_FUZZ_DATA) + "/lora-e2e-falcon7b-fullvocab/adapters";
    so.hub_cache = "/nonexistent-kestrel-fuzz-hub";
    // The fuzzer never asks the store to load (route() only resolves), so no loader runs.
    store = std::make_unique<AdapterStore>(
        [](const std::string&, const std::string&) -> std::shared_ptr<const LoraAdapter> {
          std::abort();
        },
        so);
    options.adapters = store.get();
    options.limits.max_input_length = 64;
    options.limits.max_total_tokens = 128;
    options.allowed_hosts = {"127.0.0.1", "localhost"};
    options.cors_origins = {"https://app.example"};
    api = std::make_unique<server::Api>(*engine, *tokenizer, server::ChatTemplate(), options);
  }
};

World& world() {
  static World* w = new World();  // never destroyed: the engine thread outlives main's return
  return *w;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  World& w = world();
  const Routes& r = kRoutes[data[0] % std::size(kRoutes)];
  server::RequestHead head;
  head.method = r.method;
  head.target = r.path;
  head.content_type = "application/json";
  if (data[0] & 0x80) head.origin = "https://app.example";
  if (data[0] & 0x40) head.host = "127.0.0.1:8080";
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  server::Routed routed = w.api->route(head, body);  // must not throw
  if (routed.reply) {
    if (routed.reply->status >= 500) {
      std::fprintf(stderr, "5xx for a client's request: %s\n", routed.reply->body.c_str());
      std::abort();
    }
    return 0;
  }
  // An accepted generation: within the limits the engine checks again on submit.
  const auto n = static_cast<int64_t>(routed.request.prompt_ids.size());
  if (n < 1 || n > w.options.limits.max_input_length ||
      n + routed.request.params.max_new_tokens > w.options.limits.max_total_tokens || !routed.job) {
    std::fprintf(stderr, "accepted a request the engine cannot take (%lld prompt tokens)\n",
                 static_cast<long long>(n));
    std::abort();
  }
  for (int32_t id : routed.request.prompt_ids)
    if (id < 0 || id >= w.tokenizer->vocab_size()) std::abort();
  return 0;
}
