// linear on CUDA: out [T, n_out] = epilogue(x [T, in] @ weight [n_out, in]^T (+ bias)).
// Two products in one launch (LinearEpilogue::plus summed, linear_pair side by side) where the
// GEMV or the decode GEMM takes the rows, else two launches.
// 1-2 rows (decode) take the hand-written GEMV (gemv.cu) with the whole epilogue inside; with
// KESTREL_DECODE_GEMM set, 3-128 rows take the wgmma decode GEMM (decode_gemm.cu) on compute
// capability 9.0 (-1: where it measured faster alone, decode_gemm_choice); the rest go through
// cuBLASLt, bf16 operands, fp32 accumulation, the bias in the epilogue, out in bf16 or f32,
// accumulate as beta = 1, GELU in the epilogue too (else a kernel after). One plan (descriptors
// + the heuristic's best algorithm) per shape, made at first use and cached, with a 32 MiB
// workspace. FP8 weights: the weight-only FP8 GEMV for 1-2 rows (fp8.cu); more rows quantize
// the activations per token to E4M3 and run cuBLASLt's FP8 GEMM with outer-vector scales (weight
// row x token) and the same epilogues.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include <cublasLt.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tuning.h"
#include "core/logging.h"

#define CUBLAS_CHECK(call)                                                                  \
  do {                                                                                      \
    const cublasStatus_t kestrel_st_ = (call);                                              \
    if (kestrel_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                  \
      throw ::kestrel::Error(::kestrel::detail::concat(#call, " failed: status ",           \
                                                       static_cast<int>(kestrel_st_), " (", \
                                                       __FILE__, ":", __LINE__, ")"));      \
  } while (0)

namespace kestrel::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool bias_epilogue = false;  // else a separate kernel adds the bias
  bool gelu_epilogue = false;  // else a separate kernel applies GELU
};

constexpr int kMaxAlgos = 8;

// The operands of a plan: BF16 x BF16, or E4M3 codes x E4M3 codes with fp32 scale vectors
// applied by cuBLASLt (outer-vector scaling: one per weight row times one per token), or
// E4M3 x E4M3 unscaled into F32 for linear_epilogue to scale (where cuBLASLt has no
// outer-vector algorithm).
enum class Operands { kBf16, kFp8Scaled, kFp8Unscaled };

// (n_out, n_tokens, n_in, has bias, f32 out, GELU wanted, operands)
using PlanKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, Operands>;

struct Gemm {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<PlanKey, Plan> plans;
  Tensor workspace_tensor;  // held for the process: cuBLASLt uses it on every call
};

Gemm& gemm() {
  static Gemm* g = [] {
    auto* st = new Gemm();
    ensure_device();
    CUBLAS_CHECK(cublasLtCreate(&st->handle));
    // Held by the Gemm (never destroyed): a temporary here would hand the block back to
    // the allocator, which would give it to other tensors or free it (empty_cache).
    st->workspace_tensor =
        Tensor::empty(DType::kU8, {static_cast<int64_t>(kWorkspaceBytes)}, Device::kCuda);
    st->workspace = st->workspace_tensor.raw();
    return st;
  }();
  return *g;
}

std::atomic<int64_t> g_decode_gemm_launches{0};

bool compute_capability_90(int dev) {
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;
}

// The decode GEMM's workspace for stream s, made at its first use there (outside any capture:
// the eager run before a capture makes it) and held for the process.
const kernels::DecodeGemmWorkspace& decode_gemm_workspace(cudaStream_t s) {
  struct Held {
    Tensor partial, flags;
    kernels::DecodeGemmWorkspace ws;
  };
  static std::mutex mu;
  static auto* held = new std::map<cudaStream_t, Held>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = held->find(s);
  if (it != held->end()) return it->second.ws;
  Held h;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&h.ws.sms, cudaDevAttrMultiProcessorCount, dev));
  h.ws.sm90 = compute_capability_90(dev);
  h.ws.partial_floats = kernels::decode_gemm_workspace_floats(h.ws.sms);
  h.ws.n_flags = 4096;  // tiles of 128 rows: outputs up to 524,288 wide
  h.partial = Tensor::empty(DType::kF32, {h.ws.partial_floats}, Device::kCuda);
  h.flags = Tensor::empty(DType::kI32, {h.ws.n_flags}, Device::kCuda);
  h.ws.partial = h.partial.data<float>();
  h.ws.flags = h.flags.data<int32_t>();
  CUDA_CHECK(cudaMemsetAsync(h.ws.flags, 0, sizeof(int32_t) * h.ws.n_flags, s));
  return held->emplace(s, std::move(h)).first->second.ws;
}

