// Loading and unloading adapters at run time (AdapterStore::load_named / unload, behind
// POST /v1/load_lora_adapter and /v1/unload_lora_adapter): a name registered for a folder under
// the confinement rules, conflicts, replacement, failed loads leaving no name behind, unload
// with requests still holding the adapter (its bytes counted until they end), reload.
#include <gtest/gtest.h>

#include "lora/adapter_store.h"
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

// load_named, waited for: the adapter, or null with the error's kind and message.
struct Loaded {
  std::shared_ptr<const LoraAdapter> adapter;
  ErrorKind kind = ErrorKind::kInternal;
  std::string error;
};
Loaded load(AdapterStore& store, const std::string& name, const std::string& path,
            bool replace = false) {
  Waiter w;
  store.load_named(name, path, AdapterSource::kLocal, replace, w.callback());
  EXPECT_TRUE(w.wait());
  return {w.adapter, w.kind, w.error};
}

TEST(AdapterAdmin, LoadsUnderItsNameInsideTheAdaptersDir) {
  TmpDir t;
  Fake fake;
  AdapterStoreOptions o;
  o.adapters_dir = t.path.string();
  t.make("team/sql");
  AdapterStore store(fake.loader(), o);
  const Loaded l = load(store, "sql-v1", "team/sql");
  ASSERT_TRUE(l.adapter) << l.error;
  EXPECT_EQ(l.adapter->name(), "sql-v1");
  EXPECT_EQ(names(store), (std::vector<std::string>{"sql-v1"}));
  EXPECT_TRUE(store.is_loaded("sql-v1"));
  // Requests name it now; no second read.
  EXPECT_EQ(store.get_sync("sql-v1", AdapterSource::kLocal)->name(), "sql-v1");
  EXPECT_EQ(store.canonical_name("sql-v1", AdapterSource::kLocal), "sql-v1");
  EXPECT_EQ(fake.calls_of("sql"), 1);
}

