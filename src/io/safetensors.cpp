// safetensors: mmap + validation of single files and model folders (single or
// sharded), and the streamed writer. Layout of a file: u64 little-endian header
// length n, n bytes of JSON, then the data section that the offsets index.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace kestrel {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The Rust reference implementation refuses headers above 100 MB as well.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string errno_str() {
  return std::strerror(errno);
}

// A JSON value for an error message, shortened: headers can be megabytes.
std::string brief(const json& j) {
  std::string s = j.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// The number of bytes of a shape x dtype, or false when it overflows 2^63.
bool shape_nbytes(const Shape& shape, DType dtype, uint64_t* out) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  if (n > static_cast<uint64_t>(INT64_MAX)) return false;
  *out = n;
  return true;
}

}  // namespace

// Read-only mapping of a whole file; unmapped when the last owner goes.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) KESTREL_FAIL(path, ": cannot open: ", errno_str());
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const std::string why = errno_str();
      ::close(fd);
      KESTREL_FAIL(path, ": cannot stat: ", why);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      KESTREL_FAIL(path, ": not a regular file");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const std::string why = errno_str();
        ::close(fd);
        KESTREL_FAIL(path, ": cannot mmap ", size_, " bytes: ", why);
      }
      data_ = static_cast<const std::byte*>(p);
      // Weights are read once, front to back, to upcast them: ask for readahead.
      ::madvise(p, size_, MADV_WILLNEED);
    }
    ::close(fd);  // the mapping keeps the file referenced
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// ---------------------------------------------------------------------------
// SafetensorsFile

namespace {

// Parses one header entry (everything but `__metadata__`) into info, checking
// it against the data section of data_size bytes. begin is the data offset.
void parse_entry(const std::string& path, const std::string& name, const json& entry,
                 uint64_t data_size, TensorInfo* info, uint64_t* begin) {
  const auto where = [&] { return detail::concat(path, ": tensor '", name, "'"); };
  if (!entry.is_object()) KESTREL_FAIL(where(), " is ", brief(entry), ", not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) KESTREL_FAIL(where(), " has no \"", key, "\"");
  }
  const json& dtype = entry["dtype"];
  if (!dtype.is_string()) KESTREL_FAIL(where(), " has dtype ", brief(dtype), ", not a string");
  if (!parse_dtype(dtype.get_ref<const std::string&>(), &info->dtype)) {
    KESTREL_FAIL(where(), " has dtype ", dtype.get_ref<const std::string&>(),
                 ", which kestrel does not handle (F32, F16, BF16, I32, I64, U8)");
  }
  const json& shape = entry["shape"];
  if (!shape.is_array()) KESTREL_FAIL(where(), " has shape ", brief(shape), ", not an array");
  for (const json& d : shape) {
    if (!d.is_number_integer() || (!d.is_number_unsigned() && d.get<int64_t>() < 0)) {
      KESTREL_FAIL(where(), " has shape ", brief(shape),
                   ": dimensions must be non-negative integers");
    }
    if (d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      KESTREL_FAIL(where(), " has shape ", brief(shape), ": dimension too large");
    }
    info->shape.push_back(d.get<int64_t>());
  }
  const json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    KESTREL_FAIL(where(), " has data_offsets ", brief(offsets),
                 ", not [begin, end] of non-negative integers");
  }
  const uint64_t b = offsets[0].get<uint64_t>();
  const uint64_t e = offsets[1].get<uint64_t>();
  if (b > e) KESTREL_FAIL(where(), " has data_offsets [", b, ", ", e, "]: begin > end");
  if (e > data_size) {
    KESTREL_FAIL(where(), " has data_offsets [", b, ", ", e, "] past the end of the data (",
                 data_size, " bytes): file truncated?");
  }
  uint64_t need = 0;
  if (!shape_nbytes(info->shape, info->dtype, &need)) {
    KESTREL_FAIL(where(), " has shape ", shape_str(info->shape), " x ", dtype_name(info->dtype),
                 ", whose byte size overflows");
  }
  if (e - b != need) {
    KESTREL_FAIL(where(), " has data_offsets [", b, ", ", e, "] but shape ", shape_str(info->shape),
                 " x ", dtype_name(info->dtype), " needs ", need, " bytes");
  }
  info->name = name;
  info->file = path;
  info->nbytes = static_cast<size_t>(need);
  *begin = b;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& meta) {
  if (!meta.is_object()) {
    KESTREL_FAIL(path, ": __metadata__ is ", brief(meta), ", not an object of strings");
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string()) {
      KESTREL_FAIL(path, ": __metadata__ entry '", key, "' is ", brief(value), ", not a string");
    }
    out[key] = value.get<std::string>();
  }
  return out;
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto file = std::make_shared<SafetensorsFile>();
  file->path_ = path;
  file->map_ = std::make_shared<MappedFile>(path);
  const std::byte* bytes = file->map_->data();
  const uint64_t size = file->map_->size();
  if (size < 8) {
    KESTREL_FAIL(path, ": file is ", size, " bytes, shorter than the 8-byte header length");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_len > size - 8) {
    KESTREL_FAIL(path, ": header length ", header_len, " is beyond the file (", size,
                 " bytes, so at most ", size - 8, "): truncated or not a safetensors file");
  }
  if (header_len > kMaxHeaderBytes) {
    KESTREL_FAIL(path, ": header length ", header_len, " exceeds the ", kMaxHeaderBytes,
                 "-byte limit");
  }
  const char* text = reinterpret_cast<const char*>(bytes + 8);
  json header;
  try {
    header = json::parse(text, text + header_len);
  } catch (const json::exception& e) {
    KESTREL_FAIL(path, ": header (", header_len, " bytes) is not valid JSON: ", e.what());
  }
  if (!header.is_object()) {
    KESTREL_FAIL(path, ": header is a JSON ", header.type_name(), ", not an object");
  }

  const uint64_t data_size = size - 8 - header_len;
  const std::byte* data = bytes + 8 + header_len;
  std::vector<std::pair<uint64_t, const TensorInfo*>> ranges;  // (begin, tensor)
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      file->metadata_ = parse_metadata(path, entry);
      continue;
    }
    TensorInfo info;
    uint64_t begin = 0;
    parse_entry(path, name, entry, data_size, &info, &begin);
    info.data = data + begin;
    const TensorInfo& stored = file->tensors_[name] = std::move(info);
    if (stored.nbytes > 0) ranges.emplace_back(begin, &stored);
  }

  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : a.second->name < b.second->name;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const auto& [pb, prev] = ranges[i - 1];
    const auto& [cb, cur] = ranges[i];
    if (cb < pb + prev->nbytes) {
      KESTREL_FAIL(path, ": tensor '", cur->name, "' at data_offsets [", cb, ", ", cb + cur->nbytes,
                   "] overlaps tensor '", prev->name, "' at [", pb, ", ", pb + prev->nbytes, "]");
    }
  }
  return file;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------------------