// Column-major view of the row-major problem: out^T [n_out, T] =
// W (stored [n_out, in], i.e. column-major [in, n_out], transposed) x X^T
// (row-major [T, in] is column-major [in, T]).
// Descriptors for one shape; the bias epilogue only where cuBLASLt takes a bf16
// bias (bf16 out), else false; GELU likewise. Returns the heuristic's candidates.
int describe(Plan& p, const PlanKey& key, bool bias_epilogue, bool gelu_epilogue,
             cublasLtMatmulHeuristicResult_t (&results)[kMaxAlgos]) {
  Gemm& g = gemm();
  const auto [m, n, k, has_bias, f32_out, gelu, operands] = key;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (operands == Operands::kFp8Scaled) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode,
                                                sizeof(mode)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode,
                                                sizeof(mode)));
  }
  p.bias_epilogue = bias_epilogue;
  p.gelu_epilogue = gelu_epilogue;
  if (bias_epilogue || gelu_epilogue) {
    const cublasLtEpilogue_t epi = !gelu_epilogue  ? CUBLASLT_EPILOGUE_BIAS
                                   : bias_epilogue ? CUBLASLT_EPILOGUE_GELU_BIAS
                                                   : CUBLASLT_EPILOGUE_GELU;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  }
  if (bias_epilogue) {
    const cudaDataType_t bias_type = CUDA_R_16BF;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                &bias_type, sizeof(bias_type)));
  }
  const cudaDataType_t in_type = operands == Operands::kBf16 ? CUDA_R_16BF : CUDA_R_8F_E4M3;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in_type, k, m, k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in_type, k, n, k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, f32_out ? CUDA_R_32F : CUDA_R_16BF, m, n, m));

  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws)));
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g.handle, p.op, p.a, p.b, p.c, p.c, pref,
                                                           kMaxAlgos, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS) found = 0;
  if (found == 0) {
    cublasLtMatmulDescDestroy(p.op);
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    p = Plan{};
  }
  return found;
}

void run(const Plan& p, const Tensor& x, const Tensor& weight, Tensor& out,
         const cublasLtMatmulAlgo_t& algo, bool accumulate) {
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  Gemm& g = gemm();
  CUBLAS_CHECK(cublasLtMatmul(g.handle, p.op, &alpha, weight.raw(), p.a, x.raw(), p.b, &beta,
                              out.raw(), p.c, out.raw(), p.c, &algo, g.workspace, kWorkspaceBytes,
                              stream()));
}

// The plan of a shape, made at its first call: the heuristic's first choice.
// (Timing every candidate at first use was tried on the H200: no gain, and one
// candidate raised an illegal instruction; see docs/gpu.md.)
Plan& plan_for(const PlanKey& key, const Tensor& x, const Tensor& weight, const Tensor& bias,
               Tensor& out) {
  Gemm& g = gemm();
  const auto [m, n, k, has_bias, f32_out, gelu, operands] = key;
  auto it = g.plans.find(key);
  if (it != g.plans.end()) return it->second;
  Plan p;
  cublasLtMatmulHeuristicResult_t results[kMaxAlgos] = {};
  // Most fused first: GELU (with the bias, if any) in the epilogue, then bias alone, then
  // neither (GELU never without its bias: it applies to the biased sum).
  const bool bias_ok = has_bias && !f32_out, gelu_ok = gelu && !f32_out && tuning().gelu_epilogue;
  int found = 0;
  if (gelu_ok) found = describe(p, key, bias_ok, true, results);
  if (found == 0 && bias_ok) found = describe(p, key, true, false, results);
  if (found == 0) found = describe(p, key, false, false, results);
  if (found == 0 && operands != Operands::kBf16) return g.plans.emplace(key, Plan{}).first->second;
  KESTREL_CHECK(found > 0, "linear: cuBLASLt has no algorithm for [", n, ", ", k, "] x [", m, ", ",
                k, "]^T");
  if (p.bias_epilogue) {
    const void* bp = bias.raw();
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
  }
  p.algo = results[0].algo;
  return g.plans.emplace(key, p).first->second;
}