TEST(AdapterAdmin, RefusesWhatTheRulesRefuse) {
  TmpDir t, outside;
  Fake fake;
  AdapterStoreOptions o;
  o.adapters_dir = t.path.string();
  outside.make("x");
  fs::create_directory_symlink(outside.path / "x", t.path / "link");
  AdapterStore store(fake.loader(), o);
  Loaded l = load(store, "a", outside.path.string() + "/x");  // absolute: not allowed here
  EXPECT_EQ(l.kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(l.error.find("lora_path"), std::string::npos) << l.error;
  l = load(store, "a", "../x");
  EXPECT_EQ(l.kind, ErrorKind::kInvalidArgument);
  l = load(store, "a", "link");  // a symlink leaving the folder
  EXPECT_EQ(l.kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(l.error.find("outside"), std::string::npos) << l.error;
  EXPECT_EQ(l.error.find(outside.path.string()), std::string::npos)
      << "where it leads: " << l.error;
  l = load(store, "a", "missing");
  EXPECT_EQ(l.kind, ErrorKind::kNotFound);
  for (const std::string& bad :
       std::vector<std::string>{"", "/abs", "merge:0123", "a\nb", std::string(300, 'n')}) {
    t.make("ok");
    l = load(store, bad, "ok");
    EXPECT_EQ(l.kind, ErrorKind::kInvalidArgument) << bad;
    EXPECT_NE(l.error.find("lora_name"), std::string::npos) << l.error;
  }
  EXPECT_TRUE(names(store).empty());
  EXPECT_EQ(fake.calls_of("x"), 0);
  // Nothing registered: the name answers nothing.
  EXPECT_THROW(store.resolve("a", AdapterSource::kLocal), Error);
}

TEST(AdapterAdmin, ConflictUnlessReplaced) {
  TmpDir t;
  Fake fake;
  AdapterStoreOptions o;
  o.adapters_dir = t.path.string();
  t.make("v1"), t.make("v2");
  AdapterStore store(fake.loader(), o);
  ASSERT_TRUE(load(store, "prod", "v1").adapter);
  const Loaded again = load(store, "prod", "v2");
  EXPECT_FALSE(again.adapter);
  EXPECT_EQ(again.kind, ErrorKind::kConflict);
  EXPECT_NE(again.error.find("already loaded"), std::string::npos) << again.error;
  EXPECT_EQ(store.resolve("prod", AdapterSource::kLocal), t.path.string() + "/v1");
  const Loaded replaced = load(store, "prod", "v2", /*replace=*/true);
  ASSERT_TRUE(replaced.adapter) << replaced.error;
  EXPECT_EQ(store.resolve("prod", AdapterSource::kLocal), t.path.string() + "/v2");
  EXPECT_EQ(store.get_sync("prod", AdapterSource::kLocal)->source(), t.path.string() + "/v2");
  EXPECT_EQ(names(store), (std::vector<std::string>{"prod"}));
  EXPECT_EQ(fake.calls_of("v1"), 1);
  EXPECT_EQ(fake.calls_of("v2"), 1);
}

TEST(AdapterAdmin, FailedLoadLeavesNoName) {
  TmpDir t;
  Fake fake;
  AdapterStoreOptions o;
  o.adapters_dir = t.path.string();
  t.make("broken");
  fake.fail_once = {"broken"};
  AdapterStore store(fake.loader(), o);
  const Loaded l = load(store, "b", "broken");
  EXPECT_FALSE(l.adapter);
  EXPECT_EQ(l.kind, ErrorKind::kInvalidArgument);
  EXPECT_THROW(store.resolve("b", AdapterSource::kLocal), Error);
  EXPECT_TRUE(load(store, "b", "broken").adapter);  // the name is free again
}

TEST(AdapterAdmin, RequestsJoinTheLoadInFlight) {
  TmpDir t;
  Fake fake;
  AdapterStoreOptions o;
  o.adapters_dir = t.path.string();
  t.make("slow");
  AdapterStore store(fake.loader(), o);
  fake.set_open(false);
  Waiter admin, request;
  store.load_named("s", "slow", AdapterSource::kLocal, false, admin.callback());
  fake.wait_started(1);
  store.get("s", AdapterSource::kLocal, request.callback());
  fake.set_open(true);
  ASSERT_TRUE(admin.wait() && request.wait());
  EXPECT_EQ(admin.adapter, request.adapter);
  EXPECT_EQ(fake.calls_of("slow"), 1);
}

TEST(AdapterAdmin, UnloadKeepsRunningRequestsAndCountsTheirBytes) {
  TmpDir t;
  Fake fake;
  fake.bytes = {{"a", 1000}, {"b", 1000}};
  AdapterStoreOptions o;
  o.adapters_dir = t.path.string();
  o.memory_budget = 1500;
  t.make("a"), t.make("b");
  AdapterStore store(fake.loader(), o);
  ASSERT_TRUE(load(store, "alpha", "a").adapter);
  std::shared_ptr<const LoraAdapter> lease = store.get_sync("alpha", AdapterSource::kLocal);
  EXPECT_TRUE(store.unload("alpha"));
  EXPECT_FALSE(store.unload("alpha"));
  EXPECT_TRUE(names(store).empty());
  EXPECT_THROW(store.resolve("alpha", AdapterSource::kLocal), Error);
  EXPECT_EQ(lease->name(), "alpha");  // the running request still has it
  // Its 1000 bytes still occupy the device: b does not fit beside them.
  const std::string err = error_of([&] { store.get_sync("b", AdapterSource::kLocal); });
  EXPECT_NE(err.find("budget"), std::string::npos) << err;
  lease.reset();
  EXPECT_EQ(store.get_sync("b", AdapterSource::kLocal)->name(), "b");
}

TEST(AdapterAdmin, UnloadsPreloadedAndDirectoryAdapters) {
  TmpDir t, pre;
  Fake fake;
  AdapterStoreOptions o;
  o.adapters_dir = t.path.string();
  t.make("d");
  pre.make("p");
  AdapterStore store(fake.loader(), o);
  store.preload("boot", (pre.path / "p").string());
  store.get_sync("d", AdapterSource::kLocal);
  EXPECT_EQ(names(store), (std::vector<std::string>{"d", "boot"}));
  EXPECT_TRUE(store.unload("boot"));
  EXPECT_THROW(store.resolve("boot", AdapterSource::kLocal), Error);  // gone for good
  EXPECT_TRUE(store.unload("d"));
  EXPECT_EQ(names(store), std::vector<std::string>{});
  // A name inside --adapters-dir loads again when asked for.
  EXPECT_EQ(store.get_sync("d", AdapterSource::kLocal)->name(), "d");
  EXPECT_EQ(fake.calls_of("d"), 2);
  EXPECT_FALSE(store.unload("never-loaded"));
}

}  // namespace
}  // namespace kestrel
