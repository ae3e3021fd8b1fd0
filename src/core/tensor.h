// Tensor: a dtype, a shape, a device and storage that is either owned
// (allocated here) or borrowed (an mmapped file, a caller's buffer). Row-major,
// contiguous; views share storage.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace kestrel {

enum class Device : uint8_t { kCpu, kCuda };

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);  // "[3, 64]"
int64_t shape_numel(const Shape& shape);

// Allocation for a device other than the CPU is registered by its backend.
struct DeviceAllocator {
  void* (*alloc)(size_t nbytes) = nullptr;
  void (*free)(void* ptr) = nullptr;
};
void register_device_allocator(Device device, DeviceAllocator allocator);

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(DType dtype, Shape shape, Device device = Device::kCpu);
  static Tensor zeros(DType dtype, Shape shape);  // CPU only
  // Wraps memory the tensor does not own; keepalive (optional) holds its owner alive.
  static Tensor borrow(void* data, DType dtype, Shape shape, Device device = Device::kCpu,
                       std::shared_ptr<void> keepalive = nullptr);

  bool defined() const { return data_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }

  // Same storage, new shape of the same element count.
  Tensor view(Shape shape) const;
  // Rows [begin, end) of the first dimension, sharing storage.
  Tensor rows(int64_t begin, int64_t end) const;

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  Shape shape_;
};

}  // namespace kestrel
