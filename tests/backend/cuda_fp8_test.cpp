// FP8 weights on CUDA against their CPU twins: ops::quantize_fp8 (code for code, scale for scale
// on the same BF16 values), the weight-only FP8 GEMV for 1..8 rows against the CPU's weight-only
// FP8 linear, and the FP8 tensor-core GEMM (more rows, or any with fp8_activations) against the
// CPU's FP8 linear with activations rounded per token the same way: every epilogue, per-row and
// per-tensor scales, bf16 and f32 out, on fresh random inputs of several shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/ops.h"
#include "cuda_test_util.h"
#ifdef KESTREL_CUDA
#include "backend/cuda/kernels.h"
#endif

namespace kestrel {
namespace {

// Rows the FP8 GEMV serves with BF16 activations; cuBLASLt's FP8 GEMM rounds them from the next
// row on, so the CPU reference does the same.
#ifdef KESTREL_CUDA
constexpr int64_t kGemvRows = cuda::kernels::kFp8GemvMaxRows;
#else
constexpr int64_t kGemvRows = 2;
#endif

using namespace test;  // NOLINT(google-build-using-namespace): the shared test helpers

constexpr double kBound = 1e-2;

TEST(CudaFp8, QuantizeMatchesTheCpuCodeForCode) {
  REQUIRE_GPU();
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 16}, {7, 300}, {64, 4544}}) {
    Tensor w = random_host({rows, cols}, -0.05f, 0.05f);
    for (int64_t c = 0; c < cols; ++c) w.data<float>()[c] = 0.0f;  // a row of zeros
    if (rows > 3) w.data<float>()[3 * cols + 1] = 6.5f;            // an outlier
    Tensor q_cpu, s_cpu, q_gpu, s_gpu;
    ops::quantize_fp8(w, q_cpu, s_cpu);
    ops::quantize_fp8(to_gpu_bf16(w), q_gpu, s_gpu);
    ASSERT_EQ(q_gpu.dtype(), DType::kF8E4M3);
    Tensor s_host = ops::to_host_f32(s_gpu);
    const Tensor q_host = ops::to_device(q_gpu, Device::kCpu);  // the codes, as bytes
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(s_host.data<float>()[r], s_cpu.data<float>()[r]);
    int64_t differ = 0;
    for (int64_t i = 0; i < rows * cols; ++i)
      differ += q_host.data<uint8_t>()[i] != q_cpu.data<uint8_t>()[i];
    EXPECT_EQ(differ, 0) << rows << "x" << cols;
  }
}

struct Case {
  int64_t n, in, out;
  bool bias, f32_out, gelu, accumulate, addend, per_tensor;
  bool fp8_activations = false;  // else as the CUDA default: rounded from 9 rows on
};

double check(const Case& c) {
  Tensor x = random_host({c.n, c.in}), w = random_host({c.out, c.in}, -0.1f, 0.1f);
  Tensor b = c.bias ? random_host({c.out}) : Tensor();
  Tensor q, s;
  ops::quantize_fp8(w, q, s);
  if (c.per_tensor) {
    s = Tensor::empty(DType::kF32, {1});
    s.data<float>()[0] = 0.0003f;
  }
  Tensor start =
      c.accumulate ? random_host({c.n, c.out}) : Tensor::empty(DType::kF32, {c.n, c.out});
  if (!c.accumulate) std::fill(start.data<float>(), start.data<float>() + start.numel(), NAN);
  Tensor ref = Tensor::empty(DType::kF32, {c.n, c.out});
  std::copy(start.data<float>(), start.data<float>() + start.numel(), ref.data<float>());
  Tensor add_host = c.addend ? random_host({c.n, c.out}) : Tensor();
  ops::linear(x, q, b, ref,
              {.gelu = c.gelu,
               .accumulate = c.accumulate,
               .addend = c.addend ? &add_host : nullptr,
               .weight_scale = &s,
               .fp8_activations = c.fp8_activations || c.n > kGemvRows});
  // The same codes and scales on the device (the codes travel as bytes).
  Tensor q_gpu = ops::to_device(q, Device::kCuda);
  Tensor s_gpu = ops::to_device(s, Device::kCuda);
  Tensor out = to_gpu(start, c.f32_out ? DType::kF32 : DType::kBF16);
  Tensor add_gpu = c.addend ? to_gpu_bf16(add_host) : Tensor();
  Tensor b_gpu = c.bias ? to_gpu_bf16(b) : Tensor();
  ops::linear(to_gpu_bf16(x), q_gpu, b_gpu, out,
              {.gelu = c.gelu,
               .accumulate = c.accumulate,
               .addend = c.addend ? &add_gpu : nullptr,
               .weight_scale = &s_gpu,
               .fp8_activations = c.fp8_activations});
  return norm_error(ops::to_host_f32(out), ref);
}

TEST(CudaFp8, LinearMatchesCpu) {
  REQUIRE_GPU();
  std::vector<Case> cases;
  for (bool act : {false, true})
    for (int64_t n : {1, 2, 3, 5, 8, 9, 40, 129})
      for (const auto& [in, out] : {std::pair<int64_t, int64_t>{64, 48}, {4544, 96}, {160, 4672}}) {
        cases.push_back({n, in, out, false, false, false, false, false, false, act});
        cases.push_back({n, in, out, true, false, true, false, false, false, act});
        cases.push_back({n, in, out, false, true, false, true, false, false, act});
        cases.push_back({n, in, out, true, false, false, true, true, false, act});
        cases.push_back({n, in, out, false, false, false, false, false, true, act});
        cases.push_back({n, in, out, true, true, true, true, false, false, act});
      }
  // k % 16 != 0: neither FP8 kernel takes it (dequantized weights, activations rounded where due)
  cases.push_back({2, 40, 24, true, false, true, false, false, false});
  cases.push_back({12, 40, 24, true, false, true, false, false, false});
  cases.push_back({3, 40, 24, false, false, false, false, false, false, true});
  for (const Case& c : cases)
    EXPECT_LE(check(c), kBound) << c.n << "x" << c.in << "x" << c.out << " bias " << c.bias
                                << " f32 " << c.f32_out << " gelu " << c.gelu << " acc "
                                << c.accumulate << " addend " << c.addend << " tensor scale "
                                << c.per_tensor << " fp8 activations " << c.fp8_activations;
}

}  // namespace
}  // namespace kestrel
