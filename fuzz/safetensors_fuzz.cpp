// libFuzzer target: SafetensorsFile::open on arbitrary bytes must either throw
// kestrel::Error or return tensors whose bytes all lie inside the file.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

// One scratch file per fuzzing process (parallel jobs must not share it).
const std::string& scratch_path() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/kestrel-st-fuzz-" + std::to_string(::getpid()) +
           ".safetensors";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = scratch_path();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto file = kestrel::SafetensorsFile::open(path);
    uint64_t total = 0;
    for (const auto& [name, info] : file->tensors()) {
      const uint64_t need =
          static_cast<uint64_t>(kestrel::shape_numel(info.shape)) * kestrel::dtype_size(info.dtype);
      if (need != info.nbytes || info.name != name) std::abort();
      total += info.nbytes;
      // Touch the first and last byte: a range outside the mapping faults here.
      if (info.nbytes > 0) {
        volatile std::byte first = info.data[0];
        volatile std::byte last = info.data[info.nbytes - 1];
        (void)first;
        (void)last;
      }
    }
    if (total > size) std::abort();  // ranges do not overlap, so they fit the file
  } catch (const kestrel::Error&) {
  }
  return 0;
}
