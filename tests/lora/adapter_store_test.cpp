// The adapter store (src/lora/adapter_store.*) with a fake loader held by a gate: LRU order,
// leases that block eviction, max_loaded and memory budget refusals, one load for concurrent gets,
// failures isolated and retried, where names resolve and what the confinement refuses (absolute
// paths, '..', symlinks out of --adapters-dir or the hub cache, FIFOs), loads bounded in time,
// preload, shutdown; then the real FalconModel::load_adapter on a fixture.
#include "lora/adapter_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "../model/fixture_util.h"
#include "core/error.h"
#include "model/falcon_model.h"
#include "model/runner.h"
#include "store_fixture.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test::error_of;
using test::Fake;
using test::names;
using test::TmpDir;
using test::Waiter;

TEST(AdapterStore, EvictsLeastRecentlyUsed) {
  TmpDir t;
  Fake fake;
  AdapterStoreOptions o;
  o.max_loaded = 2;
  o.adapters_dir = t.path.string();
  t.make("a"), t.make("b"), t.make("c");
  AdapterStore store(fake.loader(), o);
  store.get_sync("a", AdapterSource::kLocal);
  store.get_sync("b", AdapterSource::kLocal);
  EXPECT_EQ(names(store), (std::vector<std::string>{"b", "a"}));
  store.get_sync("a", AdapterSource::kLocal);  // touch: b is now the least recently used
  EXPECT_EQ(names(store), (std::vector<std::string>{"a", "b"}));
  store.get_sync("c", AdapterSource::kLocal);
  EXPECT_EQ(names(store), (std::vector<std::string>{"c", "a"}));
  EXPECT_FALSE(store.is_loaded("b"));
  EXPECT_TRUE(store.is_loaded("a"));
  store.get_sync("b", AdapterSource::kLocal);  // loaded again, a goes
  EXPECT_EQ(names(store), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(fake.calls_of("a"), 1);
  EXPECT_EQ(fake.calls_of("b"), 2);
  EXPECT_EQ(fake.calls_of("c"), 1);
}

TEST(AdapterStore, NeverEvictsAnAdapterInUseAndRefusesWhenAllAre) {
  TmpDir t;
  Fake fake;
  AdapterStoreOptions o;
  o.max_loaded = 2;
  o.adapters_dir = t.path.string();
  t.make("a"), t.make("b"), t.make("c");
  AdapterStore store(fake.loader(), o);
  auto lease_a = store.get_sync("a", AdapterSource::kLocal);
  store.get_sync("b", AdapterSource::kLocal);
  // a is the least recently used but leased: b goes instead.
  auto lease_c = store.get_sync("c", AdapterSource::kLocal);
  EXPECT_EQ(names(store), (std::vector<std::string>{"c", "a"}));
  const auto info = store.loaded();
  EXPECT_TRUE(info[0].in_use && info[1].in_use);
  // Both leased: b cannot come in.
  const std::string err = error_of([&] { store.get_sync("b", AdapterSource::kLocal); });
  EXPECT_NE(err.find("max_loaded 2"), std::string::npos) << err;
  EXPECT_NE(err.find("in use"), std::string::npos) << err;
  EXPECT_NE(err.find("adapter 'b'"), std::string::npos) << err;
  EXPECT_EQ(names(store), (std::vector<std::string>{"c", "a"}));
  EXPECT_EQ(fake.calls_of("b"), 1);  // refused before reading anything
  lease_c.reset();
  EXPECT_EQ(store.get_sync("b", AdapterSource::kLocal)->name(), "b");
  EXPECT_EQ(names(store), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(lease_a->name(), "a");
}

TEST(AdapterStore, MemoryBudget) {
  TmpDir t;
  Fake fake;
  fake.bytes = {{"a", 1000}, {"b", 1000}, {"c", 1500}, {"huge", 4000}};
  AdapterStoreOptions o;
  o.memory_budget = 2600;
  o.adapters_dir = t.path.string();
  for (const char* n : {"a", "b", "c", "huge"}) t.make(n);
  AdapterStore store(fake.loader(), o);
  store.get_sync("a", AdapterSource::kLocal);
  store.get_sync("b", AdapterSource::kLocal);
  EXPECT_EQ(store.loaded()[0].bytes, 1000);
  store.get_sync("c", AdapterSource::kLocal);  // 3500 > 2600: a (least recently used) goes
  EXPECT_EQ(names(store), (std::vector<std::string>{"c", "b"}));
  std::string err = error_of([&] { store.get_sync("huge", AdapterSource::kLocal); });
  EXPECT_NE(err.find("--adapter-memory"), std::string::npos) << err;
  EXPECT_NE(err.find("more than the whole"), std::string::npos) << err;
  EXPECT_EQ(names(store), (std::vector<std::string>{"c", "b"}));  // nothing evicted for it
  // b and c leased: a (1000) does not fit beside them.
  auto lb = store.get_sync("b", AdapterSource::kLocal);
  auto lc = store.get_sync("c", AdapterSource::kLocal);
  err = error_of([&] { store.get_sync("a", AdapterSource::kLocal); });
  EXPECT_NE(err.find("budget"), std::string::npos) << err;
  EXPECT_NE(err.find("in use"), std::string::npos) << err;
  lc.reset();
  store.get_sync("a", AdapterSource::kLocal);
  EXPECT_EQ(names(store), (std::vector<std::string>{"a", "b"}));
}

TEST(AdapterStore, ConcurrentGetsShareOneLoad) {
  TmpDir t;
  Fake fake;
  AdapterStoreOptions o;
  o.adapters_dir = t.path.string();
  const std::string a = t.make("a");
  AdapterStore store(fake.loader(), o);
  fake.set_open(false);
  std::vector<std::unique_ptr<Waiter>> w;
  for (int i = 0; i < 6; ++i) w.push_back(std::make_unique<Waiter>());
  store.get("a", AdapterSource::kLocal, w[0]->callback());
  fake.wait_started(1);  // the load is in flight; more gets join it
  std::vector<std::thread> threads;
  for (int i = 1; i < 5; ++i)
    threads.emplace_back([&, i] { store.get("a", AdapterSource::kLocal, w[i]->callback()); });
  for (auto& th : threads) th.join();
  // The same folder by another name (a symlink inside the adapters folder) joins too.
  fs::create_directory_symlink(a, t.path / "alias");
  store.get("alias", AdapterSource::kLocal, w[5]->callback());
  EXPECT_FALSE(store.is_loaded("a"));
  fake.set_open(true);
  for (auto& x : w) ASSERT_TRUE(x->wait());
  EXPECT_EQ(fake.calls_of("a"), 1);
  for (auto& x : w) {
    EXPECT_EQ(x->error, "");
    EXPECT_EQ(x->adapter.get(), w[0]->adapter.get());
  }
  EXPECT_EQ(w[0]->adapter->name(), "a");  // the id of the first get
  EXPECT_EQ(store.loaded()[0].folder, a);
}

TEST(AdapterStore, FailedLoadFailsOnlyItsGetsAndIsRetried) {
  TmpDir t;
  Fake fake;
  fake.fail_once = {"bad"};
  AdapterStoreOptions o;
  o.adapters_dir = t.path.string();
  t.make("bad"), t.make("good");
  AdapterStore store(fake.loader(), o);
  fake.set_open(false);
  Waiter b1, b2, g;
  store.get("bad", AdapterSource::kLocal, b1.callback());
  store.get("good", AdapterSource::kLocal, g.callback());
  fake.wait_started(1);
  store.get("bad", AdapterSource::kLocal, b2.callback());
  fake.set_open(true);
  ASSERT_TRUE(b1.wait() && b2.wait() && g.wait());
  EXPECT_EQ(b1.adapter, nullptr);
  // The client's message names the adapter and the rule; the loader's own goes to the detail.
  EXPECT_NE(b1.error.find("adapter 'bad'"), std::string::npos) << b1.error;
  EXPECT_EQ(b1.error.find("is broken"), std::string::npos) << b1.error;
  EXPECT_EQ(b1.error.find(t.path.string()), std::string::npos) << b1.error;
  EXPECT_NE(b1.detail.find("is broken"), std::string::npos) << b1.detail;
  EXPECT_EQ(b1.kind, ErrorKind::kInvalidArgument);
  EXPECT_EQ(b2.error, b1.error);
  EXPECT_EQ(g.error, "");
  ASSERT_NE(g.adapter, nullptr);
  EXPECT_EQ(names(store), (std::vector<std::string>{"good"}));  // the failure is not cached
  EXPECT_EQ(store.get_sync("bad", AdapterSource::kLocal)->name(), "bad");
  EXPECT_EQ(fake.calls_of("bad"), 2);
}

TEST(AdapterStore, CallbackThreads) {
  TmpDir t;
  Fake fake;
  AdapterStoreOptions o;
  o.adapters_dir = t.path.string();
  t.make("a");
  AdapterStore store(fake.loader(), o);
  Waiter first, second, invalid;
  store.get("a", AdapterSource::kLocal, first.callback());
  ASSERT_TRUE(first.wait());
  EXPECT_NE(first.thread, std::this_thread::get_id());  // not loaded yet: a loader thread
  store.get("a", AdapterSource::kLocal, second.callback());
  EXPECT_TRUE(second.done);  // loaded: at once, on the caller's thread
  EXPECT_EQ(second.thread, std::this_thread::get_id());
  EXPECT_EQ(second.adapter, first.adapter);
  store.get("../a", AdapterSource::kLocal, invalid.callback());
  EXPECT_TRUE(invalid.done);
  EXPECT_EQ(invalid.adapter, nullptr);
  EXPECT_NE(invalid.error.find(".."), std::string::npos) << invalid.error;
  EXPECT_EQ(invalid.kind, ErrorKind::kInvalidArgument);
}

TEST(AdapterStore, ResolvesNamesOnlyInsideAdaptersDir) {
  TmpDir t;
  Fake fake;
  AdapterStoreOptions o;
  o.adapters_dir = (t.path / "dir").string();
  const std::string named = t.make("dir/team/a1");
  const std::string elsewhere = t.make("elsewhere/x");
  AdapterStore store(fake.loader(), o);
  EXPECT_EQ(store.resolve("team/a1", AdapterSource::kLocal), named);
  EXPECT_EQ(store.canonical_name("team/a1", AdapterSource::kLocal), "team/a1");
  ErrorKind kind;
  std::string err = error_of([&] { store.resolve("team/missing", AdapterSource::kLocal); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kNotFound);
  EXPECT_NE(err.find("team/missing"), std::string::npos) << err;
  EXPECT_EQ(err.find(t.path.string()), std::string::npos) << err;  // no server path in it
  // Absolute paths, '..', '.', empty parts: refused before anything is looked at.
  for (const std::string& bad :
       {elsewhere, named, std::string("../elsewhere/x"), std::string("team/../../elsewhere/x"),
        std::string("team//a1"), std::string("./team/a1"), std::string("/team/a1"),
        std::string("team\\a1"), std::string("a\nb"), std::string(300, 'a')}) {
    err = error_of([&] { store.resolve(bad, AdapterSource::kLocal); }, &kind);
    EXPECT_EQ(kind, ErrorKind::kInvalidArgument) << bad << ": " << err;
    if (bad.find(t.path.string()) == std::string::npos) {  // the message echoes the id, no more
      EXPECT_EQ(err.find(t.path.string()), std::string::npos) << err;
    }
  }
  err = error_of([&] { store.resolve("", AdapterSource::kLocal); });
  EXPECT_NE(err.find("empty"), std::string::npos) << err;
  // A symlink inside the folder to a folder outside it is refused; one to a sibling inside it is
  // the sibling, under the sibling's canonical name.
  fs::create_directory_symlink(t.path / "elsewhere/x", t.path / "dir/escape");
  fs::create_directory_symlink(t.path / "dir/team/a1", t.path / "dir/alias");
  err = error_of([&] { store.resolve("escape", AdapterSource::kLocal); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(err.find("outside the adapters folder"), std::string::npos) << err;
  EXPECT_EQ(store.resolve("alias", AdapterSource::kLocal), named);
  EXPECT_EQ(store.canonical_name("alias", AdapterSource::kLocal), "team/a1");
  EXPECT_EQ(store.get_sync("alias", AdapterSource::kLocal)->name(), "team/a1");
  EXPECT_EQ(store.get_sync("team/a1", AdapterSource::kLocal)->name(), "team/a1");
  EXPECT_EQ(fake.calls_of("a1"), 1);  // two spellings, one adapter
  EXPECT_EQ(names(store), (std::vector<std::string>{"team/a1"}));
  // Without --adapters-dir there is no local loading beyond preloaded names.
  AdapterStore plain(fake.loader(), {});
  err = error_of([&] { plain.resolve("team/a1", AdapterSource::kLocal); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kNotFound);
  EXPECT_NE(err.find("no --adapters-dir"), std::string::npos) << err;
  err = error_of([&] { plain.resolve(named, AdapterSource::kLocal); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
  // --allow-adapter-paths: an absolute folder is an id, named by its canonical path.
  AdapterStoreOptions po;
  po.allow_paths = true;
  AdapterStore paths(fake.loader(), po);
  EXPECT_EQ(paths.resolve(elsewhere, AdapterSource::kLocal), elsewhere);
  EXPECT_EQ(paths.resolve((t.path / "elsewhere/../elsewhere/x").string(), AdapterSource::kLocal),
            elsewhere);
  EXPECT_EQ(paths.canonical_name(elsewhere, AdapterSource::kLocal), elsewhere);
  err = error_of([&] { paths.resolve((t.path / "nope").string(), AdapterSource::kLocal); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kNotFound);
}

// The files of an adapter found by name must stay inside the adapters folder and be plain files:
// a symlinked weight file leading out, or a FIFO that would block the reader, fail the load.
TEST(AdapterStore, RefusesFilesLeavingTheFolderAndFifos) {
  TmpDir t;
  Fake fake;
  AdapterStoreOptions o;
  o.adapters_dir = (t.path / "dir").string();
  o.load_timeout = 5s;
  const std::string leak = t.make("dir/leak"), fifo = t.make("dir/fifo"), ok = t.make("dir/ok");
  std::ofstream(t.path / "secret") << "not for clients";
  fs::create_symlink(t.path / "secret", fs::path(leak) / "adapter_model.safetensors");
  ASSERT_EQ(mkfifo((fs::path(fifo) / "adapter_model.safetensors").c_str(), 0600), 0);
  std::ofstream(fs::path(ok) / "adapter_config.json") << "{}";
  AdapterStore store(fake.loader(), o);
  ErrorKind kind;
  std::string err = error_of([&] { store.get_sync("leak", AdapterSource::kLocal); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(err.find("outside"), std::string::npos) << err;  // the detail, for the CLI and log
  const auto t0 = std::chrono::steady_clock::now();
  err = error_of([&] { store.get_sync("fifo", AdapterSource::kLocal); }, &kind);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);  // refused, not read
  EXPECT_NE(err.find("not a regular file"), std::string::npos) << err;
  EXPECT_EQ(fake.calls_of("leak") + fake.calls_of("fifo"), 0);  // the loader never ran
  EXPECT_EQ(store.get_sync("ok", AdapterSource::kLocal)->name(), "ok");
  // A preload is the operator's own choice: its files are not confined (but still plain).
  store.preload("mine", leak);
  EXPECT_TRUE(store.is_loaded("mine"));
}

// A load that hangs fails its gets after load_timeout with kUnavailable, while other loads go on.
TEST(AdapterStore, HangingLoadTimesOutAndOthersProceed) {
  TmpDir t;
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> finished{0};
  AdapterStoreOptions o;
  o.adapters_dir = t.path.string();
  o.load_timeout = 300ms;
  o.load_threads = 2;
  t.make("slow"), t.make("fast");
  auto store = std::make_unique<AdapterStore>(
      [&](const std::string& dir, const std::string& name) {
        if (fs::path(dir).filename() == "slow") {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return release; });
        }
        ++finished;
        return std::shared_ptr<const LoraAdapter>(std::make_shared<LoraAdapter>(name, dir, 1, 1));
      },
      o);
  Waiter slow, fast;
  store->get("slow", AdapterSource::kLocal, slow.callback());
  store->get("fast", AdapterSource::kLocal, fast.callback());
  ASSERT_TRUE(fast.wait(2s));  // not behind the hanging one
  EXPECT_EQ(fast.error, "");
  ASSERT_TRUE(slow.wait(5s));
  EXPECT_EQ(slow.adapter, nullptr);
  EXPECT_EQ(slow.kind, ErrorKind::kUnavailable);
  EXPECT_NE(slow.error.find("did not load within 0.3 s"), std::string::npos) << slow.error;
  EXPECT_FALSE(store->is_loaded("slow"));
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  // The late result is dropped; a new get loads it again.
  while (finished.load() < 2) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(store->get_sync("slow", AdapterSource::kLocal)->name(), "slow");
  store.reset();
}

TEST(AdapterStore, ResolvesTheOfflineHubCache) {
  TmpDir t;
  Fake fake;
  AdapterStoreOptions o;
  o.hub_cache = t.path.string();
  // refs/main names the snapshot among two.
  const std::string rev = t.make("models--org--lora-one/snapshots/abc123");
  t.make("models--org--lora-one/snapshots/old999");
  fs::create_directories(t.path / "models--org--lora-one/refs");
  std::ofstream(t.path / "models--org--lora-one/refs/main") << "abc123\n";
  // No refs/main, one snapshot.
  const std::string only = t.make("models--org--two/snapshots/fff");
  // No refs/main, two snapshots.
  t.make("models--org--three/snapshots/x"), t.make("models--org--three/snapshots/y");
  AdapterStore store(fake.loader(), o);
  EXPECT_EQ(store.resolve("org/lora-one", AdapterSource::kHub), rev);
  EXPECT_EQ(store.resolve("org/two", AdapterSource::kHub), only);
  std::string err = error_of([&] { store.resolve("org/three", AdapterSource::kHub); });
  EXPECT_NE(err.find("2 snapshots"), std::string::npos) << err;
  ErrorKind kind;
  err = error_of([&] { store.resolve("org/absent", AdapterSource::kHub); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kNotFound);
  EXPECT_EQ(err.find(t.path.string()), std::string::npos) << err;
  EXPECT_NE(err.find("never downloads"), std::string::npos) << err;
  // A snapshot that is a symlink out of the cache is refused.
  TmpDir outside;
  const std::string out = outside.make("snap");
  fs::create_directories(t.path / "models--org--escape/snapshots");
  fs::create_directory_symlink(out, t.path / "models--org--escape/snapshots/s1");
  err = error_of([&] { store.resolve("org/escape", AdapterSource::kHub); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(err.find("outside the Hugging Face cache"), std::string::npos) << err;
  for (const char* bad : {"org/../x", "a/b/c", "", "/org/x"})
    EXPECT_NE(error_of([&] { store.resolve(bad, AdapterSource::kHub); }), "(no error)") << bad;
  // A hub get loads the snapshot under the id.
  EXPECT_EQ(store.get_sync("org/lora-one", AdapterSource::kHub)->source(), rev);
  EXPECT_EQ(names(store), (std::vector<std::string>{"org/lora-one"}));
  EXPECT_EQ(parse_adapter_source("hub"), AdapterSource::kHub);
  EXPECT_EQ(parse_adapter_source("local"), AdapterSource::kLocal);
  err = error_of([] { parse_adapter_source("s3"); });
  EXPECT_NE(err.find("'s3'"), std::string::npos) << err;
}

TEST(AdapterStore, HubCacheDefaultsFromTheEnvironment) {
  Fake fake;
  const char* saved_cache = std::getenv("HF_HUB_CACHE");
  const char* saved_home = std::getenv("HF_HOME");
  const std::string keep_cache = saved_cache ? saved_cache : "",
                    keep_home = saved_home ? saved_home : "";
  setenv("HF_HUB_CACHE", "/x/cache", 1);
  setenv("HF_HOME", "/x/home", 1);
  EXPECT_EQ(AdapterStore(fake.loader(), {}).options().hub_cache, "/x/cache");
  unsetenv("HF_HUB_CACHE");
  EXPECT_EQ(AdapterStore(fake.loader(), {}).options().hub_cache, "/x/home/hub");
  unsetenv("HF_HOME");
  const std::string home = std::getenv("HOME") ? std::getenv("HOME") : ".";
  EXPECT_EQ(AdapterStore(fake.loader(), {}).options().hub_cache,
            (fs::path(home) / ".cache/huggingface/hub").string());
  AdapterStoreOptions o;
  o.hub_cache = "/given";
  EXPECT_EQ(AdapterStore(fake.loader(), o).options().hub_cache, "/given");
  if (saved_cache) setenv("HF_HUB_CACHE", keep_cache.c_str(), 1);
  if (saved_home) setenv("HF_HOME", keep_home.c_str(), 1);
}

TEST(AdapterStore, PreloadOnTheCallersThreadUnderItsName) {
  TmpDir t;
  Fake fake;
  fake.fail_once = {"broken"};
  const std::string dir = t.make("some/folder"), broken = t.make("broken");
  AdapterStore store(fake.loader(), {});
  store.preload("mine", dir);
  EXPECT_EQ(fake.threads.at(0), std::this_thread::get_id());
  EXPECT_TRUE(store.is_loaded("mine"));
  EXPECT_EQ(store.resolve("mine", AdapterSource::kLocal), dir);
  const auto ad = store.get_sync("mine", AdapterSource::kLocal);
  EXPECT_EQ(ad->name(), "mine");
  // Its folder by path is refused like any path (the name is how requests reach it).
  ErrorKind kind;
  error_of([&] { store.get_sync(dir, AdapterSource::kLocal); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
  EXPECT_EQ(fake.calls_of("folder"), 1);
  const auto info = store.loaded();
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].folder, dir);
  EXPECT_EQ(info[0].bytes, 400);
  EXPECT_EQ(info[0].max_rank, 1);
  std::string err = error_of([&] { store.preload("gone", (t.path / "nope").string()); });
  EXPECT_NE(err.find("'gone'"), std::string::npos) << err;
  EXPECT_NE(err.find("nope"), std::string::npos) << err;
  err = error_of([&] { store.preload("broken", broken); });
  EXPECT_NE(err.find("is broken"), std::string::npos) << err;
  EXPECT_FALSE(store.is_loaded("broken"));
  err = error_of([&] { store.preload("mine", broken); });
  EXPECT_NE(err.find("given twice"), std::string::npos) << err;
}

TEST(AdapterStore, ShutdownFailsQueuedGetsAndFinishesTheLoadInFlight) {
  TmpDir t;
  Fake fake;
  AdapterStoreOptions o;
  o.adapters_dir = t.path.string();
  o.load_threads = 1;  // b waits in the queue behind a
  t.make("a"), t.make("b");
  auto store = std::make_unique<AdapterStore>(fake.loader(), o);
  fake.set_open(false);
  Waiter a, b;
  store->get("a", AdapterSource::kLocal, a.callback());
  fake.wait_started(1);
  store->get("b", AdapterSource::kLocal, b.callback());
  std::thread closer([&] { store.reset(); });
  ASSERT_TRUE(b.wait());
  EXPECT_EQ(b.error, "server shutting down");
  EXPECT_FALSE(a.done);
  fake.set_open(true);
  closer.join();
  ASSERT_TRUE(a.done);
  EXPECT_EQ(a.error, "");
  EXPECT_EQ(a.adapter->name(), "a");
  EXPECT_EQ(fake.calls_of("b"), 0);
}

// The real loader: FalconModel::load_adapter through the store, then the fixture's logits.
TEST(AdapterStore, LoadsFixtureAdaptersWithFalconModel) {
  const FalconModel model = FalconModel::load(test::fixture_dir("falcon40b-gqa"));
  AdapterStoreOptions o;
  o.adapters_dir = test::fixture_dir("lora-falcon40b-gqa/adapters");
  o.max_loaded = 2;
  AdapterStore store([&](const std::string& dir,
                         const std::string& name) { return model.load_adapter(dir, name); },
                     o);
  const auto a1 = store.get_sync("a1-r8-attn", AdapterSource::kLocal);
  const auto direct = model.load_adapter(o.adapters_dir + "/a1-r8-attn", "a1-r8-attn");
  EXPECT_EQ(a1->name(), "a1-r8-attn");
  EXPECT_EQ(a1->max_rank(), 8);
  EXPECT_EQ(a1->bytes(), direct->bytes());
  EXPECT_GT(a1->bytes(), 0);
  EXPECT_EQ(store.loaded()[0].bytes, a1->bytes());
  const test::Expected base("falcon40b-gqa"), lora("lora-falcon40b-gqa");
  RunnerOptions ro;
  ro.adapters.assign(base.prompts.size(), a1.get());
  BatchRunner runner(model, base.prompts, 0, ro);
  const Tensor logits = runner.prefill(true);
  EXPECT_LE(test::rel_error(logits.data<float>(), lora.f32("a1-r8-attn.logits"),
                            static_cast<size_t>(logits.numel())),
            1e-4);
  // A folder that is no adapter (the base model's) fails with the loader's reason (the CLI's
  // get_sync carries the detail; a client gets the rule only).
  AdapterStoreOptions po = o;
  po.allow_paths = true;
  AdapterStore paths([&](const std::string& dir,
                         const std::string& name) { return model.load_adapter(dir, name); },
                     po);
  const std::string err =
      error_of([&] { paths.get_sync(test::fixture_dir("falcon40b-gqa"), AdapterSource::kLocal); });
  EXPECT_NE(err.find("adapter_config.json"), std::string::npos) << err;
}

}  // namespace
}  // namespace kestrel
