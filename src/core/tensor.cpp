// Tensor storage: 64-byte aligned host memory, or a registered device allocator.
#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace kestrel {

namespace {
DeviceAllocator g_allocators[2];
}

void register_device_allocator(Device device, DeviceAllocator allocator) {
  g_allocators[static_cast<int>(device)] = allocator;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::empty(DType dtype, Shape shape, Device device) {
  for (int64_t d : shape) KESTREL_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.dtype_ = dtype;
  t.device_ = device;
  t.shape_ = std::move(shape);
  const size_t bytes = std::max<size_t>(t.nbytes(), 1);
  if (device == Device::kCpu) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    KESTREL_CHECK(p != nullptr, "out of host memory allocating ", bytes, " bytes");
    t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } else {
    const DeviceAllocator& a = g_allocators[static_cast<int>(device)];
    KESTREL_CHECK(a.alloc != nullptr, "no allocator registered for this device");
    void* p = a.alloc(bytes);
    t.storage_ = std::shared_ptr<void>(p, a.free);
  }
  t.data_ = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t = empty(dtype, std::move(shape));
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::borrow(void* data, DType dtype, Shape shape, Device device,
                      std::shared_ptr<void> keepalive) {
  Tensor t;
  t.storage_ = std::move(keepalive);
  t.data_ = data;
  t.dtype_ = dtype;
  t.device_ = device;
  t.shape_ = std::move(shape);
  return t;
}

int64_t Tensor::dim(int i) const {
  const int n = ndim();
  const int j = i < 0 ? i + n : i;
  KESTREL_CHECK(j >= 0 && j < n, "dimension ", i, " out of range for shape ", shape_str(shape_));
  return shape_[j];
}

Tensor Tensor::view(Shape shape) const {
  KESTREL_CHECK(shape_numel(shape) == numel(), "cannot view ", shape_str(shape_), " as ",
                shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  KESTREL_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0], "rows [", begin,
                ", ", end, ") out of range for shape ", shape_str(shape_));
  Tensor t = *this;
  const size_t row_bytes = shape_[0] ? nbytes() / shape_[0] : 0;
  t.data_ = static_cast<char*>(data_) + begin * row_bytes;
  t.shape_[0] = end - begin;
  return t;
}

}  // namespace kestrel