// WeightStore

namespace {

json read_json_file(const std::string& path) {
  auto map = std::make_shared<MappedFile>(path);
  const char* text = reinterpret_cast<const char*>(map->data());
  try {
    return json::parse(text, text + map->size());
  } catch (const json::exception& e) {
    KESTREL_FAIL(path, ": not valid JSON: ", e.what());
  }
}

// The weight_map of an index (tensor name -> shard file), validated.
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  const json index = read_json_file(index_path);
  if (!index.is_object())
    KESTREL_FAIL(index_path, ": a JSON ", index.type_name(), ", not an object");
  if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
    KESTREL_FAIL(index_path, ": no \"weight_map\" object (tensor name -> shard file)");
  }
  if (index.contains("metadata") && !index["metadata"].is_object()) {
    KESTREL_FAIL(index_path, ": \"metadata\" is ", brief(index["metadata"]), ", not an object");
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) {
      KESTREL_FAIL(index_path, ": weight_map maps tensor '", name, "' to ", brief(shard),
                   ", not a file name");
    }
    const std::string& file = shard.get_ref<const std::string&>();
    const fs::path p(file);
    if (file.empty() || p.is_absolute() ||
        std::any_of(p.begin(), p.end(), [](const fs::path& c) { return c == ".."; })) {
      KESTREL_FAIL(index_path, ": weight_map maps tensor '", name, "' to '", file,
                   "', which is not a file inside the folder");
    }
    weight_map[name] = file;
  }
  if (weight_map.empty()) KESTREL_FAIL(index_path, ": weight_map lists no tensors");
  return weight_map;
}

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool has_suffix(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

[[noreturn]] void fail_no_safetensors(const std::string& dir,
                                      const std::vector<std::string>& names) {
  std::vector<std::string> torch;
  for (const std::string& n : names) {
    if (has_suffix(n, ".bin") || has_suffix(n, ".pt") || has_suffix(n, ".pth")) torch.push_back(n);
  }
  if (!torch.empty()) {
    KESTREL_FAIL(dir, " holds PyTorch pickle weights (", torch.front(),
                 torch.size() > 1 ? ", ..." : "",
                 ") but no safetensors; kestrel reads safetensors only. Convert the folder with: "
                 "python -c \"from transformers import AutoModelForCausalLM as M; "
                 "M.from_pretrained('",
                 dir, "').save_pretrained('OUT', safe_serialization=True)\"");
  }
  if (names.empty()) KESTREL_FAIL("model folder ", dir, " is empty");
  std::string listing;
  for (size_t i = 0; i < names.size() && i < 8; ++i) listing += (i ? ", " : "") + names[i];
  if (names.size() > 8) listing += ", ...";
  KESTREL_FAIL("model folder ", dir, " holds no ", kSingleFile, ", ", kIndexFile,
               " or other .safetensors file (it holds: ", listing, ")");
}

}  // namespace

