// The adapter store: a few loader threads sharing a queue of folders to read, the loaded adapters
// in LRU order (front: most recently used), concurrent gets of one folder joined on one load.
// Each load runs on a thread of its own that a loader thread waits on for at most load_timeout:
// a folder that hangs (a slow mount) fails its gets and leaves the other loads alone. Eviction
// takes only adapters whose shared_ptr the store alone holds (no request leases them).
#include "lora/adapter_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "core/env.h"
#include "core/error.h"
#include "core/logging.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;

constexpr double kMiB = 1048576.0;
constexpr size_t kMaxIdBytes = 256;
constexpr size_t kMaxNames = 4096;  // registered adapter names (POST /v1/load_lora_adapter)
// Loads past their timeout whose threads have not returned yet: beyond this many, new loads wait
// for them rather than pile up threads on a storage that does not answer.
constexpr int kMaxStuckLoads = 8;

std::string canonical_or_empty(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::canonical(p, ec);
  return ec ? "" : c.string();
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// Whether canonical path `p` is `root` or inside it (both canonical).
bool inside(const std::string& p, const std::string& root) {
  if (root.empty() || p.size() < root.size() || p.compare(0, root.size(), root) != 0) return false;
  return p.size() == root.size() || p[root.size()] == '/' || root == "/";
}

// A relative path of plain components: no "..", no ".", no empty part, not absolute.
bool safe_relative(const std::string& id) {
  if (id.empty() || id.front() == '/' || id.find('\\') != std::string::npos) return false;
  size_t start = 0;
  while (start <= id.size()) {
    const size_t end = std::min(id.find('/', start), id.size());
    const std::string part = id.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

std::string default_hub_cache() {
  if (auto v = env_var("HF_HUB_CACHE")) return *v;
  if (auto v = env_var("HF_HOME")) return (fs::path(*v) / "hub").string();
  return (fs::path(env_var("HOME").value_or(".")) / ".cache" / "huggingface" / "hub").string();
}

std::string trim(std::string s) {
  const char* ws = " \t\r\n";
  s.erase(0, s.find_first_not_of(ws));
  const size_t last = s.find_last_not_of(ws);
  s.erase(last == std::string::npos ? 0 : last + 1);
  return s;
}

[[noreturn]] void refuse(const std::string& message) {
  throw Error(message, ErrorKind::kInvalidArgument);
}
[[noreturn]] void not_found(const std::string& message) {
  throw Error(message, ErrorKind::kNotFound);
}

// The files of an adapter folder a client found by name lie inside `root` after following
// symlinks, and are plain files (a FIFO or a device would block or stream forever). Throws the
// reason. An empty root (a folder the operator named: a preload, --allow-adapter-paths) checks
// nothing; load_timeout still bounds it.
void check_files(const std::string& folder, const std::string& root) {
  if (root.empty()) return;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    const fs::path target = fs::canonical(e.path(), ec);
    if (ec) KESTREL_FAIL(e.path().string(), ": cannot follow: ", ec.message());
    if (!inside(target.string(), root))
      KESTREL_FAIL(e.path().string(), " leads to ", target.string(), ", outside ", root);
    const fs::file_status st = fs::status(target, ec);
    if (fs::is_regular_file(st) || fs::is_directory(st)) continue;
    KESTREL_FAIL(e.path().string(), " is not a regular file");
  }
  if (ec) KESTREL_FAIL("cannot list ", folder, ": ", ec.message());
}

}  // namespace

AdapterSource parse_adapter_source(const std::string& s) {
  if (s == "local") return AdapterSource::kLocal;
  if (s == "hub") return AdapterSource::kHub;
  KESTREL_FAIL_AS(ErrorKind::kInvalidArgument, "adapter_source '", s,
                  "' is not supported (local or hub)");
}

// Where an id leads: the canonical folder, the name it loads under, and the folder its files
// must stay inside ("" : no bound, for what the operator named).
struct AdapterStore::Resolved {
  std::string folder, name, root;
};

struct AdapterStore::Impl {
  struct Entry {
    std::string name, folder;
    std::shared_ptr<const LoraAdapter> adapter;
    int64_t bytes = 0;
  };
  // A load: reads and returns the adapter, or throws (a ValidationError's message goes to the
  // client as it is).
  using Job = std::function<std::shared_ptr<const LoraAdapter>()>;
  struct Pending {
    std::string name, root;
    Job job;  // set: a merge (the key is its name, not a folder)
    std::vector<Callback> waiters;
  };
  // One load's result, shared with the thread that runs it (which may outlive its wait).
  struct LoadState {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::shared_ptr<const LoraAdapter> adapter;
    std::string error;
    std::string client_error;  // a ValidationError's message
  };

  std::shared_ptr<const Loader> loader;
  std::shared_ptr<const MergeHooks> merge_hooks;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::list<Entry> lru;  // front: most recently used
  // A name the operator gave a folder: --adapter NAME=DIR, or POST /v1/load_lora_adapter (then
  // `root` is the folder its files must stay inside, as for any id a client named).
  struct Alias {
    std::string folder, root;
  };
  std::map<std::string, Alias> aliases;
  // Adapters unloaded while requests still held them: their bytes count against the budget
  // until the last lease ends.
  std::vector<std::pair<std::weak_ptr<const LoraAdapter>, int64_t>> retiring;
  std::map<std::string, Pending> pending;  // folder -> the gets waiting on its load
  std::deque<std::string> queue;           // folders not yet started
  bool stopping = false;
  std::vector<std::thread> threads;
  std::shared_ptr<std::atomic<int>> stuck = std::make_shared<std::atomic<int>>(0);

  std::list<Entry>::iterator find_folder(const std::string& folder) {
    for (auto it = lru.begin(); it != lru.end(); ++it)
      if (it->folder == folder) return it;
    return lru.end();
  }
  int64_t loaded_bytes() {
    int64_t n = 0;
    for (const Entry& e : lru) n += e.bytes;
    std::erase_if(retiring, [](const auto& r) { return r.first.expired(); });
    for (const auto& r : retiring) n += r.second;
    return n;
  }

  // Evicts least-recently-used adapters no request holds until `fits()` (under mu). The
  // evicted adapters go to `dropped`, freed by the caller once mu is released. False when every
  // adapter left is in use and it still does not fit.
  template <typename Fits>
  bool evict_until(Fits fits, std::vector<std::shared_ptr<const LoraAdapter>>& dropped) {
    while (!fits()) {
      auto victim = lru.end();
      for (auto it = lru.end(); it != lru.begin();) {
        --it;
        if (it->adapter.use_count() == 1) {
          victim = it;
          break;
        }
      }
      if (victim == lru.end()) return false;
      spdlog::info("adapter store: evicting {} ({:.1f} MiB, least recently used)", victim->name,
                   victim->bytes / kMiB);
      dropped.push_back(std::move(victim->adapter));
      lru.erase(victim);
    }
    return true;
  }

  // Unload (under mu): the name's alias and the loaded adapter it names (by alias or by its
  // loaded name) go; running requests keep their leases, whose bytes stay counted until they
  // end. False when nothing answers to the name.
  bool forget(const std::string& name, std::vector<std::shared_ptr<const LoraAdapter>>& dropped) {
    std::string folder;
    if (auto a = aliases.find(name); a != aliases.end()) {
      folder = a->second.folder;
      aliases.erase(a);
    }
    auto it = lru.end();
    for (auto e = lru.begin(); e != lru.end(); ++e)
      if ((!folder.empty() && e->folder == folder) || e->name == name) it = e;
    if (it == lru.end()) return !folder.empty();
    if (it->adapter.use_count() > 1) retiring.emplace_back(it->adapter, it->bytes);
    dropped.push_back(std::move(it->adapter));
    lru.erase(it);
    return true;
  }

  // The adapter loaded under `key` (a folder, or a merge's name) to `done` at once, or `done`
  // queued on its load, started here when none runs (`job`; empty: a load of the folder).
  void get_or_load(const std::string& key, const std::string& name, const std::string& root,
                   Job job, Callback done) {
    std::shared_ptr<const LoraAdapter> ad;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!stopping) {
        if (auto it = find_folder(key); it != lru.end()) {
          lru.splice(lru.begin(), lru, it);  // LRU touch
          ad = it->adapter;
        } else {
          auto [p, fresh] = pending.try_emplace(key);
          if (fresh) {
            p->second.name = name;
            p->second.root = root;
            p->second.job = std::move(job);
            queue.push_back(key);
          }
          p->second.waiters.push_back(std::move(done));
          cv.notify_one();
          return;
        }
      }
    }
    if (!ad) {
      const AdapterError shutdown{ErrorKind::kUnavailable, "server shutting down",
                                  "server shutting down"};
      call(done, nullptr, &shutdown);
      return;
    }
    call(done, std::move(ad), nullptr);
  }

  // Room for one more adapter by count (under mu): "" or why not.
  std::string make_room_for_one(const AdapterStoreOptions& o,
                                std::vector<std::shared_ptr<const LoraAdapter>>& dropped) {
    const auto fits = [&] { return static_cast<int64_t>(lru.size()) < o.max_loaded; };
    if (evict_until(fits, dropped)) return "";
    return detail::concat("all ", lru.size(), " loaded adapters are in use by running requests ",
                          "(max_loaded ", o.max_loaded,
                          ", --max-loaded-adapters); retry when one finishes");
  }

  // Puts a freshly loaded adapter in (under mu), evicting for max_loaded and memory_budget:
  // "" or why it could not stay.
  std::string insert(const AdapterStoreOptions& o, const std::string& name,
                     const std::string& folder, std::shared_ptr<const LoraAdapter> ad,
                     std::vector<std::shared_ptr<const LoraAdapter>>& dropped) {
    const int64_t bytes = ad->bytes();
    if (o.memory_budget > 0 && bytes > o.memory_budget)
      return detail::concat("it holds ", bytes, " bytes (", bytes / kMiB,
                            " MiB), more than the whole adapter memory budget of ", o.memory_budget,
                            " bytes (", o.memory_budget / kMiB, " MiB, --adapter-memory)");
    if (std::string why = make_room_for_one(o, dropped); !why.empty()) return why;
    const auto fits = [&] {
      return o.memory_budget <= 0 || loaded_bytes() + bytes <= o.memory_budget;
    };
    if (!evict_until(fits, dropped))
      return detail::concat("it needs ", bytes / kMiB, " MiB and the adapters in use hold ",
                            loaded_bytes() / kMiB, " MiB of the budget of ", o.memory_budget / kMiB,
                            " MiB (memory_budget, --adapter-memory); retry when one finishes");
    lru.push_front(Entry{name, folder, std::move(ad), bytes});
    return "";
  }

  // The files' checks and the loader.
  static Job folder_job(std::shared_ptr<const Loader> loader, const std::string& folder,
                        const std::string& name, const std::string& root) {
    return [loader = std::move(loader), folder, name, root] {
      check_files(folder, root);
      std::shared_ptr<const LoraAdapter> ad = (*loader)(folder, name);
      if (!ad) KESTREL_FAIL("the loader returned no adapter for ", folder);
      return ad;
    };
  }

  // Runs a job, its exceptions as a message (and a ValidationError's as the client's too).
  static std::shared_ptr<const LoraAdapter> load(const Job& job, const std::string& name,
                                                 std::string& error, std::string* client_error) {
    try {
      return job();
    } catch (const ValidationError& e) {
      error = e.what();
      if (client_error) *client_error = e.what();
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown error loading " + name;
    }
    return nullptr;
  }

  // load() on a thread of its own, waited for at most `timeout`. On a timeout the thread is left
  // to finish alone (it holds what it uses) and counts as stuck until it does.
  std::shared_ptr<const LoraAdapter> load_bounded(const std::string& folder,
                                                  const std::string& name, Job job,
                                                  std::chrono::milliseconds timeout,
                                                  AdapterError& error) {
    auto state = std::make_shared<LoadState>();
    std::thread([state, stuck = stuck, name, job = std::move(job)] {
      std::string err, client_err;
      auto ad = load(job, name, err, &client_err);
      std::lock_guard<std::mutex> lock(state->mu);
      state->adapter = std::move(ad);
      state->error = std::move(err);
      state->client_error = std::move(client_err);
      if (state->done) --*stuck;  // its waiter gave up: the result goes with the state
      state->done = true;
      state->cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lock(state->mu);
    if (!state->cv.wait_for(lock, timeout, [&] { return state->done; })) {
      state->done = true;  // from now on the thread's result is dropped
      ++*stuck;
      error = {ErrorKind::kUnavailable,
               detail::concat("adapter '", name, "' did not load within ", timeout.count() / 1000.0,
                              " s; try again later"),
               detail::concat("loading ", folder, " took longer than ", timeout.count() / 1000.0,
                              " s (--adapter-load-timeout)")};
      return nullptr;
    }
    if (!state->adapter && !state->client_error.empty())
      error = {ErrorKind::kInvalidArgument, state->client_error, state->error};
    else if (!state->adapter)
      error = {ErrorKind::kInvalidArgument,
               "adapter '" + name +
                   "' could not be loaded: it is not a LoRA adapter this model can use (the "
                   "server log has the reason)",
               state->error};
    return std::move(state->adapter);
  }

  static void call(const Callback& cb, std::shared_ptr<const LoraAdapter> ad,
                   const AdapterError* error) {
    try {
      cb(std::move(ad), error);
    } catch (const std::exception& e) {
      spdlog::error("adapter store: a get() callback threw: {}", e.what());
    } catch (...) {
      spdlog::error("adapter store: a get() callback threw");
    }
  }

  void run(const AdapterStoreOptions& o) {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;  // stopping
      const std::string folder = queue.front();
      queue.pop_front();
      const std::string name = pending[folder].name, root = pending[folder].root;
      const bool merge = static_cast<bool>(pending[folder].job);
      Job job = merge ? pending[folder].job : folder_job(loader, folder, name, root);
      std::vector<std::shared_ptr<const LoraAdapter>> dropped;
      AdapterError error;
      std::shared_ptr<const LoraAdapter> ad;
      if (std::string why = make_room_for_one(o, dropped); !why.empty()) {
        error = {ErrorKind::kOverloaded, "adapter '" + name + "': " + why, why};
      } else if (stuck->load() >= kMaxStuckLoads) {
        error = {ErrorKind::kUnavailable,
                 "adapter '" + name + "': too many adapter loads are hanging; try again later",
                 detail::concat(stuck->load(), " adapter loads are past --adapter-load-timeout")};
      } else {
        lock.unlock();
        dropped.clear();
        const auto t0 = std::chrono::steady_clock::now();
        ad = load_bounded(folder, name, std::move(job), o.load_timeout, error);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        lock.lock();
        if (auto it = find_folder(folder); ad && it != lru.end()) {
          ad = it->adapter;  // preloaded meanwhile
        } else if (ad) {
          if (std::string why = insert(o, name, folder, ad, dropped); why.empty()) {
            spdlog::info("adapter store: {} {} {} ({:.1f} MiB, max rank {}) in {:.2f} s",
                         merge ? "merged" : "loaded", name,
                         merge ? "from merged_adapters" : "from " + folder, ad->bytes() / kMiB,
                         ad->max_rank(), s);
          } else {
            error = {ErrorKind::kOverloaded, "adapter '" + name + "': " + why, why};
            ad.reset();
          }
        }
      }
      if (!ad) spdlog::warn("adapter store: adapter '{}': {}", name, error.detail);
      std::vector<Callback> waiters = std::move(pending[folder].waiters);
      pending.erase(folder);
      lock.unlock();
      dropped.clear();
      // The last waiter gets this thread's reference: once the callbacks return, the leases they
      // kept are the only ones (an adapter no request holds can be evicted at once).
      const AdapterError* failure = ad ? nullptr : &error;
      for (size_t i = 0; i < waiters.size(); ++i)
        call(waiters[i], i + 1 == waiters.size() ? std::move(ad) : ad, failure);
      waiters.clear();
      ad.reset();
      lock.lock();
    }
  }
};

