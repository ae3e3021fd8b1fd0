// Api::route with LoRA adapters, without sockets: adapter_id and OpenAI's `model` into
// Routed::adapter (the base names, local folders, --adapters-dir names, the hub fallback), the
// 404 / 422 answered before any wait, /v1/models and /info listing loaded adapters. A real
// AdapterStore over FalconModel::load_adapter on the lora-e2e fixture.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "../test_data.h"
#include "engine/engine.h"
#include "lora/adapter_store.h"
#include "model/falcon_model.h"
#include "server/routes.h"
#include "text/tokenizer.h"

namespace kestrel::server {
namespace {

namespace fs = std::filesystem;

std::string data(const std::string& path) {
  return test::test_data_dir() + "/" + path;
}

const std::string kBase = data("e2e-falcon7b-fullvocab");
const std::string kAdapter = data("lora-e2e-falcon7b-fullvocab/adapters/e1-r8-all");

class ApiAdapters : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new std::shared_ptr<const FalconModel>(
        std::make_shared<const FalconModel>(FalconModel::load(kBase)));
    tokenizer_ = new std::shared_ptr<const text::Tokenizer>(
        std::make_shared<const text::Tokenizer>(text::Tokenizer::from_model_dir(kBase)));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tokenizer_;
  }

  void TearDown() override {
    api_.reset();
    store_.reset();
    engine_.reset();
    fs::remove_all(root_);
  }

  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("kestrel_api_adapters_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "adir");
    fs::copy(kAdapter, root_ / "adir" / "named", fs::copy_options::recursive);
    const fs::path repo = root_ / "hub" / "models--org--e1";
    fs::create_directories(repo / "refs");
    fs::create_directories(repo / "snapshots");
    fs::copy(kAdapter, repo / "snapshots" / "abc", fs::copy_options::recursive);
    std::ofstream(repo / "refs" / "main") << "abc";

    engine_ = std::make_unique<Engine>(*model_, *tokenizer_, EngineOptions{});
    AdapterStoreOptions so;
    so.max_loaded = 4;
    so.adapters_dir = (root_ / "adir").string();
    so.hub_cache = (root_ / "hub").string();
    auto model = *model_;
    store_ = std::make_unique<AdapterStore>(
        [model](const std::string& dir, const std::string& name) {
          return model->load_adapter(dir, name);
        },
        so);
    api_ = make_api(store_.get());
  }

  // A store like store_ that also takes absolute folder paths (--allow-adapter-paths).
  std::unique_ptr<AdapterStore> make_path_store() {
    AdapterStoreOptions so;
    so.adapters_dir = (root_ / "adir").string();
    so.hub_cache = (root_ / "hub").string();
    so.allow_paths = true;
    auto model = *model_;
    return std::make_unique<AdapterStore>(
        [model](const std::string& dir, const std::string& name) {
          return model->load_adapter(dir, name);
        },
        so);
  }

  std::unique_ptr<Api> make_api(AdapterStore* store) {
    ApiOptions ao;
    ao.model_id = "my-falcon";
    ao.base_model_name = "e2e-falcon7b-fullvocab";
    ao.adapters = store;
    return std::make_unique<Api>(*engine_, **tokenizer_, ChatTemplate(), ao);
  }

  Routed completion(Api& api, const std::string& model) {
    const json body = {{"model", model}, {"prompt", "The falcon"}, {"max_tokens", 2}};
    return api.route("POST", "/v1/completions", body.dump(), "");
  }
  Routed generate(Api& api, const json& parameters) {
    const json body = {{"inputs", "The falcon"}, {"parameters", parameters}};
    return api.route("POST", "/generate", body.dump(), "");
  }

  static std::shared_ptr<const FalconModel>* model_;
  static std::shared_ptr<const text::Tokenizer>* tokenizer_;
  fs::path root_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<AdapterStore> store_;
  std::unique_ptr<Api> api_;
};

std::shared_ptr<const FalconModel>* ApiAdapters::model_ = nullptr;
std::shared_ptr<const text::Tokenizer>* ApiAdapters::tokenizer_ = nullptr;

// The error body of a reply: its status, error_type and message.
void expect_error(const Routed& r, int status, const std::string& type, const std::string& needle) {
  ASSERT_TRUE(r.reply) << "expected a " << status;
  EXPECT_EQ(r.reply->status, status) << r.reply->body;
  const json body = json::parse(r.reply->body);
  EXPECT_EQ(body["error_type"], type) << r.reply->body;
  EXPECT_NE(body["error"].get<std::string>().find(needle), std::string::npos) << r.reply->body;
}