WeightStore WeightStore::open_file(const std::string& path) {
  WeightStore store;
  store.where_ = path;
  auto file = SafetensorsFile::open(path);
  for (const auto& [name, info] : file->tensors()) {
    store.index_[name] = &info;
    store.owner_[name] = file;
  }
  store.files_.push_back(std::move(file));
  return store;
}

WeightStore WeightStore::open_folder(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) KESTREL_FAIL("model folder ", dir, " does not exist");
  if (!fs::is_directory(st)) KESTREL_FAIL("model folder ", dir, " is not a directory");
  const fs::path root(dir);

  if (is_file(root / kSingleFile)) {
    WeightStore store = open_file((root / kSingleFile).string());
    store.where_ = dir;
    return store;
  }

  WeightStore store;
  store.where_ = dir;
  // Adds every tensor of a shard; a name in two shards is ambiguous.
  const auto add = [&](std::shared_ptr<SafetensorsFile> file) {
    for (const auto& [name, info] : file->tensors()) {
      auto [it, fresh] = store.index_.emplace(name, &info);
      if (!fresh) {
        KESTREL_FAIL(dir, ": tensor '", name, "' is in two shards: ", it->second->file, " and ",
                     file->path());
      }
      store.owner_[name] = file;
    }
    store.files_.push_back(std::move(file));
  };

  const fs::path index_path = root / kIndexFile;
  if (is_file(index_path)) {
    const std::map<std::string, std::string> weight_map = read_weight_map(index_path.string());
    std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
    for (const auto& [name, shard] : weight_map) {
      if (shards.count(shard)) continue;
      const fs::path shard_path = root / shard;
      if (!is_file(shard_path)) {
        KESTREL_FAIL(index_path.string(), " maps tensor '", name, "' to shard ", shard,
                     ", which does not exist in ", dir);
      }
      shards[shard] = SafetensorsFile::open(shard_path.string());
    }
    for (const auto& [shard, file] : shards) add(file);
    for (const auto& [name, shard] : weight_map) {
      if (shards.at(shard)->find(name) == nullptr) {
        KESTREL_FAIL(index_path.string(), " maps tensor '", name, "' to shard ", shard,
                     ", which does not hold it (", shards.at(shard)->tensors().size(),
                     " tensors there)");
      }
    }
    return store;
  }

  // No index: take every *.safetensors file of the folder (sorted, so stable).
  std::vector<std::string> names;
  std::vector<fs::path> shard_paths;
  for (auto it = fs::directory_iterator(root, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    names.push_back(name);
    if (is_file(it->path()) && has_suffix(name, ".safetensors")) shard_paths.push_back(it->path());
  }
  if (ec) KESTREL_FAIL("cannot list model folder ", dir, ": ", ec.message());
  std::sort(names.begin(), names.end());
  if (shard_paths.empty()) fail_no_safetensors(dir, names);
  std::sort(shard_paths.begin(), shard_paths.end());
  for (const fs::path& p : shard_paths) add(SafetensorsFile::open(p.string()));
  return store;
}

bool WeightStore::contains(const std::string& name) const {
  return index_.count(name) != 0;
}

const TensorInfo& WeightStore::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) KESTREL_FAIL("tensor '", name, "' not found in ", where_);
  return *it->second;
}

const TensorInfo& WeightStore::get(const std::string& name, const Shape& expected) const {
  const TensorInfo& info = get(name);
  if (info.shape != expected) {
    KESTREL_FAIL("tensor '", name, "' in ", info.file, " has shape ", shape_str(info.shape),
                 ", expected ", shape_str(expected));
  }
  return info;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, info] : index_) out.push_back(name);
  return out;
}

Tensor WeightStore::borrow(const std::string& name) const {
  const TensorInfo& info = get(name);
  // The mapping is read-only: writing through this tensor faults.
  return Tensor::borrow(const_cast<std::byte*>(info.data), info.dtype, info.shape, Device::kCpu,
                        owner_.at(name));
}

// ---------------------------------------------------------------------------
// Writing

namespace {

// An open output file written to PATH.partial and renamed into place on
// commit(), so that a failed write never leaves a file that looks complete.
class OutFile {
 public:
  explicit OutFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".partial") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) KESTREL_FAIL(tmp_, ": cannot create: ", errno_str());
  }
  ~OutFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) KESTREL_FAIL(tmp_, ": write failed: ", errno_str());
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  void commit() {
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) {
      ::unlink(tmp_.c_str());
      KESTREL_FAIL(tmp_, ": close failed: ", errno_str());
    }
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const std::string why = errno_str();
      ::unlink(tmp_.c_str());
      KESTREL_FAIL("cannot rename ", tmp_, " to ", path_, ": ", why);
    }
  }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
};