AdapterStore::AdapterStore(Loader loader, AdapterStoreOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  KESTREL_CHECK(loader, "AdapterStore needs a loader");
  KESTREL_CHECK(options_.max_loaded >= 1, "--max-loaded-adapters must be at least 1, got ",
                options_.max_loaded);
  KESTREL_CHECK(options_.memory_budget >= 0, "the adapter memory budget must not be negative, got ",
                options_.memory_budget);
  KESTREL_CHECK(options_.load_threads >= 1, "adapter load threads must be at least 1, got ",
                options_.load_threads);
  KESTREL_CHECK(options_.load_timeout.count() > 0, "--adapter-load-timeout must be positive");
  if (options_.hub_cache.empty()) options_.hub_cache = default_hub_cache();
  impl_->loader = std::make_shared<const Loader>(std::move(loader));
  for (int i = 0; i < options_.load_threads; ++i)
    impl_->threads.emplace_back([this] { impl_->run(options_); });
}

AdapterStore::~AdapterStore() {
  std::vector<Callback> failed;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    for (const std::string& folder : impl_->queue) {
      auto it = impl_->pending.find(folder);
      if (it == impl_->pending.end()) continue;
      for (Callback& cb : it->second.waiters) failed.push_back(std::move(cb));
      impl_->pending.erase(it);
    }
    impl_->queue.clear();
  }
  impl_->cv.notify_all();
  const AdapterError shutdown{ErrorKind::kUnavailable, "server shutting down",
                              "server shutting down"};
  for (const Callback& cb : failed) Impl::call(cb, nullptr, &shutdown);
  for (std::thread& t : impl_->threads) t.join();
}