// What a plan's epilogue did not fuse, after its product: the bias, then GELU (bf16 out).
void finish_epilogue(const Plan& p, const Tensor& bias, bool gelu, Tensor& out) {
  if (bias.defined() && !p.bias_epilogue) {
    kernels::add_bias(out.raw(), out.dtype() == DType::kF32, bias.data<uint16_t>(), out.dim(0),
                      out.dim(1), stream());
    CUDA_CHECK_LAUNCH();
  }
  if (gelu && !p.gelu_epilogue) {
    kernels::gelu(out.data<uint16_t>(), out.numel(), stream());
    CUDA_CHECK_LAUNCH();
  }
}

// cuBLASLt with the epilogue: bias as before, accumulate as beta = 1, GELU in place after
// (bf16 out, no accumulate), or through an F32 product and linear_epilogue.
void linear_cublas(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
                   const ops::LinearEpilogue& epi) {
  const int64_t n_tokens = x.dim(0), n_in = x.dim(1), n_out = weight.dim(0);
  const bool f32_out = out.dtype() == DType::kF32;
  if (epi.addend) {  // y apart, then one 3-way add rounded once (the unfused model's order)
    Tensor y = Tensor::empty(out.dtype(), out.shape(), Device::kCuda);
    linear_cublas(x, weight, bias, y, {.gelu = epi.gelu});
    kernels::add(out.data<uint16_t>(), epi.addend->data<uint16_t>(), y.data<uint16_t>(),
                 out.data<uint16_t>(), out.numel(), stream());
    CUDA_CHECK_LAUNCH();
    return;
  }
  if (epi.gelu && (epi.accumulate || f32_out)) {
    Tensor y = Tensor::empty(DType::kF32, {n_tokens, n_out}, Device::kCuda);
    linear_cublas(x, weight, Tensor(), y, {});
    kernels::linear_epilogue(y.data<float>(), bias.defined() ? bias.data<uint16_t>() : nullptr,
                             n_tokens, n_out, true, epi.accumulate, out.raw(), f32_out, stream());
    CUDA_CHECK_LAUNCH();
    return;
  }
  // (GELU with accumulate or F32 out took the F32 path above.)
  const PlanKey key{n_out, n_tokens, n_in, bias.defined(), f32_out, epi.gelu, Operands::kBf16};
  Plan& p = plan_for(key, x, weight, bias, out);
  if (p.bias_epilogue) {
    const void* bp = bias.raw();
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
  }
  run(p, x, weight, out, p.algo, epi.accumulate);
  finish_epilogue(p, bias, epi.gelu, out);
}

}  // namespace

void quantize_fp8(const Tensor& weight, Tensor& q, Tensor& scale) {
  q = Tensor::empty(DType::kF8E4M3, weight.shape(), Device::kCuda);
  const bool given = scale.defined();
  if (!given) scale = Tensor::empty(DType::kF32, {weight.dim(0)}, Device::kCuda);
  kernels::quantize_fp8_rows(weight.raw(), weight.dtype() == DType::kF32, weight.dim(0),
                             weight.dim(1), q.data<uint8_t>(), scale.data<float>(), given,
                             stream());
  CUDA_CHECK_LAUNCH();
}

namespace {

// Up to this many rows an FP8 linear takes the weight-only GEMV (decode: its time is the
// weight bytes, and activations stay BF16); more rows round the activations to E4M3 for the
// tensor cores. (H100, falcon-7b decode: 1 row 300 tok/s with the GEMV, 238 with cuBLASLt's FP8
// GEMM; 4 rows 855 and 931.)
constexpr int64_t kFp8GemvRows = kernels::kFp8GemvMaxRows;

// x's rows as E4M3 codes and one scale per row (amax / 448: dynamic, per token, so that one
// outlier token does not flatten the others' resolution).
void quantize_rows(const Tensor& x, Tensor& codes, Tensor& scales) {
  codes = Tensor::empty(DType::kF8E4M3, x.shape(), Device::kCuda);
  scales = Tensor::empty(DType::kF32, {x.dim(0)}, Device::kCuda);
  kernels::quantize_fp8_rows(x.raw(), false, x.dim(0), x.dim(1), codes.data<uint8_t>(),
                             scales.data<float>(), false, stream());
  CUDA_CHECK_LAUNCH();
}

void set_pointer(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const void* p) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, attr, &p, sizeof(p)));
}

