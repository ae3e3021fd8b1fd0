// The adapter store (docs/lora.md, "Adapter store"): the LoRA adapters a server holds, loaded on
// first use off the step loop's thread (a few loads at once, each bounded in time), kept up to a
// bound with LRU eviction of adapters no running request uses, preloaded at start. Ids resolve
// only where the operator allowed (docs/server.md, "Security model"): preloaded names, names
// inside --adapters-dir, ORG/NAME inside the offline Hugging Face cache, absolute folders only
// with --allow-adapter-paths.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "lora/lora_adapter.h"
#include "lora/merge.h"

namespace kestrel {

// Where an adapter id points (LoRAX's adapter_source).
enum class AdapterSource : uint8_t {
  kLocal,  // a preloaded name, a name inside --adapters-dir, an absolute folder if allowed
  kHub,    // HF_HUB_CACHE/models--ORG--NAME/snapshots/<refs/main>, offline: never a download
};

// "local" / "hub"; anything else throws a kInvalidArgument Error naming the source.
AdapterSource parse_adapter_source(const std::string& s);

struct AdapterStoreOptions {
  int max_loaded = 16;        // --max-loaded-adapters
  std::string adapters_dir;   // --adapters-dir ("": no local loading beyond preloaded names)
  std::string hub_cache;      // HF_HUB_CACHE (else $HF_HOME/hub, else ~/.cache/huggingface/hub)
  int64_t memory_budget = 0;  // bytes the loaded adapters may hold together (0: no bound)
  bool allow_paths = false;   // --allow-adapter-paths: an absolute folder path is an id too
  int load_threads = 4;       // loads that may run at once
  std::chrono::milliseconds load_timeout{60000};  // a load still running then fails its gets
};

// Why a get failed: the kind (the server's status), a message for the client (the id and the
// rule, never a path or a file's contents) and the detail for the log and the CLI.
struct AdapterError {
  ErrorKind kind = ErrorKind::kInternal;
  std::string message;
  std::string detail;
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
  // Called once per get(): the adapter and null, or null and why it failed. Runs on a loader
  // thread, or on the caller's thread when the adapter is already loaded (or the id is invalid).
  using Callback =
      std::function<void(std::shared_ptr<const LoraAdapter> adapter, const AdapterError* error)>;

  AdapterStore(Loader loader, AdapterStoreOptions options);
  ~AdapterStore();  // finishes the load in flight, fails the queued ones, joins the thread
  AdapterStore(const AdapterStore&) = delete;
  AdapterStore& operator=(const AdapterStore&) = delete;

  // `--adapter NAME=DIR` at start: loads now, on the caller's thread; throws kestrel::Error.
  void preload(const std::string& name, const std::string& dir);

  // The canonical folder `id` names under `source`, checked against the confinement rules.
  // Throws an Error whose kind is kInvalidArgument (an id the rules refuse) or kNotFound (no such
  // adapter where the rules look), with a message that names the id and the rule, never a path.
  std::string resolve(const std::string& id, AdapterSource source) const;
  // The name an adapter loads under, the same for every spelling of its id: a preloaded NAME,
  // the path inside --adapters-dir, ORG/NAME for the hub, the canonical folder with
  // --allow-adapter-paths. Throws like resolve().
  std::string canonical_name(const std::string& id, AdapterSource source) const;

  // The adapter `id` names, loaded on first use. Concurrent gets of one folder share one load.
  // The shared_ptr handed to `done` is the request's lease: while any copy of it is alive the
  // store does not evict that adapter. A failed load fails these gets alone; a later get tries
  // again.
  void get(const std::string& id, AdapterSource source, Callback done);

  // Blocking form of get() (CLI, tests): throws kestrel::Error of the failure's kind with its
  // detail.
  std::shared_ptr<const LoraAdapter> get_sync(const std::string& id, AdapterSource source);

  // merged_adapters (docs/lora.md, "Merged adapters"): read_host reads an adapter folder onto the
  // host in F32 (FalconModel::read_host_adapter), upload puts a merged adapter on the device
  // (FalconModel::adapter_from_merged). Both run on the loader threads and throw kestrel::Error.
  struct MergeHooks {
    std::function<HostLoraAdapter(const std::string& dir)> read_host;
    std::function<std::shared_ptr<const LoraAdapter>(const MergedLora& merged,
                                                     const std::string& name)>
        upload;
  };
  // Set once, before the first get_merged. Without hooks get_merged fails every merge (422).
  void set_merge_hooks(MergeHooks hooks);

  // POST /v1/load_lora_adapter (docs/lora.md, "Loading and unloading at run time"): registers
  // `name` for the folder `path` names under `source` (the rules of resolve(); a path the rules
  // refuse fails with the kind resolve() gives, its message naming lora_path) and loads it. The
  // name answers requests from the moment this returns (they join the load); a load that fails
  // unregisters it. A name already registered fails with kConflict unless `replace`, which
  // unloads the old one first. Names are printable, at most 256 bytes, and do not start with '/'
  // or "merge:" (kInvalidArgument naming lora_name); at most 4096 are registered at once
  // (kOverloaded past that).
  void load_named(const std::string& name, const std::string& path, AdapterSource source,
                  bool replace, Callback done);
  // POST /v1/unload_lora_adapter: forgets `name` (a registered name, a preloaded one, or an
  // adapter loaded under that name) and drops the adapter; requests running under it finish, and
  // its memory counts until they do. A name inside --adapters-dir loads again when asked for.
  // False when nothing answers to the name.
  bool unload(const std::string& name);

  // The name the merge of `spec` (its ids under `source`) loads under: "merge:" and 16 hex digits
  // of a hash of the ids' canonical names, the weights and what of strategy, density, sign method
  // and seed changes the result (one adapter is always linear; the seed counts only for DARE
  // below density 1). Throws ValidationError for a spec that does not validate and Error like
  // canonical_name for an id.
  std::string merged_name(const MergeSpec& spec, AdapterSource source) const;

  // The merged adapter of `spec`, made on first use on a loader thread (each input folder read
  // onto the host again, merged with merge_adapters, uploaded) and then held like any adapter
  // (LRU, memory budget, metrics) under merged_name(). A spec, an id or a merge the rules refuse
  // (unequal ranks, ...) fails with kInvalidArgument and a message naming the merged_adapters
  // field; a missing id with kNotFound.
  void get_merged(const MergeSpec& spec, AdapterSource source, Callback done);
  std::shared_ptr<const LoraAdapter> get_merged_sync(const MergeSpec& spec, AdapterSource source);

  // Loaded adapters, most recently used first.
  std::vector<LoadedAdapterInfo> loaded() const;
  // The names the operator registered (--adapter, POST /v1/load_lora_adapter), loaded or not.
  std::vector<std::string> registered() const;
  // Whether the adapter named `id` is loaded (no load, no LRU touch).
  bool is_loaded(const std::string& id) const;

  const AdapterStoreOptions& options() const { return options_; }

 private:
  struct Impl;
  struct Resolved;
  Resolved resolve_full(const std::string& id, AdapterSource source) const;
  void get_resolved(const Resolved& where, Callback done);
  AdapterStoreOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kestrel