AdapterStore::Resolved AdapterStore::resolve_full(const std::string& id,
                                                  AdapterSource source) const {
  if (id.empty()) refuse("adapter_id is empty");
  if (id.size() > kMaxIdBytes)
    refuse(detail::concat("adapter_id is longer than ", kMaxIdBytes, " bytes"));
  for (unsigned char c : id)
    if (c < 0x20 || c == 0x7f) refuse("adapter_id holds a control character");
  if (source == AdapterSource::kHub) {
    // "ORG/NAME" (or "NAME"): plain components only, inside the hub cache.
    const size_t slash = id.find('/');
    if (!safe_relative(id) || (slash != std::string::npos && id.find('/', slash + 1) != id.npos))
      refuse("adapter '" + id +
             "' is not a Hugging Face repository id (ORG/NAME, no '..' or empty parts)");
    const std::string cache = canonical_or_empty(options_.hub_cache);
    const auto missing = [&](const std::string& why) {
      spdlog::debug("adapter store: hub adapter '{}': {}", id, why);
      not_found("adapter '" + id +
                "' (hub) is not in the server's Hugging Face cache; kestrel never downloads "
                "adapters (put the snapshot there first: huggingface-cli download)");
    };
    if (cache.empty()) missing("no hub cache at " + options_.hub_cache);
    std::string repo = "models--" + id;
    if (slash != std::string::npos) repo.replace(8 + slash, 1, "--");
    const fs::path root = fs::path(cache) / repo;
    const fs::path snapshots = root / "snapshots";
    fs::path dir;
    std::ifstream ref(root / "refs" / "main");
    if (ref.good()) {
      std::string rev((std::istreambuf_iterator<char>(ref)), std::istreambuf_iterator<char>());
      rev = trim(rev);
      if (!safe_relative(rev) || rev.find('/') != std::string::npos || !is_dir(snapshots / rev))
        missing((root / "refs" / "main").string() + " names '" + rev + "', not a snapshot folder");
      dir = snapshots / rev;
    } else {
      std::vector<fs::path> snaps;
      std::error_code ec;
      if (is_dir(snapshots))
        for (const auto& e : fs::directory_iterator(snapshots, ec))
          if (is_dir(e.path())) snaps.push_back(e.path());
      if (snaps.empty()) missing("no snapshot under " + snapshots.string());
      if (snaps.size() > 1)
        refuse(detail::concat("adapter '", id, "' (hub) has ", snaps.size(),
                              " snapshots in the cache and no refs/main to choose one"));
      dir = snaps[0];
    }
    const std::string folder = canonical_or_empty(dir);
    if (!inside(folder, cache)) {
      spdlog::warn("adapter store: hub adapter '{}' leads to {}, outside the hub cache {}", id,
                   folder, cache);
      refuse("adapter '" + id + "' (hub) leads outside the Hugging Face cache; refused");
    }
    return {folder, id, cache};
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (auto it = impl_->aliases.find(id); it != impl_->aliases.end())
      return {it->second.folder, id, it->second.root};
  }
  if (id.front() == '/') {
    if (!options_.allow_paths)
      refuse("adapter '" + id +
             "': absolute paths are not accepted as adapter ids on this server (an id is a name "
             "inside its adapters folder)");
    const std::string folder = canonical_or_empty(id);
    if (folder.empty() || !is_dir(folder)) not_found("adapter '" + id + "' is not a folder");
    return {folder, folder, ""};
  }
  if (!safe_relative(id))
    refuse("adapter '" + id +
           "': a local adapter id is a name inside the adapters folder, without '..', '.' or "
           "empty parts");
  if (options_.adapters_dir.empty())
    not_found("adapter '" + id +
              "' is not loaded, and this server loads local adapters only by the names it was "
              "started with (no --adapters-dir)");
  const std::string base = canonical_or_empty(options_.adapters_dir);
  const fs::path under = fs::path(base) / id;
  if (base.empty() || !is_dir(under)) {
    spdlog::debug("adapter store: local adapter '{}': no folder {}", id, under.string());
    not_found("adapter '" + id + "' not found in the adapters folder");
  }
  const std::string folder = canonical_or_empty(under);
  if (!inside(folder, base) || folder == base) {
    spdlog::warn("adapter store: local adapter '{}' leads to {}, outside --adapters-dir {}", id,
                 folder, base);
    refuse("adapter '" + id + "' leads outside the adapters folder (a symlink); refused");
  }
  return {folder, folder.substr(base.size() + (base == "/" ? 0 : 1)), base};
}