// E4M3 x E4M3 on the tensor cores: out = epilogue((x codes * x scales) @ (w codes * w scales)^T).
// Per-row weight scales and an epilogue cuBLASLt fuses: its outer-vector scaling straight to
// out; else an unscaled F32 product and linear_epilogue. False where cuBLASLt takes neither
// (FP8 needs k and n_out multiples of 16).
bool linear_fp8_gemm(const Tensor& x, const Tensor& weight, const Tensor& w_scale,
                     const Tensor& bias, Tensor& out, const ops::LinearEpilogue& epi) {
  const int64_t n_tokens = x.dim(0), n_in = x.dim(1), n_out = weight.dim(0);
  if (n_in % 16 != 0 || n_out % 16 != 0) return false;
  const bool f32_out = out.dtype() == DType::kF32, per_row = w_scale.numel() > 1;
  // The plan first (no algorithm: nothing rounded in vain), then the activations' codes.
  Plan* scaled = nullptr;
  if (per_row && !epi.addend && !(epi.gelu && (epi.accumulate || f32_out))) {
    const PlanKey key{
        n_out, n_tokens, n_in, bias.defined(), f32_out, epi.gelu, Operands::kFp8Scaled};
    scaled = &plan_for(key, x, weight, bias, out);
    static bool said = false;  // one stream, one thread drives the device
    if (!scaled->op && !said) {
      spdlog::info(
          "cuBLASLt FP8 GEMM: no outer-vector scaled algorithm for [{}, {}] x [{}, {}]^T; an "
          "unscaled product and a scaling epilogue instead",
          n_tokens, n_in, n_out, n_in);
      said = true;
    }
  }
  Tensor y;
  Plan* unscaled = nullptr;
  if (!scaled || !scaled->op) {
    y = Tensor::empty(DType::kF32, {n_tokens, n_out}, Device::kCuda);
    const PlanKey key{n_out, n_tokens, n_in, false, true, false, Operands::kFp8Unscaled};
    unscaled = &plan_for(key, x, weight, Tensor(), y);
    if (!unscaled->op) return false;
  }
  Tensor codes, scales;
  quantize_rows(x, codes, scales);
  if (!unscaled) {
    Plan& p = *scaled;
    if (p.bias_epilogue) set_pointer(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.raw());
    set_pointer(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, w_scale.raw());
    set_pointer(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scales.raw());
    run(p, codes, weight, out, p.algo, epi.accumulate);
    finish_epilogue(p, bias, epi.gelu, out);
    return true;
  }
  run(*unscaled, codes, weight, y, unscaled->algo, false);
  kernels::linear_epilogue(y.data<float>(), bias.defined() ? bias.data<uint16_t>() : nullptr,
                           n_tokens, n_out, epi.gelu, epi.accumulate, out.raw(), f32_out, stream(),
                           {scales.data<float>(), w_scale.data<float>(), per_row},
                           epi.addend ? epi.addend->data<uint16_t>() : nullptr);
  CUDA_CHECK_LAUNCH();
  return true;
}

