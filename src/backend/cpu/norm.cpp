// CPU LayerNorm over the last dim (two-pass mean / variance, double accumulators).
#include <cmath>

#include "backend/cpu/cpu_ops.h"

namespace kestrel::cpu {

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) {
  const int64_t n_tokens = x.dim(0), hidden = x.dim(1);
  const float* w = weight.data<float>();
  const float* b = bias.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xr = x.data<float>() + t * hidden;
    float* yr = out.data<float>() + t * hidden;
    double mean = 0.0;
    for (int64_t i = 0; i < hidden; ++i) mean += xr[i];
    mean /= static_cast<double>(hidden);
    double var = 0.0;
    for (int64_t i = 0; i < hidden; ++i) {
      const double c = xr[i] - mean;
      var += c * c;
    }
    var /= static_cast<double>(hidden);
    const float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
    const float m = static_cast<float>(mean);
    for (int64_t i = 0; i < hidden; ++i) yr[i] = (xr[i] - m) * inv * w[i] + b[i];
  }
}

}  // namespace kestrel::cpu
