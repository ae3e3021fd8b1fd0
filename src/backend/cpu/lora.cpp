// CPU LoRA deltas (ops::lora_add): per segment, the shrink t = x[rows] @ a^T into a small
// [rows, r] buffer, then the expand out[rows] += scale * t @ b^T. Two sgemms with OpenBLAS,
// else two OpenMP loops.
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/ops.h"
#ifdef KESTREL_OPENBLAS
#include <cblas.h>
#endif

namespace kestrel::cpu {

void lora_add(const Tensor& x, const std::vector<ops::LoraSegment>& segments, Tensor& out) {
  const int64_t n_in = x.dim(1), n_out = out.dim(1);
  std::vector<float> t;
  for (const ops::LoraSegment& g : segments) {
    const int64_t n = g.end - g.begin, r = g.a->dim(0);
    if (n == 0 || r == 0) continue;
    const float* xp = x.data<float>() + g.begin * n_in;
    float* op = out.data<float>() + g.begin * n_out;
    const float* ap = g.a->data<float>();
    const float* bp = g.b->data<float>();
    t.assign(static_cast<size_t>(n * r), 0.0f);
#ifdef KESTREL_OPENBLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(r),
                static_cast<int>(n_in), 1.0f, xp, static_cast<int>(n_in), ap,
                static_cast<int>(n_in), 0.0f, t.data(), static_cast<int>(r));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
                static_cast<int>(n_out), static_cast<int>(r), g.scale, t.data(),
                static_cast<int>(r), bp, static_cast<int>(r), 1.0f, op, static_cast<int>(n_out));
#else
    float* tp = t.data();
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < r; ++j) {
        const float* xr = xp + i * n_in;
        const float* ar = ap + j * n_in;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t k = 0; k < n_in; ++k) acc += xr[k] * ar[k];
        tp[i * r + j] = acc;
      }
    }
    const float scale = g.scale;
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < n_out; ++o) {
      const float* br = bp + o * r;
      for (int64_t i = 0; i < n; ++i) {
        float acc = 0.0f;
        for (int64_t j = 0; j < r; ++j) acc += tp[i * r + j] * br[j];
        op[i * n_out + o] += scale * acc;
      }
    }
#endif
  }
}

}  // namespace kestrel::cpu