// FP8 weights: the weight-only GEMV for decode's few rows, the FP8 tensor-core GEMM for more
// (and for every row count with fp8_activations, the CPU's --fp8-activations semantics); shapes
// neither takes dequantize the weight to BF16 scratch (activations rounded first where asked).
void linear_fp8(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
                const ops::LinearEpilogue& epilogue) {
  const Tensor& s = *epilogue.weight_scale;
  const bool per_row = s.numel() > 1;
  const int64_t n_tokens = x.dim(0), n_in = x.dim(1), n_out = weight.dim(0);
  if (n_tokens == 0 || n_out == 0) return;
  const bool gemv = !epilogue.fp8_activations && tuning().gemv != 0 && n_tokens <= kFp8GemvRows;
  if (gemv && kernels::gemv_fp8_supported(n_tokens, n_in, x.raw(), weight.raw())) {
    kernels::gemv_fp8(x.data<uint16_t>(), weight.data<uint8_t>(), s.data<float>(), per_row,
                      bias.defined() ? bias.data<uint16_t>() : nullptr, n_tokens, n_out, n_in,
                      epilogue.gelu, epilogue.accumulate,
                      epilogue.addend ? epilogue.addend->data<uint16_t>() : nullptr, out.raw(),
                      out.dtype() == DType::kF32, stream());
    CUDA_CHECK_LAUNCH();
    return;
  }
  if (!gemv && linear_fp8_gemm(x, weight, s, bias, out, epilogue)) return;
  Tensor w = Tensor::empty(DType::kBF16, weight.shape(), Device::kCuda);
  kernels::dequantize_fp8_rows(weight.data<uint8_t>(), s.data<float>(), per_row, n_out, n_in,
                               w.data<uint16_t>(), stream());
  CUDA_CHECK_LAUNCH();
  ops::LinearEpilogue rest = epilogue;
  rest.weight_scale = nullptr;
  rest.fp8_activations = false;
  if (!gemv) {  // the GEMM's activation rounding, back in BF16
    Tensor codes, scales, xr = Tensor::empty(DType::kBF16, x.shape(), Device::kCuda);
    quantize_rows(x, codes, scales);
    kernels::dequantize_fp8_rows(codes.data<uint8_t>(), scales.data<float>(), true, n_tokens, n_in,
                                 xr.data<uint16_t>(), stream());
    CUDA_CHECK_LAUNCH();
    return cuda::linear(xr, w, bias, out, rest);
  }
  cuda::linear(x, w, bias, out, rest);
}

}  // namespace

bool decode_gemm_available() {
  ensure_device();
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return compute_capability_90(dev);
}

int64_t decode_gemm_launches() {
  return g_decode_gemm_launches.load(std::memory_order_relaxed);
}

int decode_gemm_choice(int64_t rows, int64_t n, int64_t k) {
  // docs/benchmarks.md, "Decode GEMMs of 3-128 rows on wgmma fed by TMA": per launch on the H100
  // the kernel beat cuBLASLt on falcon-7b's fc1 / fc2 (165 MB) and lm_head (590 MB) from 3 to 32
  // rows (256 k a stage to 16 rows, 64 above), and lost on qkv / dense (42 MB: about 2 us more
  // to fill and drain) and at 64-128 rows (x re-read from L2 beside every w tile). In the model
  // it won only on the 207 MB launches of two products and lm_head ("Two products in one
  // launch"); taking fc1 and fc2 alone (157 MiB) it lost 1-3% at decode batch 4-32, so steps
  // that keep them apart (adapters) leave them to cuBLASLt.
  constexpr int64_t kMinWeightBytes = int64_t{192} << 20;
  if (rows < 3 || rows > 32 || n * k * 2 < kMinWeightBytes) return 0;
  return rows <= 16 ? 4 : 3;
}