TEST_F(ApiAdapters, OpenAiModelRule) {
  for (const char* base : {"", "my-falcon", "e2e-falcon7b-fullvocab"}) {
    Routed r = completion(*api_, base);
    EXPECT_FALSE(r.reply) << base << ": " << (r.reply ? r.reply->body : "");
    EXPECT_FALSE(r.adapter) << base;
  }
  // A folder path: refused unless the server allows paths.
  expect_error(completion(*api_, kAdapter), 422, "validation", "absolute paths are not accepted");
  auto path_store = make_path_store();
  auto path_api = make_api(path_store.get());
  Routed r = completion(*path_api, kAdapter);
  ASSERT_TRUE(r.adapter);
  EXPECT_EQ(r.adapter->id, kAdapter);
  EXPECT_EQ(r.adapter->source, AdapterSource::kLocal);
  r = completion(*api_, "named");  // under --adapters-dir
  ASSERT_TRUE(r.adapter);
  EXPECT_EQ(r.adapter->source, AdapterSource::kLocal);
  r = completion(*api_, "org/e1");  // no such local folder, ORG/NAME: the hub cache
  ASSERT_TRUE(r.adapter);
  EXPECT_EQ(r.adapter->id, "org/e1");
  EXPECT_EQ(r.adapter->source, AdapterSource::kHub);
  // Chat takes it the same way.
  const json chat = {{"model", "named"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  r = api_->route("POST", "/v1/chat/completions", chat.dump(), "");
  ASSERT_TRUE(r.adapter);
  EXPECT_EQ(r.adapter->id, "named");

  expect_error(completion(*api_, "nope"), 404, "not_found", "nope");
  expect_error(completion(*api_, "org/absent"), 404, "not_found", "org/absent");
}

TEST_F(ApiAdapters, AdapterIdOnTheLoraxRoutes) {
  Routed r = generate(*api_, {{"adapter_id", "named"}});
  ASSERT_FALSE(r.reply) << r.reply->body;
  ASSERT_TRUE(r.adapter);
  EXPECT_EQ(r.adapter->id, "named");
  EXPECT_FALSE(r.request.adapter);  // set by the session once the store has it
  r = generate(*api_, {{"adapter_id", "org/e1"}, {"adapter_source", "hub"}});
  ASSERT_TRUE(r.adapter);
  EXPECT_EQ(r.adapter->source, AdapterSource::kHub);
  r = generate(*api_, {{"adapter_id", ""}});
  EXPECT_FALSE(r.reply);
  EXPECT_FALSE(r.adapter);

  // Outside the adapters folder: refused before the file system is asked, and no path comes back.
  for (const std::string& id :
       {kAdapter, (root_ / "missing").string(), std::string("../adir/named"),
        std::string("named/../../adir/named")}) {
    Routed bad = generate(*api_, {{"adapter_id", id}});
    expect_error(bad, 422, "validation", "adapter_id");
    if (id.find(root_.string()) == std::string::npos) {  // the message echoes the id, no more
      EXPECT_EQ(bad.reply->body.find(root_.string()), std::string::npos) << bad.reply->body;
    }
  }
  expect_error(generate(*api_, {{"adapter_id", "missing"}}), 404, "not_found", "missing");
  // The hub source never looks at local folders, and the local source not at the hub cache.
  expect_error(generate(*api_, {{"adapter_id", "named"}, {"adapter_source", "hub"}}), 404,
               "not_found", "named");
  expect_error(generate(*api_, {{"adapter_id", "org/e1"}}), 404, "not_found", "org/e1");
  expect_error(generate(*api_, {{"adapter_id", "a"}, {"adapter_source", "s3"}}), 422, "validation",
               "'s3'");
  // Before any request failed that way, nothing was counted; now both kinds are.
  const std::string metrics = api_->metrics().render(engine_->stats());
  EXPECT_NE(metrics.find("lorax_request_failure{err=\"adapter\"} 7\n"), std::string::npos)
      << metrics;
}

TEST_F(ApiAdapters, WithoutAStoreAdaptersAre422) {
  auto api = make_api(nullptr);
  expect_error(generate(*api, {{"adapter_id", kAdapter}}), 422, "validation", "not enabled");
  expect_error(completion(*api, "other"), 422, "validation", "not enabled");
  EXPECT_FALSE(completion(*api, "my-falcon").reply);
  const json info = json::parse(api->route("GET", "/info", "", "").reply->body);
  EXPECT_EQ(info["adapters"], json::array());
  EXPECT_EQ(info["max_loaded_adapters"], 0);
}

TEST_F(ApiAdapters, ModelsAndInfoListLoadedAdapters) {
  json models = json::parse(api_->route("GET", "/v1/models", "", "").reply->body);
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], "my-falcon");

  auto lease = store_->get_sync("named", AdapterSource::kLocal);
  models = json::parse(api_->route("GET", "/v1/models", "", "").reply->body);
  ASSERT_EQ(models["data"].size(), 2u);
  const json& a = models["data"][1];
  EXPECT_EQ(a["id"], "named");
  EXPECT_EQ(a["object"], "model");
  EXPECT_EQ(a["parent"], "my-falcon");
  EXPECT_EQ(a["owned_by"], "kestrel");

  const json info = json::parse(api_->route("GET", "/info", "", "").reply->body);
  EXPECT_EQ(info["max_loaded_adapters"], 4);
  ASSERT_EQ(info["adapters"].size(), 1u);
  const json& i = info["adapters"][0];
  EXPECT_EQ(i["name"], "named");
  EXPECT_FALSE(i.contains("folder"));  // no server path reaches a client
  EXPECT_EQ(i["rank"], 8);
  EXPECT_GT(i["bytes"].get<int64_t>(), 0);
  EXPECT_TRUE(i["in_use"].get<bool>());  // `lease` holds it
}

}  // namespace
}  // namespace kestrel::server
