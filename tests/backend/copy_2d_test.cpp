// ops::copy_2d: the CPU copy against index arithmetic, the CUDA one against the CPU one (skipped
// without a GPU), and its bounds checks.
#include <gtest/gtest.h>

#include <numeric>

#include "backend/ops.h"
#include "core/error.h"

namespace kestrel {
namespace {

TEST(Copy2d, CpuBlockLandsAtItsOffsets) {
  Tensor src = Tensor::empty(DType::kF32, {4, 10});
  std::iota(src.data<float>(), src.data<float>() + 40, 0.0f);
  Tensor dst = Tensor::zeros(DType::kF32, {3, 7});
  ops::copy_2d(src, 12, 10, dst, 3, 7, 3, 4);  // rows 1..3 of src, columns 2..5
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 7; ++j) {
      const float want = j >= 3 ? static_cast<float>(12 + i * 10 + (j - 3)) : 0.0f;
      EXPECT_EQ(dst.data<float>()[i * 7 + j], want) << i << "," << j;
    }
  EXPECT_THROW(ops::copy_2d(src, 12, 10, dst, 4, 7, 3, 4), Error);  // leaves dst
  EXPECT_THROW(ops::copy_2d(src, 0, 3, dst, 0, 7, 2, 4), Error);    // width > stride
}

TEST(Copy2d, CudaMatchesCpu) {
  if (ops::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  Tensor src = Tensor::empty(DType::kF32, {5, 33});
  std::iota(src.data<float>(), src.data<float>() + src.numel(), 1.0f);
  Tensor want = Tensor::zeros(DType::kF32, {5, 70});
  ops::copy_2d(src, 0, 33, want, 37, 70, 5, 33);
  Tensor dsrc = ops::to_device(src, Device::kCuda);
  Tensor ddst = ops::to_device(Tensor::zeros(DType::kF32, {5, 70}), Device::kCuda);
  ops::copy_2d(dsrc, 0, 33, ddst, 37, 70, 5, 33);
  Tensor got = ops::to_host_f32(ddst);
  for (int64_t i = 0; i < want.numel(); ++i)
    ASSERT_EQ(got.data<float>()[i], want.data<float>()[i]) << i;

  // One contiguous block (pitch = width) goes through the copy kernel when 16-byte aligned
  // (offset 4: aligned; offset 1 or an odd width: the copy engine).
  for (auto [offset, width] : {std::pair<int64_t, int64_t>{4, 32}, {1, 32}, {4, 33}}) {
    Tensor whole = Tensor::zeros(DType::kF32, {1, 200});
    ops::copy_2d(src, 0, width, whole, offset, width, 5 * 33 / width, width);
    Tensor dwhole = ops::to_device(Tensor::zeros(DType::kF32, {1, 200}), Device::kCuda);
    ops::copy_2d(dsrc, 0, width, dwhole, offset, width, 5 * 33 / width, width);
    const Tensor back = ops::to_host_f32(dwhole);
    for (int64_t i = 0; i < whole.numel(); ++i)
      ASSERT_EQ(back.data<float>()[i], whole.data<float>()[i])
          << offset << "/" << width << ": " << i;
  }
}

}  // namespace
}  // namespace kestrel