namespace {

// The second product's operands for the kernels (k = 0: none).
kernels::SecondTerm second_term(const ops::LinearTerm& t) {
  if (!t.x) return {};
  const bool has_bias = t.bias && t.bias->defined();
  return {t.x->data<uint16_t>(), t.weight->data<uint16_t>(),
          has_bias ? t.bias->data<uint16_t>() : nullptr, t.x->dim(1)};
}

// The GEMV variant linear's mode gives these rows (docs/gpu.md, "GEMV and fusions": v4, k split
// over a block's warps, 2 rows of w a block, for 1 row; v6, 1 row of w a block, for 2; cuBLASLt's
// split-K kernels win from 3 rows on); 0: none.
int gemv_variant(int64_t n_tokens) {
  const int mode = tuning().gemv;
  return mode >= 0 ? mode : n_tokens == 1 ? 4 : n_tokens == 2 ? 6 : 0;
}

// The GEMV where linear's mode gives it these rows. False where it does not take them.
bool try_gemv(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
              const ops::LinearEpilogue& epilogue) {
  const int64_t n_tokens = x.dim(0), n_in = x.dim(1), n_out = weight.dim(0);
  const int variant = gemv_variant(n_tokens);
  if (variant <= 0 || !kernels::gemv_supported(n_tokens, n_in, x.raw(), weight.raw())) return false;
  const ops::LinearTerm& t = epilogue.plus;
  if (t.x && !(kernels::gemv_two_supported(variant) &&
               kernels::gemv_supported(n_tokens, t.x->dim(1), t.x->raw(), t.weight->raw())))
    return false;
  kernels::gemv(x.data<uint16_t>(), weight.data<uint16_t>(),
                bias.defined() ? bias.data<uint16_t>() : nullptr, n_tokens, n_out, n_in,
                epilogue.gelu, epilogue.accumulate,
                epilogue.addend ? epilogue.addend->data<uint16_t>() : nullptr, out.raw(),
                out.dtype() == DType::kF32, variant, stream(), second_term(t));
  CUDA_CHECK_LAUNCH();
  return true;
}

// The decode GEMM: a forced variant (1..4) wherever it applies, else (-1) its measured choice
// (by all the weight bytes, both products') on cards that run it (other cards stay with
// cuBLASLt quietly). False where it did not launch.
bool try_decode_gemm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
                     const ops::LinearEpilogue& epilogue) {
  const int64_t n_tokens = x.dim(0), n_in = x.dim(1), n_out = weight.dim(0);
  const ops::LinearTerm& t = epilogue.plus;
  const int64_t k_all = n_in + (t.x ? t.x->dim(1) : 0);
  const bool forced = tuning().decode_gemm > 0;
  const int dg = forced                     ? tuning().decode_gemm
                 : tuning().decode_gemm < 0 ? decode_gemm_choice(n_tokens, n_out, k_all)
                                            : 0;
  if (dg <= 0 || n_tokens < 3 ||
      !kernels::decode_gemm_supported(n_tokens, n_out, n_in, x.raw(), weight.raw()))
    return false;
  if (t.x &&
      !kernels::decode_gemm_supported(n_tokens, n_out, t.x->dim(1), t.x->raw(), t.weight->raw()))
    return false;
  const kernels::DecodeGemmWorkspace& ws = decode_gemm_workspace(stream());
  if (!forced && !ws.sm90) return false;
  const bool launched = kernels::decode_gemm(
      x.data<uint16_t>(), weight.data<uint16_t>(), bias.defined() ? bias.data<uint16_t>() : nullptr,
      n_tokens, n_out, n_in, epilogue.gelu, epilogue.accumulate,
      epilogue.addend ? epilogue.addend->data<uint16_t>() : nullptr, out.raw(),
      out.dtype() == DType::kF32, dg, ws, stream(), second_term(t));
  CUDA_CHECK_LAUNCH();
  if (launched) {
    g_decode_gemm_launches.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  static std::once_flag warned;
  std::call_once(warned, [] {
    spdlog::warn(
        "linear (cuda): the decode GEMM did not launch here (card or tensor map); "
        "cuBLASLt takes its shapes");
  });
  return false;
}

}  // namespace

