// ops::linear on CUDA against the CPU op: the GEMV of 1..8 rows (each variant), the wgmma decode
// GEMM of 3..128 rows and cuBLASLt, with and without bias, the GELU / accumulate
// epilogues, bf16 and f32 out, k not a multiple of 8 (cuBLASLt then), a second product summed
// before the residual add (parallel attention's fc2 + dense); fresh random bf16-rounded
// inputs, outputs poisoned (NaN) or, for accumulate, random. Timing: bench/cuda_ops_bench.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "cuda_test_util.h"
#ifdef KESTREL_CUDA
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/tuning.h"
#endif

namespace kestrel {
namespace {

using namespace test;  // NOLINT(google-build-using-namespace): the shared test helpers

constexpr double kLinearBound = 1e-2;

// The GEMV variant linear uses (-1: its own choice, 0: none) and the decode GEMM's (0: none, so
// cuBLASLt), two products in one launch where a kernel takes them; only the CUDA build has the
// switches, and the CPU-only build skips these tests before they reach them.
void set_modes(int gemv, int decode_gemm) {
#ifdef KESTREL_CUDA
  cuda::Tuning t = cuda::tuning();
  t.gemv = gemv;
  t.decode_gemm = decode_gemm;
  t.two_products = true;
  cuda::set_tuning(t);
#else
  (void)gemv;
  (void)decode_gemm;
#endif
}

struct Case {
  int64_t n, in, out;
  bool bias, f32_out, gelu, accumulate;
  bool addend = false;  // accumulate with a second addend (bf16 out)
  int64_t in2 = 0;      // > 0: a second product x2 [n, in2] @ w2 [out, in2]^T (+ b2), accumulate
};

// One case's fresh random inputs (bf16-rounded) and the CPU's result for them.
struct Prepared {
  Tensor x, w, b, start, add, ref;
  Tensor x2, w2, b2;  // the second product's, if any
};

Prepared prepare(const Case& c) {
  Prepared p;
  p.x = random_host({c.n, c.in});
  p.w = random_host({c.out, c.in}, -0.1f, 0.1f);
  p.b = c.bias ? random_host({c.out}) : Tensor();
  // accumulate: out starts random (bf16-rounded, so both devices start equal); else NaN.
  p.start = c.accumulate ? random_host({c.n, c.out}) : Tensor::empty(DType::kF32, {c.n, c.out});
  if (!c.accumulate) std::fill(p.start.data<float>(), p.start.data<float>() + p.start.numel(), NAN);
  p.ref = Tensor::empty(DType::kF32, {c.n, c.out});
  std::copy(p.start.data<float>(), p.start.data<float>() + p.start.numel(), p.ref.data<float>());
  p.add = c.addend ? random_host({c.n, c.out}) : Tensor();
  if (c.in2 > 0) {
    p.x2 = random_host({c.n, c.in2});
    p.w2 = random_host({c.out, c.in2}, -0.1f, 0.1f);
    p.b2 = c.bias ? random_host({c.out}) : Tensor();
  }
  ops::linear(p.x, p.w, p.b, p.ref,
              {.gelu = c.gelu,
               .accumulate = c.accumulate,
               .addend = c.addend ? &p.add : nullptr,
               .plus = c.in2 > 0 ? ops::LinearTerm{&p.x2, &p.w2, &p.b2} : ops::LinearTerm{}});
  return p;
}

// The case through the CUDA linear in the current mode; the normalised error against the CPU.
double check(const Case& c, const Prepared& p) {
  Tensor out = to_gpu(p.start, c.f32_out ? DType::kF32 : DType::kBF16);
  Tensor add_gpu = c.addend ? to_gpu(p.add, DType::kBF16) : Tensor();
  Tensor x2, w2, b2;
  if (c.in2 > 0) {
    x2 = to_gpu(p.x2, DType::kBF16);
    w2 = to_gpu(p.w2, DType::kBF16);
    b2 = c.bias ? to_gpu(p.b2, DType::kBF16) : Tensor();
  }
  ops::linear(to_gpu(p.x, DType::kBF16), to_gpu(p.w, DType::kBF16),
              c.bias ? to_gpu(p.b, DType::kBF16) : Tensor(), out,
              {.gelu = c.gelu,
               .accumulate = c.accumulate,
               .addend = c.addend ? &add_gpu : nullptr,
               .plus = c.in2 > 0 ? ops::LinearTerm{&x2, &w2, &b2} : ops::LinearTerm{}});
  return norm_error(ops::to_host_f32(out), p.ref);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  // Every row count of the GEMV, with each epilogue combination somewhere.
  for (int64_t n = 1; n <= 8; ++n) {
    v.push_back({n, 4544, 4672, n % 2 == 0, false, false, false});
    v.push_back({n, 1024, 777, true, false, n % 3 == 0, n % 2 == 1});
    v.push_back({n, 264, 65, n % 2 == 1, n % 3 == 1, n % 2 == 0, n % 3 == 0});
  }
  v.push_back({1, 18176, 4544, true, false, false, true});   // fc2 + residual
  v.push_back({1, 4544, 18176, true, false, true, false});   // fc1 + GELU
  v.push_back({3, 4544, 65024, false, true, false, false});  // lm_head (f32 logits)
  v.push_back({2, 8, 5, true, true, true, true});            // one chunk per row
  // k % 8 != 0: cuBLASLt with the epilogue.
  v.push_back({1, 100, 50, true, false, true, false});
  v.push_back({5, 203, 97, true, true, true, true});
  v.push_back({4, 1001, 130, false, false, false, true});
  // More than 8 rows: cuBLASLt (beta = 1, GELU after or through F32).
  v.push_back({37, 256, 1000, true, false, true, false});
  v.push_back({37, 256, 1000, true, false, false, true});
  v.push_back({300, 192, 96, true, true, true, true});
  v.push_back({64, 4544, 4544, true, false, true, true});
  // cuBLASLt's GELU epilogue (bf16 out, no accumulate): falcon-7b's fc1 at decode batch 128.
  v.push_back({128, 4544, 18176, false, false, true, false});
  v.push_back({48, 640, 2560, true, false, true, false});
  // The 3-way residual add (out += y + addend): the GEMV's epilogue, and y apart then one add
  // (with the bias epilogue, with GELU).
  v.push_back({1, 18176, 4544, false, false, false, true, true});
  v.push_back({3, 1024, 777, true, false, false, true, true});
  v.push_back({128, 18176, 4544, false, false, false, true, true});
  v.push_back({40, 256, 1000, true, false, false, true, true});
  v.push_back({40, 256, 1000, true, false, true, true, true});
  // Decode batches of 9..128 rows: the decode GEMM's x tiles (16, 32, 64, 128 rows) full and
  // partial, k with a partial last 64-k slice, n not a multiple of its 128-row tiles, k split
  // (4544 -> 4672) and not, each epilogue.
  for (int64_t n : {9, 12, 16, 17, 24, 31, 32, 33, 48, 57, 64, 65, 100, 128}) {
    v.push_back({n, 4544, 4672, n % 2 == 0, false, false, false});
    v.push_back({n, 1000, 777, true, n % 3 == 0, n % 2 == 1, n % 3 == 2});
    v.push_back({n, 264, 65, n % 2 == 1, false, n % 2 == 0, n % 3 == 0, n % 3 == 0});
  }
  v.push_back({32, 18176, 4544, true, false, false, true, true});  // fc2 + residual, batch 32
  v.push_back({64, 4544, 18176, true, false, true, false});        // fc1 + GELU, batch 64
  v.push_back({24, 4544, 65024, false, true, false, false});       // lm_head (f32 logits)
  v.push_back({8, 4544, 18176, true, false, true, false});         // fc1 + GELU, batch 8
  v.push_back({5, 18176, 4544, false, false, false, true, true});  // fc2 + residual, batch 5
  v.push_back({128, 4544, 4672, true, false, false, false});       // qkv, 128-token prompt
  v.push_back({96, 18176, 4544, true, false, false, true, true});  // fc2 + residual, k split
  v.push_back({5, 8, 5, true, true, true, true});                  // one chunk per row
  // x += fc2(ffn) + dense(attn): both products in the GEMV (1-2 rows) or the decode GEMM (the
  // second's 64-k slices after the first's, its last one partial), else dense apart.
  for (int64_t n : {1, 2, 3, 5, 8, 16, 17, 32, 64, 128})
    v.push_back({n, 18176, 4544, n % 2 == 1, false, false, true, false, 4544});
  v.push_back({4, 264, 65, true, false, false, true, false, 200});
  v.push_back({1, 1000, 777, false, false, false, true, false, 24});
  v.push_back({33, 1000, 777, true, false, false, true, false, 136});
  v.push_back({4, 256, 100, true, false, false, true, false, 30});  // k2 % 8 != 0: apart
  return v;
}

TEST(CudaLinear, EpiloguesMatchCpu) {
  REQUIRE_GPU();
  for (const Case& c : cases()) {
    const Prepared p = prepare(c);  // the CPU's result once, for every mode
    // (GEMV mode, decode GEMM mode): the automatic choice, cuBLASLt alone, each GEMV variant,
    // the decode GEMM for every row count it takes (3..128; 1..2 stay with the GEMV).
    for (const auto& [gemv, decode] :
         {std::pair{-1, 0}, std::pair{0, 0}, std::pair{1, 0}, std::pair{3, 0}, std::pair{4, 0},
          std::pair{5, 0}, std::pair{6, 0}, std::pair{0, -1}, std::pair{0, 1}, std::pair{0, 2},
          std::pair{0, 3}, std::pair{0, 4}}) {
      set_modes(gemv, decode);
#ifdef KESTREL_CUDA
      // On a card that runs it, every case of 3..128 rows (k % 8 == 0) must take the decode
      // GEMM when a variant is forced, and the cases its measured choice names when not (-1),
      // never falling back to cuBLASLt unseen. Both products in one launch where it takes
      // them; else the second apart, then the first, each where it takes it.
      auto takes = [&](int64_t k, int64_t k_all) {
        return (decode > 0 || cuda::decode_gemm_choice(c.n, c.out, k_all) > 0) && k % 8 == 0;
      };
      int64_t expected = 0;
      if (decode != 0 && gemv == 0 && c.n >= 3 && c.n <= 128 && cuda::decode_gemm_available()) {
        if (c.in2 == 0) {
          expected = takes(c.in, c.in) ? 1 : 0;
        } else if (takes(c.in, c.in + c.in2) && c.in2 % 8 == 0) {
          expected = 1;
        } else {
          expected = (takes(c.in2, c.in2) ? 1 : 0) + (takes(c.in, c.in) ? 1 : 0);
        }
      }
      const int64_t launches = cuda::decode_gemm_launches();
#endif
      const double err = check(c, p);
#ifdef KESTREL_CUDA
      // ... and no other case may (-1 leaves the rest to cuBLASLt).
      if (decode != 0 && gemv == 0 && cuda::decode_gemm_available())
        EXPECT_EQ(cuda::decode_gemm_launches(), launches + expected)
            << "decode gemm " << decode << ": " << c.n << "x" << c.in << "(+" << c.in2 << ")->"
            << c.out;
#endif
      EXPECT_LE(err, kLinearBound)
          << "gemv " << gemv << " decode gemm " << decode << ": " << c.n << "x" << c.in << "->"
          << c.out << " bias " << c.bias << " f32 " << c.f32_out << " gelu " << c.gelu << " acc "
          << c.accumulate << " addend " << c.addend << " in2 " << c.in2;
    }
  }
  set_modes(-1, -1);  // the defaults
}

// ops::linear_pair (qkv and fc1 + GELU of one x): one GEMV launch over both weights' rows at
// 1-8 rows in each variant that takes it (a block's rows straddle the two weights where n1 is
// odd), one decode GEMM launch (the second weight's tiles after the first's) at 3-128 rows in
// its modes, two linears elsewhere; both outputs against the CPU's.
TEST(CudaLinear, PairMatchesCpu) {
  REQUIRE_GPU();
  struct PairCase {
    int64_t n, in, n1, n2;
    bool bias, gelu2;
  };
  std::vector<PairCase> pcs;
  for (int64_t n = 1; n <= 8; ++n) {
    pcs.push_back({n, 4544, 4672, 18176, n % 2 == 0, true});
    pcs.push_back({n, 264, 65, 130, n % 2 == 1, n % 3 != 0});
  }
  pcs.push_back({1, 1000, 777, 3, true, true});
  pcs.push_back({2, 8, 5, 7, true, false});
  pcs.push_back({4, 100, 30, 40, true, true});  // k % 8 != 0: two cuBLASLt linears
  pcs.push_back({40, 256, 300, 1000, true, true});
  for (int64_t n : {16, 17, 32, 64, 128}) pcs.push_back({n, 4544, 4672, 18176, n % 2 == 0, true});
  pcs.push_back({12, 264, 65, 130, true, true});  // a tile of each weight, both partial
  for (const PairCase& c : pcs) {
    Tensor x = random_host({c.n, c.in});
    Tensor w1 = random_host({c.n1, c.in}, -0.1f, 0.1f), w2 = random_host({c.n2, c.in}, -0.1f, 0.1f);
    Tensor b1 = c.bias ? random_host({c.n1}) : Tensor(),
           b2 = c.bias ? random_host({c.n2}) : Tensor();
    Tensor ref1 = Tensor::empty(DType::kF32, {c.n, c.n1}),
           ref2 = Tensor::empty(DType::kF32, {c.n, c.n2});
    ops::linear_pair(x, w1, b1, ref1, w2, b2, ref2, c.gelu2);
    const Tensor xg = to_gpu(x, DType::kBF16), w1g = to_gpu(w1, DType::kBF16),
                 w2g = to_gpu(w2, DType::kBF16);
    const Tensor b1g = c.bias ? to_gpu(b1, DType::kBF16) : Tensor(),
                 b2g = c.bias ? to_gpu(b2, DType::kBF16) : Tensor();
    for (const auto& [gemv, decode] :
         {std::pair{-1, 0}, std::pair{0, 0}, std::pair{1, 0}, std::pair{4, 0}, std::pair{5, 0},
          std::pair{6, 0}, std::pair{0, -1}, std::pair{0, 3}, std::pair{0, 4}}) {
      set_modes(gemv, decode);
#ifdef KESTREL_CUDA
      // The decode GEMM takes a pair of 3..128 rows (k % 8 == 0) in one launch where its mode
      // gives it them (-1: by both weights' bytes), and nothing else.
      const bool chosen = decode > 0 || cuda::decode_gemm_choice(c.n, c.n1 + c.n2, c.in) > 0;
      const int64_t expected = decode != 0 && gemv == 0 && chosen && c.n >= 3 && c.n <= 128 &&
                                       c.in % 8 == 0 && cuda::decode_gemm_available()
                                   ? 1
                                   : 0;
      const int64_t launches = cuda::decode_gemm_launches();
#endif
      Tensor nan1 = Tensor::empty(DType::kF32, {c.n, c.n1}),
             nan2 = Tensor::empty(DType::kF32, {c.n, c.n2});
      std::fill(nan1.data<float>(), nan1.data<float>() + nan1.numel(), NAN);
      std::fill(nan2.data<float>(), nan2.data<float>() + nan2.numel(), NAN);
      Tensor out1 = to_gpu(nan1, DType::kBF16), out2 = to_gpu(nan2, DType::kBF16);
      ops::linear_pair(xg, w1g, b1g, out1, w2g, b2g, out2, c.gelu2);
      const double e1 = norm_error(ops::to_host_f32(out1), ref1);
      const double e2 = norm_error(ops::to_host_f32(out2), ref2);
#ifdef KESTREL_CUDA
      if (decode != 0 && gemv == 0 && cuda::decode_gemm_available())
        EXPECT_EQ(cuda::decode_gemm_launches(), launches + expected)
            << "decode gemm " << decode << ": " << c.n << "x" << c.in << "->" << c.n1 << "+"
            << c.n2;
#endif
      EXPECT_LE(std::max(e1, e2), kLinearBound)
          << "gemv " << gemv << " decode gemm " << decode << ": " << c.n << "x" << c.in << "->"
          << c.n1 << "+" << c.n2 << " bias " << c.bias << " gelu " << c.gelu2 << " (errors " << e1
          << ", " << e2 << ")";
    }
  }
  set_modes(-1, -1);  // the defaults
}

// ops::linear_pair with its LayerNorm (PairNorm): folded into the GEMV's load of x at 1-2 rows
// in variants 4-6 where the normalized rows fit 47 KiB of shared memory (the norm's out is then
// left as it was: poisoned here), else the LayerNorm launched first (its out against the CPU's);
// the outputs against the CPU's LayerNorm then pair, with the fold on and off.
TEST(CudaLinear, PairWithNormMatchesCpu) {
  REQUIRE_GPU();
  struct NormCase {
    int64_t n, in, n1, n2;
  };
  std::vector<NormCase> ncs;
  for (int64_t n = 1; n <= 3; ++n) {
    ncs.push_back({n, 4544, 4672, 18176});
    ncs.push_back({n, 264, 65, 130});
  }
  ncs.push_back({1, 1000, 777, 3});
  ncs.push_back({1, 14848, 100, 200});  // 29 KiB of normalized x: folded
  ncs.push_back({2, 14848, 100, 200});  // 58 KiB: the LayerNorm apart
  ncs.push_back({1, 24576, 64, 64});    // 48 KiB: apart (the kernel's own shared memory beside)
  ncs.push_back({8, 264, 65, 130});
  for (const NormCase& c : ncs) {
    Tensor x = random_host({c.n, c.in}, -3.0f, 5.0f);
    Tensor g = random_host({c.in}, 0.5f, 1.5f), beta = random_host({c.in}, -0.5f, 0.5f);
    Tensor w1 = random_host({c.n1, c.in}, -0.1f, 0.1f), w2 = random_host({c.n2, c.in}, -0.1f, 0.1f);
    Tensor b1 = random_host({c.n1}), b2 = random_host({c.n2});
    Tensor ref_ln = Tensor::empty(DType::kF32, {c.n, c.in}),
           ref1 = Tensor::empty(DType::kF32, {c.n, c.n1}),
           ref2 = Tensor::empty(DType::kF32, {c.n, c.n2});
    // The CPU's LayerNorm (of bf16-rounded inputs), rounded to bf16 as the GPU's output is.
    ops::layer_norm(x, g, beta, 1e-5f, ref_ln);
    const Tensor ref_ln16 = ops::to_host_f32(to_gpu(ref_ln, DType::kBF16));
    ops::linear_pair(ref_ln16, w1, b1, ref1, w2, b2, ref2, true);
    const Tensor xg = to_gpu(x, DType::kBF16), gg = to_gpu(g, DType::kBF16),
                 bg = to_gpu(beta, DType::kBF16), w1g = to_gpu(w1, DType::kBF16),
                 w2g = to_gpu(w2, DType::kBF16), b1g = to_gpu(b1, DType::kBF16),
                 b2g = to_gpu(b2, DType::kBF16);
    Tensor nan_ln = Tensor::empty(DType::kF32, {c.n, c.in});
    std::fill(nan_ln.data<float>(), nan_ln.data<float>() + nan_ln.numel(), NAN);
    for (const auto& [gemv, fold] : {std::pair{-1, true}, std::pair{-1, false}, std::pair{4, true},
                                     std::pair{5, true}, std::pair{6, true}, std::pair{0, true}}) {
      set_modes(gemv, 0);
#ifdef KESTREL_CUDA
      cuda::Tuning t = cuda::tuning();
      t.norm_in_gemv = fold;
      cuda::set_tuning(t);
#endif
      const int variant = gemv >= 0 ? gemv : c.n == 1 ? 4 : c.n == 2 ? 6 : 0;
      const bool folded =
          fold && variant >= 4 && c.n <= 2 && c.in * c.n * 2 <= 47 * 1024 && c.in % 8 == 0;
      Tensor ln = to_gpu(nan_ln, DType::kBF16);
      Tensor out1 = Tensor::empty(DType::kBF16, {c.n, c.n1}, Device::kCuda),
             out2 = Tensor::empty(DType::kBF16, {c.n, c.n2}, Device::kCuda);
      ops::linear_pair(xg, w1g, b1g, out1, w2g, b2g, out2, true, {&gg, &bg, 1e-5f, &ln});
      const Tensor ln_host = ops::to_host_f32(ln);
      const std::string what = "gemv " + std::to_string(gemv) + " fold " + std::to_string(fold) +
                               ": " + std::to_string(c.n) + "x" + std::to_string(c.in) + "->" +
                               std::to_string(c.n1) + "+" + std::to_string(c.n2);
      if (folded) {
        const float* p = ln_host.data<float>();
        EXPECT_TRUE(std::all_of(p, p + ln_host.numel(), [](float v) { return std::isnan(v); }))
            << what << ": the norm's out was written, so the norm was not folded";
      } else {
        EXPECT_LE(norm_error(ln_host, ref_ln16), kLinearBound) << what << ": the LayerNorm";
      }
      const double e1 = norm_error(ops::to_host_f32(out1), ref1);
      const double e2 = norm_error(ops::to_host_f32(out2), ref2);
      EXPECT_LE(std::max(e1, e2), kLinearBound) << what << " (errors " << e1 << ", " << e2 << ")";
    }
  }
#ifdef KESTREL_CUDA
  cuda::Tuning t = cuda::tuning();
  t.norm_in_gemv = cuda::Tuning{}.norm_in_gemv;
  cuda::set_tuning(t);
#endif
  set_modes(-1, -1);  // the defaults
}

}  // namespace
}  // namespace kestrel
