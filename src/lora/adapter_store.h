// The adapter store (docs/lora.md, "Adapter store"): the LoRA adapters a server holds, loaded on
// first use off the step loop's thread, kept up to a bound with LRU eviction of adapters no
// running request uses, preloaded at start, names resolved under --adapters-dir or the offline
// Hugging Face cache.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lora/lora_adapter.h"

namespace kestrel {

// Where an adapter id points (LoRAX's adapter_source).
enum class AdapterSource : uint8_t {
  kLocal,  // a folder path, or a name under --adapters-dir
  kHub,    // HF_HUB_CACHE/models--ORG--NAME/snapshots/<refs/main>, offline: never a download
};

// "local" / "hub"; anything else throws kestrel::Error naming the source (the server's 422).
AdapterSource parse_adapter_source(const std::string& s);

struct AdapterStoreOptions {
  int max_loaded = 16;        // --max-loaded-adapters
  std::string adapters_dir;   // --adapters-dir ("" : names are folder paths only)
  std::string hub_cache;      // HF_HUB_CACHE (else $HF_HOME/hub, else ~/.cache/huggingface/hub)
  int64_t memory_budget = 0;  // bytes the loaded adapters may hold together (0: no bound)
};

// What /v1/models, /info and the metrics list.
struct LoadedAdapterInfo {
  std::string name;    // the id requests use
  std::string folder;  // the resolved folder
  int64_t bytes = 0;
  int64_t max_rank = 0;
  bool in_use = false;  // held by a running request
};

class AdapterStore {
 public:
  // Reads DIR into an adapter named NAME (FalconModel::load_adapter in the server; a fake in
  // tests). Runs on the store's loader thread; throws kestrel::Error naming the problem.
  using Loader = std::function<std::shared_ptr<const LoraAdapter>(const std::string& dir,
                                                                  const std::string& name)>;
  // Called once per get(): the adapter, or null and the reason it failed. Runs on the loader
  // thread, or on the caller's thread when the adapter is already loaded (or the id is invalid).
  using Callback =
      std::function<void(std::shared_ptr<const LoraAdapter> adapter, const std::string& error)>;

  AdapterStore(Loader loader, AdapterStoreOptions options);
  ~AdapterStore();  // finishes the load in flight, fails the queued ones, joins the thread
  AdapterStore(const AdapterStore&) = delete;
  AdapterStore& operator=(const AdapterStore&) = delete;

  // `--adapter NAME=DIR` at start: loads now, on the caller's thread; throws kestrel::Error.
  void preload(const std::string& name, const std::string& dir);

  // The folder `id` names under `source`: throws kestrel::Error naming the id and where it looked.
  std::string resolve(const std::string& id, AdapterSource source) const;

  // The adapter `id` names, loaded on first use. Concurrent gets of one folder share one load.
  // The shared_ptr handed to `done` is the request's lease: while any copy of it is alive the
  // store does not evict that adapter. A failed load fails these gets alone; a later get tries
  // again.
  void get(const std::string& id, AdapterSource source, Callback done);

  // Blocking form of get() (CLI, tests): throws kestrel::Error with the reason.
  std::shared_ptr<const LoraAdapter> get_sync(const std::string& id, AdapterSource source);

  // Loaded adapters, most recently used first.
  std::vector<LoadedAdapterInfo> loaded() const;
  // Whether the adapter named `id` is loaded (no load, no LRU touch).
  bool is_loaded(const std::string& id) const;

  const AdapterStoreOptions& options() const { return options_; }

 private:
  struct Impl;
  AdapterStoreOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kestrel