std::string AdapterStore::resolve(const std::string& id, AdapterSource source) const {
  return resolve_full(id, source).folder;
}

std::string AdapterStore::canonical_name(const std::string& id, AdapterSource source) const {
  return resolve_full(id, source).name;
}

void AdapterStore::preload(const std::string& name, const std::string& dir) {
  KESTREL_CHECK(!name.empty(), "an adapter name must not be empty (NAME=DIR)");
  if (!is_dir(dir)) KESTREL_FAIL("adapter '", name, "': folder ", dir, " does not exist");
  const std::string folder = canonical_or_empty(dir);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (auto it = impl_->aliases.find(name);
        it != impl_->aliases.end() && it->second.folder != folder)
      KESTREL_FAIL("adapter name '", name, "' is given twice (", it->second.folder, " and ", folder,
                   ")");
    if (impl_->find_folder(folder) != impl_->lru.end()) {
      impl_->aliases[name] = {folder, ""};
      return;
    }
  }
  std::string error;
  std::shared_ptr<const LoraAdapter> ad =
      Impl::load(Impl::folder_job(impl_->loader, folder, name, ""), name, error, nullptr);
  if (!ad) KESTREL_FAIL("adapter '", name, "': ", error);
  std::vector<std::shared_ptr<const LoraAdapter>> dropped;
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->find_folder(folder) == impl_->lru.end()) {
    error = impl_->insert(options_, name, folder, ad, dropped);
    if (!error.empty()) KESTREL_FAIL("adapter '", name, "': ", error);
  }
  impl_->aliases[name] = {folder, ""};
  spdlog::info("adapter store: preloaded {} from {} ({:.1f} MiB, max rank {})", name, folder,
               ad->bytes() / kMiB, ad->max_rank());
}

