// The adapter store tests' fixtures: a temporary folder, a fake loader held by a gate, and a get
// whose callback can be waited for.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "lora/adapter_store.h"

namespace kestrel::test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A folder of its own under /tmp, removed at the end.
struct TmpDir {
  fs::path path;
  TmpDir() {
    static std::atomic<int> n{0};
    path = fs::temp_directory_path() /
           ("kestrel_store_test_" + std::to_string(getpid()) + "_" + std::to_string(n++));
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
  std::string make(const std::string& rel) const {
    fs::create_directories(path / rel);
    return fs::canonical(path / rel).string();
  }
};

// The fake loader's state: calls per folder name, sizes, failures to throw, a gate loads wait on.
struct Fake {
  std::mutex mu;
  std::condition_variable cv;
  bool open = true;
  int started = 0;
  std::map<std::string, int> calls;      // by the folder's last component
  std::map<std::string, int64_t> bytes;  // by the folder's last component (default 400)
  std::set<std::string> fail_once;       // folders whose next load throws
  std::vector<std::thread::id> threads;  // thread of every load

  AdapterStore::Loader loader() {
    return [this](const std::string& dir, const std::string& name) {
      const std::string key = fs::path(dir).filename().string();
      std::unique_lock<std::mutex> lock(mu);
      ++calls[key];
      ++started;
      threads.push_back(std::this_thread::get_id());
      cv.notify_all();
      cv.wait(lock, [&] { return open; });
      if (fail_once.erase(key)) KESTREL_FAIL("fake loader: ", dir, " is broken");
      const int64_t b = bytes.count(key) ? bytes[key] : 400;
      auto ad = std::make_shared<LoraAdapter>(name, dir, 1, 1);
      LoraLinear& l = ad->mutable_linear(0, 0, LoraModule::kQkv);
      l.a = Tensor::zeros(DType::kF32, {1, b / 4 - 1});
      l.b = Tensor::zeros(DType::kF32, {1, 1});
      l.scale = 1.0f;
      return std::shared_ptr<const LoraAdapter>(ad);
    };
  }
  void set_open(bool o) {
    std::lock_guard<std::mutex> lock(mu);
    open = o;
    cv.notify_all();
  }
  void wait_started(int n) {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return started >= n; })) << "no load started";
  }
  int calls_of(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu);
    return calls[key];
  }
};

inline std::vector<std::string> names(const AdapterStore& s) {
  std::vector<std::string> out;
  for (const LoadedAdapterInfo& i : s.loaded()) out.push_back(i.name);
  return out;
}

inline std::string error_of(const std::function<void()>& f, ErrorKind* kind = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  return "(no error)";
}

// A get whose callback result can be waited for.
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::shared_ptr<const LoraAdapter> adapter;
  std::string error, detail;
  ErrorKind kind = ErrorKind::kInternal;
  std::thread::id thread;
  AdapterStore::Callback callback() {
    return [this](std::shared_ptr<const LoraAdapter> ad, const AdapterError* err) {
      std::lock_guard<std::mutex> lock(mu);
      adapter = std::move(ad);
      error = err ? err->message : "";
      detail = err ? err->detail : "";
      if (err) kind = err->kind;
      thread = std::this_thread::get_id();
      done = true;
      cv.notify_all();
    };
  }
  bool wait(std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return done; });
  }
};

}  // namespace kestrel::test
