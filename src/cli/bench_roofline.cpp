// Copy bandwidth and BF16 GEMM rate of the device, timed with the ops the model uses.
#include "cli/bench_roofline.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "backend/ops.h"

namespace kestrel::cli {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The fastest of `iters` timed runs of `body` after one untimed run (a limit: the best the
// card did, not its typical).
template <typename Body>
double best_time(Device device, int iters, Body body) {
  std::vector<double> t;
  for (int i = 0; i <= iters; ++i) {
    ops::synchronize(device);
    const double t0 = now_s();
    body();
    ops::synchronize(device);
    if (i > 0) t.push_back(now_s() - t0);
  }
  return *std::min_element(t.begin(), t.end());
}

}  // namespace

Roofline measure_roofline(Device device) {
  Roofline r;
  if (device != Device::kCuda) return r;
  {
    // 1 GiB copied device to device, eight times a timed run (as many bytes as falcon-7b's
    // weights, far past the 50 MiB L2).
    constexpr int64_t kRows = 8192, kWidth = 65536;  // BF16 elements
    Tensor src = ops::random_uniform({kRows, kWidth}, DType::kBF16, device, 7, 1.0f, 0.0f);
    Tensor dst = Tensor::empty(DType::kBF16, {kRows, kWidth}, device);
    constexpr int kCopies = 8;
    const double t = best_time(device, 10, [&] {
      for (int i = 0; i < kCopies; ++i) ops::copy_2d(src, 0, kWidth, dst, 0, kWidth, kRows, kWidth);
    });
    r.copy_bytes_s = 2.0 * static_cast<double>(src.nbytes()) * kCopies / t;
  }
  {
    constexpr int64_t kN = 8192;
    Tensor x = ops::random_uniform({kN, kN}, DType::kBF16, device, 8, 1.0f, 0.0f);
    Tensor w = ops::random_uniform({kN, kN}, DType::kBF16, device, 9, 0.02f, 0.0f);
    Tensor out = Tensor::empty(DType::kBF16, {kN, kN}, device);
    constexpr int kGemms = 10;
    const double t = best_time(device, 10, [&] {
      for (int i = 0; i < kGemms; ++i) ops::linear(x, w, Tensor(), out);
    });
    r.gemm_n = kN;
    r.gemm_flops_s = 2.0 * kN * kN * kN * kGemms / t;
  }
  ops::release_cached_memory(device);
  ops::reset_peak_memory(device);
  return r;
}

}  // namespace kestrel::cli