void AdapterStore::get(const std::string& id, AdapterSource source, Callback done) {
  Resolved where;
  try {
    where = resolve_full(id, source);
  } catch (const Error& e) {
    const AdapterError failure{e.kind(), e.what(), e.what()};
    Impl::call(done, nullptr, &failure);
    return;
  }
  get_resolved(where, std::move(done));
}

void AdapterStore::get_resolved(const Resolved& where, Callback done) {
  impl_->get_or_load(where.folder, where.name, where.root, nullptr, std::move(done));
}

std::shared_ptr<const LoraAdapter> AdapterStore::get_sync(const std::string& id,
                                                          AdapterSource source) {
  using Result = std::pair<std::shared_ptr<const LoraAdapter>, AdapterError>;
  auto result = std::make_shared<std::promise<Result>>();
  auto fut = result->get_future();
  get(id, source, [result](std::shared_ptr<const LoraAdapter> ad, const AdapterError* error) {
    result->set_value({std::move(ad), error ? *error : AdapterError{}});
  });
  auto [ad, error] = fut.get();
  if (!ad)
    throw Error(error.message + (error.detail != error.message ? ": " + error.detail : ""),
                error.kind);
  return ad;
}

namespace {

// A name POST /v1/load_lora_adapter may give: printable, bounded, and not a spelling an id of
// another kind has (an absolute path, a merge's name).
void check_adapter_name(const std::string& name) {
  if (name.empty()) throw ValidationError("lora_name", "`lora_name` is empty");
  if (name.size() > kMaxIdBytes)
    throw ValidationError("lora_name",
                          detail::concat("`lora_name` is longer than ", kMaxIdBytes, " bytes"));
  for (unsigned char c : name)
    if (c < 0x20 || c == 0x7f)
      throw ValidationError("lora_name", "`lora_name` holds a control character");
  if (name.front() == '/' || name.rfind("merge:", 0) == 0)
    throw ValidationError("lora_name",
                          "`lora_name` must not start with '/' or 'merge:' (the spellings of "
                          "adapter paths and merged adapters)");
}

}  // namespace

