// safetensors reading (mmap, validated before use) and writing (streamed, so
// that multi-GB random models never sit whole in memory). A model folder holds
// one `model.safetensors` or shards listed by `model.safetensors.index.json`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace kestrel {

// One tensor inside a mapped file; `data` points into the mapping.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // the file it lives in, for error messages
};

class MappedFile;  // read-only mmap of a whole file

// One .safetensors file, mapped and fully validated on open: header length
// within the file, valid JSON, known dtypes, offsets inside the data, no
// overlaps, byte size = shape x dtype. Every failure throws kestrel::Error
// naming the file, the tensor and the numbers.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;

 private:
  std::string path_;
  std::shared_ptr<MappedFile> map_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model folder (single file or sharded index). The files stay
// mapped as long as the store (or a Tensor borrowed from it) lives.
class WeightStore {
 public:
  // Throws naming the folder when it holds no safetensors (and says to convert
  // when it holds only pytorch_model*.bin), when the index is malformed, names a
  // missing shard, or maps a tensor to a shard that does not hold it.
  static WeightStore open_folder(const std::string& dir);
  // A single file (tests, expected.safetensors).
  static WeightStore open_file(const std::string& path);

  bool contains(const std::string& name) const;
  // Throws "tensor NAME not found in DIR" when absent.
  const TensorInfo& get(const std::string& name) const;
  // get() plus a shape check: "tensor NAME in FILE has shape [..], expected [..]".
  const TensorInfo& get(const std::string& name, const Shape& expected) const;
  std::vector<std::string> names() const;
  // A Tensor borrowing the mapped bytes (keeps the file mapped).
  Tensor borrow(const std::string& name) const;

 private:
  std::string where_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> index_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> owner_;
};

// Declares one tensor of a file to write; `fill` writes its bytes.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::function<void(std::span<std::byte> out)> fill;
};

// Writes a .safetensors file: header first (offsets from the specs), then each
// tensor's bytes through its fill function, one tensor in memory at a time.
void write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Convenience for small tensors already in memory (tests, `kestrel logits`).
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors);

}  // namespace kestrel

namespace kestrel {
// Writes the specs into DIR as `model-0000i-of-0000n.safetensors` shards of at
// most max_shard_bytes each plus `model.safetensors.index.json` (or a single
// `model.safetensors` when everything fits one shard).
void write_sharded_safetensors(const std::string& dir, const std::vector<TensorSpec>& tensors,
                               size_t max_shard_bytes);
}  // namespace kestrel
