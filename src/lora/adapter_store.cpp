// The adapter store: one loader thread with a queue of folders to read, the loaded adapters in
// LRU order (front: most recently used), concurrent gets of one folder joined on one load.
// Eviction takes only adapters whose shared_ptr the store alone holds (no request leases them).
#include "lora/adapter_store.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
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

#include "core/error.h"
#include "core/logging.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;

constexpr double kMiB = 1048576.0;

// The canonical form of an existing folder (the dedup key).
std::string canonical_dir(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::canonical(p, ec);
  return ec ? fs::absolute(p).lexically_normal().string() : c.string();
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
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
  if (const char* v = std::getenv("HF_HUB_CACHE"); v && *v) return v;
  if (const char* v = std::getenv("HF_HOME"); v && *v) return (fs::path(v) / "hub").string();
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : ".") / ".cache" / "huggingface" / "hub").string();
}

std::string trim(std::string s) {
  const char* ws = " \t\r\n";
  s.erase(0, s.find_first_not_of(ws));
  const size_t last = s.find_last_not_of(ws);
  s.erase(last == std::string::npos ? 0 : last + 1);
  return s;
}

}  // namespace

AdapterSource parse_adapter_source(const std::string& s) {
  if (s == "local") return AdapterSource::kLocal;
  if (s == "hub") return AdapterSource::kHub;
  KESTREL_FAIL("adapter_source '", s, "' is not supported (local or hub)");
}

struct AdapterStore::Impl {
  struct Entry {
    std::string name, folder;
    std::shared_ptr<const LoraAdapter> adapter;
    int64_t bytes = 0;
  };
  struct Pending {
    std::string name;
    std::vector<Callback> waiters;
  };

  Loader loader;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::list<Entry> lru;                        // front: most recently used
  std::map<std::string, std::string> aliases;  // --adapter NAME -> its folder
  std::map<std::string, Pending> pending;      // folder -> the gets waiting on its load
  std::deque<std::string> queue;               // folders not yet started
  bool stopping = false;
  std::thread thread;

  std::list<Entry>::iterator find_folder(const std::string& folder) {
    for (auto it = lru.begin(); it != lru.end(); ++it)
      if (it->folder == folder) return it;
    return lru.end();
  }
  int64_t loaded_bytes() const {
    int64_t n = 0;
    for (const Entry& e : lru) n += e.bytes;
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

  // The loader, its exceptions as a message.
  std::shared_ptr<const LoraAdapter> load(const std::string& folder, const std::string& name,
                                          std::string& error) {
    try {
      std::shared_ptr<const LoraAdapter> ad = loader(folder, name);
      if (!ad) error = "the loader returned no adapter for " + folder;
      return ad;
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown error loading " + folder;
    }
    return nullptr;
  }

  static void call(const Callback& cb, std::shared_ptr<const LoraAdapter> ad,
                   const std::string& error) {
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
      const std::string name = pending[folder].name;
      std::vector<std::shared_ptr<const LoraAdapter>> dropped;
      std::string error = make_room_for_one(o, dropped);
      std::shared_ptr<const LoraAdapter> ad;
      if (error.empty()) {
        lock.unlock();
        dropped.clear();
        const auto t0 = std::chrono::steady_clock::now();
        ad = load(folder, name, error);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        lock.lock();
        if (auto it = find_folder(folder); ad && it != lru.end()) {
          ad = it->adapter;  // preloaded meanwhile
        } else if (ad) {
          error = insert(o, name, folder, ad, dropped);
          if (error.empty())
            spdlog::info("adapter store: loaded {} from {} ({:.1f} MiB, max rank {}) in {:.2f} s",
                         name, folder, ad->bytes() / kMiB, ad->max_rank(), s);
          else
            ad.reset();
        }
      }
      if (!error.empty()) {
        error = "adapter '" + name + "': " + error;
        spdlog::warn("adapter store: {}", error);
      }
      std::vector<Callback> waiters = std::move(pending[folder].waiters);
      pending.erase(folder);
      lock.unlock();
      dropped.clear();
      for (const Callback& cb : waiters) call(cb, ad, error);
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
  if (options_.hub_cache.empty()) options_.hub_cache = default_hub_cache();
  impl_->loader = std::move(loader);
  impl_->thread = std::thread([this] { impl_->run(options_); });
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
  for (const Callback& cb : failed) Impl::call(cb, nullptr, "server shutting down");
  impl_->thread.join();
}

std::string AdapterStore::resolve(const std::string& id, AdapterSource source) const {
  if (id.empty()) KESTREL_FAIL("adapter_id is empty");
  if (source == AdapterSource::kHub) {
    // "ORG/NAME" (or "NAME"): plain components only.
    const size_t slash = id.find('/');
    if (!safe_relative(id) || (slash != std::string::npos && id.find('/', slash + 1) != id.npos))
      KESTREL_FAIL("adapter_id '", id,
                   "' is not a Hugging Face repository id (ORG/NAME, no '..' or empty parts)");
    std::string repo = "models--" + id;
    if (slash != std::string::npos) repo.replace(8 + slash, 1, "--");
    const fs::path root = fs::path(options_.hub_cache) / repo;
    const fs::path snapshots = root / "snapshots";
    std::ifstream ref(root / "refs" / "main");
    if (ref.good()) {
      std::string rev((std::istreambuf_iterator<char>(ref)), std::istreambuf_iterator<char>());
      rev = trim(rev);
      const fs::path dir = snapshots / rev;
      if (safe_relative(rev) && rev.find('/') == std::string::npos && is_dir(dir))
        return canonical_dir(dir);
      KESTREL_FAIL("adapter '", id, "' (hub): ", (root / "refs" / "main").string(), " names '", rev,
                   "' but ", dir.string(),
                   " is not a folder; kestrel never downloads adapters, put the snapshot in "
                   "the Hugging Face cache first (huggingface-cli download)");
    }
    std::vector<fs::path> snaps;
    std::error_code ec;
    if (is_dir(snapshots))
      for (const auto& e : fs::directory_iterator(snapshots, ec))
        if (is_dir(e.path())) snaps.push_back(e.path());
    if (snaps.size() == 1) return canonical_dir(snaps[0]);
    if (snaps.empty())
      KESTREL_FAIL("adapter '", id, "' (hub) is not in the Hugging Face cache: looked at ",
                   snapshots.string(),
                   " (HF_HUB_CACHE); kestrel never downloads adapters, put the snapshot there "
                   "first (huggingface-cli download)");
    KESTREL_FAIL("adapter '", id, "' (hub): ", snapshots.string(), " holds ", snaps.size(),
                 " snapshots and there is no refs/main to choose one");
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (auto it = impl_->aliases.find(id); it != impl_->aliases.end()) return it->second;
  }
  if (is_dir(id)) return canonical_dir(id);
  if (options_.adapters_dir.empty())
    KESTREL_FAIL("adapter '", id, "' (local): no folder ", id,
                 " and no --adapters-dir to look it up in");
  if (!safe_relative(id))
    KESTREL_FAIL("adapter '", id, "' (local): no folder ", id,
                 ", and a name under --adapters-dir may not be absolute or hold '..' or empty "
                 "parts");
  const fs::path under = fs::path(options_.adapters_dir) / id;
  if (is_dir(under)) return canonical_dir(under);
  KESTREL_FAIL("adapter '", id, "' (local) not found: no folder ", id, " and no folder ",
               under.string(), " (--adapters-dir)");
}

void AdapterStore::preload(const std::string& name, const std::string& dir) {
  KESTREL_CHECK(!name.empty(), "an adapter name must not be empty (NAME=DIR)");
  if (!is_dir(dir)) KESTREL_FAIL("adapter '", name, "': folder ", dir, " does not exist");
  const std::string folder = canonical_dir(dir);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (auto it = impl_->aliases.find(name); it != impl_->aliases.end() && it->second != folder)
      KESTREL_FAIL("adapter name '", name, "' is given twice (", it->second, " and ", folder, ")");
    if (impl_->find_folder(folder) != impl_->lru.end()) {
      impl_->aliases[name] = folder;
      return;
    }
  }
  std::string error;
  std::shared_ptr<const LoraAdapter> ad = impl_->load(folder, name, error);
  if (!ad) KESTREL_FAIL("adapter '", name, "': ", error);
  std::vector<std::shared_ptr<const LoraAdapter>> dropped;
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->find_folder(folder) == impl_->lru.end()) {
    error = impl_->insert(options_, name, folder, ad, dropped);
    if (!error.empty()) KESTREL_FAIL("adapter '", name, "': ", error);
  }
  impl_->aliases[name] = folder;
  spdlog::info("adapter store: preloaded {} from {} ({:.1f} MiB, max rank {})", name, folder,
               ad->bytes() / kMiB, ad->max_rank());
}