void AdapterStore::load_named(const std::string& name, const std::string& path,
                              AdapterSource source, bool replace, Callback done) {
  Resolved where;
  try {
    check_adapter_name(name);
    try {
      where = resolve_full(path, source);
    } catch (const Error& e) {
      throw ValidationError("lora_path", std::string("`lora_path`: ") + e.what(), e.kind());
    }
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopping) throw Error("server shutting down", ErrorKind::kUnavailable);
    auto it = impl_->aliases.find(name);
    if (it != impl_->aliases.end() && !replace)
      throw ValidationError("lora_name",
                            "an adapter named '" + name +
                                "' is already loaded (unload it first, or load_inplace: true)",
                            ErrorKind::kConflict);
    if (it != impl_->aliases.end()) {
      std::vector<std::shared_ptr<const LoraAdapter>> dropped;
      impl_->forget(name, dropped);
    } else if (impl_->aliases.size() >= kMaxNames) {
      throw ValidationError(
          "lora_name",
          detail::concat("the server holds ", kMaxNames, " adapter names; unload one first"),
          ErrorKind::kOverloaded);
    }
    // The name resolves from now on: requests for it join this load.
    impl_->aliases[name] = {where.folder, where.root};
  } catch (const Error& e) {
    const AdapterError failure{e.kind(), e.what(), e.what()};
    Impl::call(done, nullptr, &failure);
    return;
  }
  where.name = name;
  get_resolved(where, [this, name, folder = where.folder, done = std::move(done)](
                          std::shared_ptr<const LoraAdapter> ad, const AdapterError* error) {
    if (!ad) {  // a name that does not load is not registered
      std::lock_guard<std::mutex> lock(impl_->mu);
      if (auto it = impl_->aliases.find(name);
          it != impl_->aliases.end() && it->second.folder == folder)
        impl_->aliases.erase(it);
    } else {
      spdlog::info("adapter store: '{}' loaded by request from {}", name, folder);
    }
    Impl::call(done, std::move(ad), error);
  });
}

