// CPU linear: out [T, n_out] = epilogue(x [T, n_in] @ weight [n_out, in]^T + bias).
// OpenBLAS sgemm when built with it; otherwise a blocked OpenMP dot-product
// loop (weights are row-major [out, in], so each output is a contiguous dot).
// The epilogue (GELU, accumulate into out) follows ops::LinearEpilogue.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_ops.h"
#include "backend/ops.h"
#ifdef KESTREL_OPENBLAS
#include <cblas.h>
#endif

namespace kestrel::cpu {

namespace {

// y [T, n_out] = x @ weight^T (+ bias when defined).
void matmul_bias(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y) {
  const int64_t n_tokens = x.dim(0), n_in = x.dim(1), n_out = weight.dim(0);
  const float* xp = x.data<float>();
  const float* wp = weight.data<float>();
  float* op = y.data<float>();
#ifdef KESTREL_OPENBLAS
  // OpenBLAS's own threads fight the OpenMP pool for the cores on the small
  // GEMMs of decode (measured: 2.5x slower generate on 2 cores); only wide
  // prefill GEMMs get them.
  static const int kMaxThreads = openblas_get_num_threads();
  openblas_set_num_threads(n_tokens >= 32 ? kMaxThreads : 1);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n_tokens),
              static_cast<int>(n_out), static_cast<int>(n_in), 1.0f, xp, static_cast<int>(n_in), wp,
              static_cast<int>(n_in), 0.0f, op, static_cast<int>(n_out));
#else
  constexpr int64_t kRowBlock = 4;
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < n_out; ++o) {
    const float* w = wp + o * n_in;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kRowBlock) {
      const int64_t t1 = std::min(n_tokens, t0 + kRowBlock);
      for (int64_t t = t0; t < t1; ++t) {
        const float* xr = xp + t * n_in;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < n_in; ++i) acc += xr[i] * w[i];
        op[t * n_out + o] = acc;
      }
    }
  }
#endif
  if (bias.defined()) {
    const float* b = bias.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n_tokens; ++t) {
      float* row = op + t * n_out;
      for (int64_t o = 0; o < n_out; ++o) row[o] += b[o];
    }
  }
}

}  // namespace

void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
            const ops::LinearEpilogue& epilogue) {
  if (!epilogue.gelu && !epilogue.accumulate) {  // (an addend comes with accumulate)
    matmul_bias(x, weight, bias, out);
    return;
  }
  Tensor y = epilogue.accumulate ? Tensor::empty(DType::kF32, out.shape()) : out;
  matmul_bias(x, weight, bias, y);
  const int64_t n = out.numel();
  const float* yp = y.data<float>();
  const float* ap = epilogue.addend ? epilogue.addend->data<float>() : nullptr;
  float* op = out.data<float>();
  constexpr float kInvSqrt2 = 0.70710678118654752440f;  // as cpu::gelu
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float v = yp[i];
    if (epilogue.gelu) v = 0.5f * v * (1.0f + std::erf(v * kInvSqrt2));
    if (ap) v += ap[i];
    op[i] = epilogue.accumulate ? op[i] + v : v;
  }
}

}  // namespace kestrel::cpu