void AdapterStore::get(const std::string& id, AdapterSource source, Callback done) {
  std::string folder;
  try {
    folder = resolve(id, source);
  } catch (const std::exception& e) {
    Impl::call(done, nullptr, e.what());
    return;
  }
  std::shared_ptr<const LoraAdapter> ad;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopping) {
      ad = nullptr;
    } else if (auto it = impl_->find_folder(folder); it != impl_->lru.end()) {
      impl_->lru.splice(impl_->lru.begin(), impl_->lru, it);  // LRU touch
      ad = it->adapter;
    } else {
      auto [p, fresh] = impl_->pending.try_emplace(folder);
      if (fresh) {
        p->second.name = id;
        impl_->queue.push_back(folder);
      }
      p->second.waiters.push_back(std::move(done));
      impl_->cv.notify_one();
      return;
    }
  }
  if (!ad) {
    Impl::call(done, nullptr, "server shutting down");
    return;
  }
  Impl::call(done, std::move(ad), "");
}

std::shared_ptr<const LoraAdapter> AdapterStore::get_sync(const std::string& id,
                                                          AdapterSource source) {
  auto result =
      std::make_shared<std::promise<std::pair<std::shared_ptr<const LoraAdapter>, std::string>>>();
  auto fut = result->get_future();
  get(id, source, [result](std::shared_ptr<const LoraAdapter> ad, const std::string& error) {
    result->set_value({std::move(ad), error});
  });
  auto [ad, error] = fut.get();
  if (!ad) throw Error(error);
  return ad;
}

std::vector<LoadedAdapterInfo> AdapterStore::loaded() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<LoadedAdapterInfo> out;
  for (const Impl::Entry& e : impl_->lru)
    out.push_back({e.name, e.folder, e.bytes, e.adapter->max_rank(), e.adapter.use_count() > 1});
  return out;
}

bool AdapterStore::is_loaded(const std::string& id) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string folder;
  if (auto it = impl_->aliases.find(id); it != impl_->aliases.end()) folder = it->second;
  for (const Impl::Entry& e : impl_->lru)
    if (e.name == id || (!folder.empty() && e.folder == folder)) return true;
  return false;
}

}  // namespace kestrel