bool AdapterStore::unload(const std::string& name) {
  std::vector<std::shared_ptr<const LoraAdapter>> dropped;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    found = impl_->forget(name, dropped);
  }
  if (found) spdlog::info("adapter store: '{}' unloaded by request", name);
  return found;  // `dropped` frees here, outside the lock
}

void AdapterStore::set_merge_hooks(MergeHooks hooks) {
  KESTREL_CHECK(hooks.read_host && hooks.upload,
                "AdapterStore::set_merge_hooks: both hooks needed");
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->merge_hooks = std::make_shared<const MergeHooks>(std::move(hooks));
}

namespace {

// 17 significant digits: the double itself.
std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// "merge:" + 16 hex digits of FNV-1a over what makes the merge (see merged_name()).
std::string merge_name_of(const MergeSpec& spec, const std::vector<std::string>& names,
                          AdapterSource source) {
  const MergeStrategy st = spec.effective_strategy();
  std::string key = source == AdapterSource::kHub ? "hub" : "local";
  for (size_t i = 0; i < names.size(); ++i) key += '\0' + names[i] + '\0' + exact(spec.weights[i]);
  key += std::string("\0") + merge_strategy_name(st);
  const bool ties = st == MergeStrategy::kTies || st == MergeStrategy::kDareTies;
  const bool dare = st == MergeStrategy::kDareLinear || st == MergeStrategy::kDareTies;
  if (ties || dare) key += "\0density=" + exact(spec.density);
  if (ties) key += std::string("\0sign=") + majority_sign_method_name(spec.majority_sign_method);
  if (dare && spec.density < 1.0) key += "\0seed=" + std::to_string(spec.seed);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string("merge:") + hex;
}

}  // namespace