bool linear_pair(const Tensor& x, const Tensor& w1, const Tensor& b1, Tensor& out1,
                 const Tensor& w2, const Tensor& b2, Tensor& out2, bool gelu2,
                 const ops::PairNorm* norm) {
  const int64_t n_tokens = x.dim(0), n_in = x.dim(1), n1 = w1.dim(0), n2 = w2.dim(0);
  const auto bf16 = [](const Tensor& t) { return !t.defined() || t.dtype() == DType::kBF16; };
  if (!tuning().two_products || x.dtype() != DType::kBF16 || w1.dtype() != DType::kBF16 ||
      w2.dtype() != DType::kBF16 || out1.dtype() != DType::kBF16 || out2.dtype() != DType::kBF16 ||
      !bf16(b1) || !bf16(b2))
    return false;
  if (n_tokens == 0 || n1 + n2 == 0) return true;
  kernels::SecondTerm pair;
  pair.w = w2.data<uint16_t>();
  pair.bias = b2.defined() ? b2.data<uint16_t>() : nullptr;
  pair.out = out2.raw();
  pair.n1 = n1;
  pair.gelu = gelu2;
  const uint16_t* bias1 = b1.defined() ? b1.data<uint16_t>() : nullptr;
  const int variant = gemv_variant(n_tokens);
  kernels::NormTerm nt;
  if (norm) {  // folded into the GEMV's load of x, or not taken here
    if (!tuning().norm_in_gemv || variant <= 0 || norm->weight->dtype() != DType::kBF16 ||
        norm->bias->dtype() != DType::kBF16)
      return false;
    nt = {norm->weight->data<uint16_t>(), norm->bias->data<uint16_t>(), norm->eps};
    if (!kernels::gemv_norm_supported(variant, n_tokens, n_in, nt)) return false;
  }
  if (variant > 0) {  // the GEMV's rows: its split kernels, or two linears
    if (!kernels::gemv_two_supported(variant) ||
        !kernels::gemv_supported(n_tokens, n_in, x.raw(), w1.raw()) ||
        !kernels::gemv_supported(n_tokens, n_in, x.raw(), w2.raw()))
      return false;
    kernels::gemv(x.data<uint16_t>(), w1.data<uint16_t>(), bias1, n_tokens, n1 + n2, n_in, false,
                  false, nullptr, out1.raw(), false, variant, stream(), pair, nt);
    CUDA_CHECK_LAUNCH();
    return true;
  }
  // The decode GEMM, by the same rule as linear's (both weights' bytes for its choice).
  const bool forced = tuning().decode_gemm > 0;
  const int dg = forced                     ? tuning().decode_gemm
                 : tuning().decode_gemm < 0 ? decode_gemm_choice(n_tokens, n1 + n2, n_in)
                                            : 0;
  if (dg <= 0 || n_tokens < 3 || n1 == 0 || n2 == 0 ||
      !kernels::decode_gemm_supported(n_tokens, n1 + n2, n_in, x.raw(), w1.raw()) ||
      !kernels::decode_gemm_supported(n_tokens, n2, n_in, x.raw(), w2.raw()))
    return false;
  const kernels::DecodeGemmWorkspace& ws = decode_gemm_workspace(stream());
  if (!ws.sm90) return false;
  const bool launched =
      kernels::decode_gemm(x.data<uint16_t>(), w1.data<uint16_t>(), bias1, n_tokens, n1 + n2, n_in,
                           false, false, nullptr, out1.raw(), false, dg, ws, stream(), pair);
  CUDA_CHECK_LAUNCH();
  if (launched) g_decode_gemm_launches.fetch_add(1, std::memory_order_relaxed);
  return launched;
}

void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
            const ops::LinearEpilogue& epilogue) {
  if (weight.dtype() == DType::kF8E4M3) return linear_fp8(x, weight, bias, out, epilogue);
  KESTREL_CHECK(weight.dtype() == DType::kBF16 && x.dtype() == DType::kBF16,
                "linear (cuda): x and weight must be BF16, got ", dtype_name(x.dtype()), " and ",
                dtype_name(weight.dtype()));
  KESTREL_CHECK(out.dtype() == DType::kBF16 || out.dtype() == DType::kF32,
                "linear (cuda): out must be BF16 or F32");
  KESTREL_CHECK(!bias.defined() || bias.dtype() == DType::kBF16,
                "linear (cuda): bias must be BF16");
  const int64_t n_tokens = x.dim(0), n_out = weight.dim(0);
  if (n_tokens == 0 || n_out == 0) return;
  KESTREL_CHECK(!epilogue.addend || out.dtype() == DType::kBF16,
                "linear (cuda): an addend needs a BF16 out");
  const ops::LinearTerm& t = epilogue.plus;
  KESTREL_CHECK(!t.x || (t.x->dtype() == DType::kBF16 && t.weight->dtype() == DType::kBF16 &&
                         (!t.bias || !t.bias->defined() || t.bias->dtype() == DType::kBF16) &&
                         out.dtype() == DType::kBF16),
                "linear (cuda): a second product needs BF16 operands and out");
  const bool apart = t.x && !tuning().two_products;
  if (!apart && try_gemv(x, weight, bias, out, epilogue)) return;
  if (!apart && try_decode_gemm(x, weight, bias, out, epilogue)) return;
  if (t.x) {  // no kernel sums both: the second apart, rounded, then the first with it as addend
    Tensor y2 = Tensor::empty(DType::kBF16, out.shape(), Device::kCuda);
    cuda::linear(*t.x, *t.weight, t.bias ? *t.bias : Tensor(), y2, {});
    return cuda::linear(x, weight, bias, out, {.accumulate = true, .addend = &y2});
  }
  linear_cublas(x, weight, bias, out, epilogue);
}

}  // namespace kestrel::cuda