uint64_t spec_nbytes(const std::string& path, const TensorSpec& spec) {
  uint64_t n = 0;
  if (!shape_nbytes(spec.shape, spec.dtype, &n)) {
    KESTREL_FAIL(path, ": cannot write tensor '", spec.name, "' of shape ", shape_str(spec.shape),
                 " x ", dtype_name(spec.dtype), " (negative or overflowing size)");
  }
  return n;
}

void write_json_file(const std::string& path, const json& j) {
  OutFile out(path);
  const std::string text = j.dump(2) + "\n";
  out.write(text.data(), text.size());
  out.commit();
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Data in order of decreasing element size (as the Python writer does), so
  // that with the 8-byte aligned header every tensor is aligned to its dtype.
  std::vector<const TensorSpec*> order;
  std::set<std::string> seen;
  for (const TensorSpec& spec : tensors) {
    KESTREL_CHECK(!spec.name.empty() && spec.name != "__metadata__", path,
                  ": invalid tensor name '", spec.name, "'");
    KESTREL_CHECK(seen.insert(spec.name).second, path, ": tensor '", spec.name, "' given twice");
    KESTREL_CHECK(spec.fill != nullptr, path, ": tensor '", spec.name, "' has no fill function");
    order.push_back(&spec);
  }
  std::stable_sort(order.begin(), order.end(), [](const TensorSpec* a, const TensorSpec* b) {
    return dtype_size(a->dtype) > dtype_size(b->dtype);
  });

  json header = json::object();
  json meta(metadata);
  if (!meta.contains("format")) meta["format"] = "pt";  // transformers insists on it
  header["__metadata__"] = meta;
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const TensorSpec* spec : order) {
    const uint64_t n = spec_nbytes(path, *spec);
    header[spec->name] = {{"dtype", std::string(dtype_name(spec->dtype))},
                          {"shape", spec->shape},
                          {"data_offsets", {offset, offset + n}}};
    offset += n;
    sizes.push_back(n);
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // the format allows trailing spaces

  OutFile out(path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(text.size() >> (8 * i));
  out.write(len, 8);
  out.write(text.data(), text.size());
  std::vector<std::byte> buffer;  // one tensor at a time
  for (size_t i = 0; i < order.size(); ++i) {
    buffer.assign(sizes[i], std::byte{0});
    order[i]->fill(std::span<std::byte>(buffer));
    out.write(buffer.data(), buffer.size());
  }
  out.commit();
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : tensors) {
    KESTREL_CHECK(t.device() == Device::kCpu, path, ": tensor '", name, "' is not on the CPU");
    KESTREL_CHECK(t.defined() || t.numel() == 0, path, ": tensor '", name, "' is undefined");
    Tensor held = t;
    specs.push_back({name, t.dtype(), t.shape(), [held](std::span<std::byte> out) {
                       if (!out.empty()) std::memcpy(out.data(), held.raw(), out.size());
                     }});
  }
  write_safetensors(path, specs);
}

void write_sharded_safetensors(const std::string& dir, const std::vector<TensorSpec>& tensors,
                               size_t max_shard_bytes) {
  KESTREL_CHECK(max_shard_bytes > 0, dir, ": max_shard_bytes must be positive");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) KESTREL_FAIL("cannot create ", dir, ": ", ec.message());
  const fs::path root(dir);

  // Greedy in the given order; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<TensorSpec>> shards(1);
  uint64_t in_shard = 0;
  uint64_t total = 0;
  std::set<std::string> seen;
  for (const TensorSpec& spec : tensors) {
    KESTREL_CHECK(seen.insert(spec.name).second, dir, ": tensor '", spec.name, "' given twice");
    const uint64_t n = spec_nbytes(dir, spec);
    if (!shards.back().empty() && in_shard + n > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(spec);
    in_shard += n;
    total += n;
  }

  // Remove the other layout's entry point so that open_folder cannot pick a stale one.
  if (shards.size() == 1) {
    fs::remove(root / kIndexFile, ec);
    write_safetensors((root / kSingleFile).string(), shards[0]);
    return;
  }
  fs::remove(root / kSingleFile, ec);
  json weight_map = json::object();
  const size_t n_shards = shards.size();
  for (size_t i = 0; i < n_shards; ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, n_shards);
    write_safetensors((root / name).string(), shards[i]);
    for (const TensorSpec& spec : shards[i]) weight_map[spec.name] = name;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_json_file((root / kIndexFile).string(), index);
}

}  // namespace kestrel