std::string AdapterStore::merged_name(const MergeSpec& spec, AdapterSource source) const {
  spec.validate();
  std::vector<std::string> names;
  for (const std::string& id : spec.ids) names.push_back(resolve_full(id, source).name);
  return merge_name_of(spec, names, source);
}

void AdapterStore::get_merged(const MergeSpec& spec, AdapterSource source, Callback done) {
  std::vector<Resolved> inputs;
  std::string name;
  std::shared_ptr<const MergeHooks> hooks;
  try {
    spec.validate();
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      hooks = impl_->merge_hooks;
    }
    if (!hooks)
      throw ValidationError("merged_adapters",
                            "`merged_adapters` is not supported on this server (no model to merge "
                            "adapters for)");
    std::vector<std::string> names;
    for (const std::string& id : spec.ids) {
      try {
        inputs.push_back(resolve_full(id, source));
      } catch (const Error& e) {
        throw ValidationError("merged_adapters.ids",
                              std::string("`merged_adapters.ids`: ") + e.what(), e.kind());
      }
      names.push_back(inputs.back().name);
    }
    name = merge_name_of(spec, names, source);
  } catch (const Error& e) {
    const AdapterError failure{e.kind(), e.what(), e.what()};
    Impl::call(done, nullptr, &failure);
    return;
  }
  // Every input folder read onto the host again (checked like a load of it), merged, put on the
  // device. The spec keeps the request's ids: the messages name them as the client did.
  Impl::Job job = [hooks, inputs, spec, name]() -> std::shared_ptr<const LoraAdapter> {
    // One read per folder: an id given twice (or two spellings of it) shares it.
    std::map<std::string, HostLoraAdapter> host;
    std::vector<const HostLoraAdapter*> ptrs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      try {
        auto it = host.find(inputs[i].folder);
        if (it == host.end()) {
          check_files(inputs[i].folder, inputs[i].root);
          it = host.emplace(inputs[i].folder, hooks->read_host(inputs[i].folder)).first;
        }
        ptrs.push_back(&it->second);
      } catch (const std::exception& e) {
        spdlog::warn("adapter store: {}: adapter '{}' ({}): {}", name, spec.ids[i],
                     inputs[i].folder, e.what());
        throw ValidationError("merged_adapters.ids",
                              "`merged_adapters.ids`: adapter '" + spec.ids[i] +
                                  "' could not be loaded: it is not a LoRA adapter this model "
                                  "can use (the server log has the reason)");
      }
    }
    const MergedLora merged = merge_adapters(spec, ptrs);
    return hooks->upload(merged, name);
  };
  impl_->get_or_load(name, name, "", std::move(job), std::move(done));
}

std::shared_ptr<const LoraAdapter> AdapterStore::get_merged_sync(const MergeSpec& spec,
                                                                 AdapterSource source) {
  using Result = std::pair<std::shared_ptr<const LoraAdapter>, AdapterError>;
  auto result = std::make_shared<std::promise<Result>>();
  auto fut = result->get_future();
  get_merged(spec, source,
             [result](std::shared_ptr<const LoraAdapter> ad, const AdapterError* error) {
               result->set_value({std::move(ad), error ? *error : AdapterError{}});
             });
  auto [ad, error] = fut.get();
  if (!ad) throw Error(error.message, error.kind);
  return ad;
}

std::vector<LoadedAdapterInfo> AdapterStore::loaded() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<LoadedAdapterInfo> out;
  for (const Impl::Entry& e : impl_->lru)
    out.push_back({e.name, e.folder, e.bytes, e.adapter->max_rank(), e.adapter.use_count() > 1});
  return out;
}

std::vector<std::string> AdapterStore::registered() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::string> out;
  for (const auto& [name, alias] : impl_->aliases) out.push_back(name);
  return out;
}

bool AdapterStore::is_loaded(const std::string& id) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string folder;
  if (auto it = impl_->aliases.find(id); it != impl_->aliases.end()) folder = it->second.folder;
  for (const Impl::Entry& e : impl_->lru)
    if (e.name == id || (!folder.empty() && e.folder == folder)) return true;
  return false;
}

}  // namespace kestrel
