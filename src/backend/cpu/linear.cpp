// CPU linear: out [T, n_out] = epilogue(x [T, n_in] @ weight [n_out, in]^T + bias).
// OpenBLAS sgemm when built with it; otherwise a blocked OpenMP dot-product
// loop (weights are row-major [out, in], so each output is a contiguous dot).
// The epilogue (GELU, accumulate into out, a second product) follows ops::LinearEpilogue. FP8
// weights are dequantized to F32 (q * scale) for the product: fp32 math on the
// values the FP8 weights hold, optionally on activations rounded to FP8 per row.
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

// Rows of F8_E4M3 codes times their scales ([rows] or [1]), as F32.
Tensor dequantize_rows(const Tensor& q, const float* scale, bool per_row) {
  const int64_t rows = q.dim(0), cols = q.dim(1);
  Tensor out = Tensor::empty(DType::kF32, q.shape());
  const uint8_t* qp = q.data<uint8_t>();
  float* op = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float s = scale[per_row ? r : 0];
    for (int64_t c = 0; c < cols; ++c) op[r * cols + c] = f8e4m3_to_f32(qp[r * cols + c]) * s;
  }
  return out;
}

// x with every row rounded to E4M3 under its own scale (amax / 448), back in F32.
Tensor round_rows_fp8(const Tensor& x) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  Tensor out = Tensor::empty(DType::kF32, x.shape());
  const float* xp = x.data<float>();
  float* op = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(xp[r * cols + c]));
    const float s = fp8_scale(amax);
    for (int64_t c = 0; c < cols; ++c)
      op[r * cols + c] = f8e4m3_to_f32(f32_to_f8e4m3(xp[r * cols + c] / s)) * s;
  }
  return out;
}

}  // namespace

void quantize_fp8(const Tensor& weight, Tensor& q, Tensor& scale) {
  const int64_t rows = weight.dim(0), cols = weight.dim(1);
  q = Tensor::empty(DType::kF8E4M3, weight.shape());
  const bool given = scale.defined();
  if (!given) scale = Tensor::empty(DType::kF32, {rows});
  const float* wp = weight.data<float>();
  uint8_t* qp = q.data<uint8_t>();
  float* sp = scale.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0.0f;
    for (int64_t c = 0; c < cols && !given; ++c) amax = std::max(amax, std::fabs(wp[r * cols + c]));
    const float s = given ? sp[r] : fp8_scale(amax);
    sp[r] = s;
    for (int64_t c = 0; c < cols; ++c) qp[r * cols + c] = f32_to_f8e4m3(wp[r * cols + c] / s);
  }
}

void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
            const ops::LinearEpilogue& epilogue) {
  if (weight.dtype() == DType::kF8E4M3) {
    const Tensor& s = *epilogue.weight_scale;
    const Tensor w = dequantize_rows(weight, s.data<float>(), s.numel() > 1);
    ops::LinearEpilogue rest = epilogue;
    rest.weight_scale = nullptr;
    rest.fp8_activations = false;
    return cpu::linear(epilogue.fp8_activations ? round_rows_fp8(x) : x, w, bias, out, rest);
  }
  if (!epilogue.gelu && !epilogue.accumulate) {  // (an addend comes with accumulate)
    matmul_bias(x, weight, bias, out);
    return;
  }
  Tensor y = epilogue.accumulate ? Tensor::empty(DType::kF32, out.shape()) : out;
  matmul_bias(x, weight, bias, y);
  if (const ops::LinearTerm& t = epilogue.plus; t.x) {  // the second product, summed in fp32
    Tensor y2 = Tensor::empty(DType::kF32, out.shape());
    matmul_bias(*t.x, *t.weight, t.bias ? *t.bias : Tensor(), y2);
    float* yp = y.data<float>();
    const float* y2p = y2.data<float>();
    const int64_t n = y.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) yp[i] += y2p[i];
  }
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
