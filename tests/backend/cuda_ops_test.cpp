// Every CUDA op against the CPU op on fresh random inputs of several shapes
// (llama.cpp's test-backend-ops habit): inputs are drawn in F32, rounded to
// bf16 so that both backends see the same values, and the CUDA result is
// compared by normalised error ||cuda - cpu|| / ||cpu|| with a bound per op.
// Outputs are poisoned (NaN) before each CUDA run, so an unwritten element fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "cuda_test_util.h"
#include "model/alibi.h"
#ifdef KESTREL_CUDA
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/tuning.h"
#endif

namespace kestrel {
namespace {

// Which attention kernel paged_attention uses (cuda::Tuning::attention_kernel), whether the
// last split's block merges the splits, and a forced split count (0: the rule); the CPU-only
// build skips the tests before they reach it.
void set_attention_kernel(int which, bool fused_combine = false, int splits = 0) {
#ifdef KESTREL_CUDA
  cuda::Tuning t = cuda::tuning();
  t.attention_kernel = which;
  t.attention_fused_combine = fused_combine;
  t.attention_splits = splits;
  cuda::set_tuning(t);
#else
  (void)which;
  (void)fused_combine;
  (void)splits;
#endif
}

using namespace test;  // NOLINT(google-build-using-namespace): the shared test helpers

// bf16 rounds each output once (relative 2^-9); sums of a few rounded terms
// stay well under these.
constexpr double kElementwiseBound = 1e-2;
constexpr double kLinearBound = 1e-2;
constexpr double kAttentionBound = 2e-2;  // P is rounded to bf16 before P V

Tensor host_i32(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::empty(DType::kI32, std::move(shape));
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// A BF16 CUDA tensor full of NaN.
Tensor poisoned_gpu(Shape shape) {
  Tensor host = Tensor::empty(DType::kF32, shape);
  std::fill(host.data<float>(), host.data<float>() + host.numel(), NAN);
  return to_gpu_bf16(host);
}

double gpu_error(const Tensor& gpu, const Tensor& ref) {
  return norm_error(ops::to_host_f32(gpu), ref);
}

TEST(CudaOps, Embedding) {
  REQUIRE_GPU();
  for (auto [vocab, hidden, n] : {std::tuple{1000, 4544, 17}, {50, 60, 3}}) {
    Tensor table = random_host({vocab, hidden});
    std::vector<int32_t> ids(n);
    for (auto& id : ids) id = static_cast<int32_t>(rng()() % vocab);
    Tensor ref = Tensor::empty(DType::kF32, {n, hidden});
    ops::embedding(host_i32(ids, {n}), table, ref);
    Tensor out = poisoned_gpu({n, hidden});
    ops::embedding(ops::to_device(host_i32(ids, {n}), Device::kCuda), to_gpu_bf16(table), out);
    EXPECT_EQ(gpu_error(out, ref), 0.0) << vocab << "x" << hidden;
  }
}

TEST(CudaOps, LayerNorm) {
  REQUIRE_GPU();
  // Every block size LayerNorm launches (32 to 1024 threads, the vectorised and the generic
  // kernel).
  for (auto [n, hidden] : {std::pair{5, 4544},
                           {300, 64},
                           {1, 8192},
                           {7, 100},
                           {4, 2048},
                           {3, 14848},
                           {2, 20000},
                           {3, 1001},
                           {2, 2003},
                           {2, 40000}}) {
    Tensor x = random_host({n, hidden}, -2.0f, 3.0f);
    Tensor w = random_host({hidden}), b = random_host({hidden});
    Tensor ref = Tensor::empty(DType::kF32, {n, hidden});
    ops::layer_norm(x, w, b, 1e-5f, ref);
    Tensor out = poisoned_gpu({n, hidden});
    ops::layer_norm(to_gpu_bf16(x), to_gpu_bf16(w), to_gpu_bf16(b), 1e-5f, out);
    EXPECT_LE(gpu_error(out, ref), kElementwiseBound) << n << "x" << hidden;
  }
}

TEST(CudaOps, LinearWithAndWithoutBias) {
  REQUIRE_GPU();
  struct Case {
    int64_t n, in, out;
    bool bias, f32_out;
  };
  for (const Case& c : {Case{1, 4544, 4672, false, false}, Case{37, 256, 1000, true, false},
                        Case{128, 64, 65024, false, true}, Case{300, 192, 96, true, true}}) {
    Tensor x = random_host({c.n, c.in}), w = random_host({c.out, c.in});
    Tensor b = c.bias ? random_host({c.out}) : Tensor();
    Tensor ref = Tensor::empty(DType::kF32, {c.n, c.out});
    ops::linear(x, w, b, ref);
    Tensor out = c.f32_out ? Tensor::empty(DType::kF32, {c.n, c.out}, Device::kCuda)
                           : poisoned_gpu({c.n, c.out});
    ops::linear(to_gpu_bf16(x), to_gpu_bf16(w), c.bias ? to_gpu_bf16(b) : Tensor(), out);
    EXPECT_LE(gpu_error(out, ref), kLinearBound) << c.n << "x" << c.in << "->" << c.out;
  }
}

TEST(CudaOps, GeluAndAdd) {
  REQUIRE_GPU();
  for (int64_t n : {1, 1000, 123457}) {
    Tensor x = random_host({n}, -4.0f, 4.0f);
    Tensor ref = Tensor::empty(DType::kF32, {n});
    std::copy(x.data<float>(), x.data<float>() + n, ref.data<float>());
    ops::gelu(ref);
    Tensor g = to_gpu_bf16(x);
    ops::gelu(g);
    EXPECT_LE(gpu_error(g, ref), kElementwiseBound) << "gelu " << n;

    Tensor a = random_host({n}), b = random_host({n}), c = random_host({n});
    for (bool three : {false, true}) {
      Tensor sum = Tensor::empty(DType::kF32, {n});
      ops::add(a, b, three ? c : Tensor(), sum);
      Tensor ga = to_gpu_bf16(a);  // out aliases a, as the model uses it
      ops::add(ga, to_gpu_bf16(b), three ? to_gpu_bf16(c) : Tensor(), ga);
      EXPECT_LE(gpu_error(ga, sum), kElementwiseBound) << "add " << n;
    }
  }
}

TEST(CudaOps, QkvRotary) {
  REQUIRE_GPU();
  for (auto [n, heads, kv_heads, d] :
       {std::tuple{33, 71, 1, 64}, {5, 8, 2, 128}, {9, 4, 4, 16}, {2, 232, 8, 64}}) {
    Tensor qkv = random_host({n, (heads + 2 * kv_heads) * d});
    Tensor cos = random_host({n, d / 2}), sin = random_host({n, d / 2});
    Tensor q = Tensor::empty(DType::kF32, {n, heads, d});
    Tensor k = Tensor::empty(DType::kF32, {n, kv_heads, d}),
           v = Tensor::empty(DType::kF32, {n, kv_heads, d});
    ops::qkv_rotary(qkv, cos, sin, q, k, v);
    Tensor gq = poisoned_gpu({n, heads, d}), gk = poisoned_gpu({n, kv_heads, d}),
           gv = poisoned_gpu({n, kv_heads, d});
    ops::qkv_rotary(to_gpu_bf16(qkv), ops::to_device(cos, Device::kCuda),
                    ops::to_device(sin, Device::kCuda), gq, gk, gv);
    EXPECT_LE(gpu_error(gq, q), kElementwiseBound) << heads << "/" << kv_heads << " d" << d;
    EXPECT_LE(gpu_error(gk, k), kElementwiseBound);
    EXPECT_EQ(gpu_error(gv, v), 0.0);
  }
}

// ALiBi models: no cos/sin tables, the rows are only split (any head_dim).
TEST(CudaOps, QkvSplitWithoutRotary) {
  REQUIRE_GPU();
  for (auto [n, heads, kv_heads, d] :
       {std::tuple{7, 12, 12, 64}, {3, 4, 1, 33}, {5, 8, 2, 128}, {40, 32, 32, 64}}) {
    Tensor qkv = random_host({n, (heads + 2 * kv_heads) * d});
    Tensor q = Tensor::empty(DType::kF32, {n, heads, d});
    Tensor k = Tensor::empty(DType::kF32, {n, kv_heads, d}),
           v = Tensor::empty(DType::kF32, {n, kv_heads, d});
    ops::qkv_rotary(qkv, Tensor(), Tensor(), q, k, v);
    Tensor gq = poisoned_gpu({n, heads, d}), gk = poisoned_gpu({n, kv_heads, d}),
           gv = poisoned_gpu({n, kv_heads, d});
    ops::qkv_rotary(to_gpu_bf16(qkv), Tensor(), Tensor(), gq, gk, gv);
    EXPECT_EQ(gpu_error(gq, q), 0.0) << heads << "/" << kv_heads << " d" << d;
    EXPECT_EQ(gpu_error(gk, k), 0.0);
    EXPECT_EQ(gpu_error(gv, v), 0.0);
  }
}

TEST(CudaOps, GatherRowsAndArgmax) {
  REQUIRE_GPU();
  Tensor x = random_host({40, 333});
  std::vector<int32_t> idx = {39, 0, 5, 5, 17};
  Tensor ref = Tensor::empty(DType::kF32, {5, 333});
  ops::gather_rows(x, host_i32(idx, {5}), ref);
  Tensor out = poisoned_gpu({5, 333});
  ops::gather_rows(to_gpu_bf16(x), ops::to_device(host_i32(idx, {5}), Device::kCuda), out);
  EXPECT_EQ(gpu_error(out, ref), 0.0);

  for (int64_t vocab : {7, 65024}) {
    Tensor logits = random_host({9, vocab}, -5.0f, 5.0f);
    logits.data<float>()[3 * vocab + vocab - 1] = 100.0f;  // a maximum at the end
    logits.data<float>()[4 * vocab + 1] = 100.0f;          // ties: the first wins
    logits.data<float>()[4 * vocab + 2] = 100.0f;
    // Ties held by different threads and warps of the block: the lowest index wins.
    for (int64_t i : {int64_t{6}, int64_t{5}, int64_t{2}})
      if (i < vocab) logits.data<float>()[5 * vocab + i] = 100.0f;
    for (int64_t i : {int64_t{16000}, int64_t{160}, int64_t{20}})
      if (i < vocab) logits.data<float>()[6 * vocab + i] = 100.0f;
    for (int64_t i : {int64_t{64000}, int64_t{4100}})
      if (i < vocab) logits.data<float>()[7 * vocab + i] = 100.0f;
    Tensor want = Tensor::empty(DType::kI32, {9});
    ops::argmax_rows(logits, want);
    Tensor got = Tensor::empty(DType::kI32, {9}, Device::kCuda);
    ops::argmax_rows(ops::to_device(logits, Device::kCuda), got);
    Tensor got_host = Tensor::empty(DType::kI32, {9});
#ifdef KESTREL_CUDA
    cuda::copy(got, got_host);
#endif
    for (int r = 0; r < 9; ++r)
      EXPECT_EQ(got_host.data<int32_t>()[r], want.data<int32_t>()[r]) << "row " << r;
  }
}

// Greedy ids and their log-softmax on the GPU against the CPU op (ids exact;
// the CPU op against a float64 log-softmax first).
TEST(CudaOps, GreedyRowsMatchCpu) {
  REQUIRE_GPU();
  for (auto [n, vocab] :
       {std::pair<int64_t, int64_t>{1, 7}, {9, 65024}, {128, 65024}, {3, 50000}}) {
    Tensor logits = random_host({n, vocab}, -8.0f, 8.0f);
    logits.data<float>()[vocab - 1] = 30.0f;  // row 0: a peaked maximum at the end
    if (n > 2) {
      logits.data<float>()[2 * vocab + 1] = 9.0f;  // row 2: a tie, the first wins
      logits.data<float>()[2 * vocab + 3] = 9.0f;
      if (vocab > 5000) {  // row 1: a tie across warps of the block
        logits.data<float>()[vocab + 5000] = 9.0f;
        logits.data<float>()[vocab + 40] = 9.0f;
      }
    }
    Tensor want_ids = Tensor::empty(DType::kI32, {n});
    Tensor want_lp = Tensor::empty(DType::kF32, {n});
    ops::greedy_rows(logits, want_ids, want_lp);
    for (int64_t r = 0; r < n; ++r) {
      const float* p = logits.data<float>() + r * vocab;
      double m = p[0], sum = 0;
      for (int64_t i = 0; i < vocab; ++i) m = std::max<double>(m, p[i]);
      for (int64_t i = 0; i < vocab; ++i) sum += std::exp(p[i] - m);
      EXPECT_NEAR(want_lp.data<float>()[r], -std::log(sum), 1e-5) << "cpu row " << r;
    }
    const Tensor dev = ops::to_device(logits, Device::kCuda);
    Tensor ids = Tensor::empty(DType::kI32, {n}, Device::kCuda);
    Tensor lps = Tensor::empty(DType::kF32, {n}, Device::kCuda);
    ops::greedy_rows(dev, ids, lps);
    const Tensor ids_h = ops::to_device(ids, Device::kCpu);
    const Tensor lps_h = ops::to_host_f32(lps);
    for (int64_t r = 0; r < n; ++r) {
      EXPECT_EQ(ids_h.data<int32_t>()[r], want_ids.data<int32_t>()[r])
          << n << "x" << vocab << " row " << r;
      EXPECT_NEAR(lps_h.data<float>()[r], want_lp.data<float>()[r], 1e-4)
          << n << "x" << vocab << " row " << r;
    }
    if (n > 2) {
      EXPECT_EQ(ids_h.data<int32_t>()[2], 1);
      if (vocab > 5000) {
        EXPECT_EQ(ids_h.data<int32_t>()[1], 40);
      }
    }
    EXPECT_EQ(ids_h.data<int32_t>()[0], vocab - 1);
  }
}

// A paged attention problem: sequences (q_len, kv_len), their blocks shuffled
// over a cache whose unused slots hold large values (a read of one shows).
struct AttnCase {
  std::string name;
  int64_t n_heads, n_kv_heads, head_dim, block_size;
  std::vector<std::pair<int32_t, int32_t>> seqs;  // (q_len, kv_len)
  bool alibi = false;                             // with ALiBi slopes of n_heads heads
  bool fp8 = false;                               // an FP8 (E4M3, scale 1) cache
};

// An F32 host tensor's values as E4M3 codes under a scale of 1 (what kv_write stores).
Tensor to_e4m3(const Tensor& x) {
  Tensor q = Tensor::empty(DType::kF8E4M3, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) q.data<uint8_t>()[i] = f32_to_f8e4m3(x.data<float>()[i]);
  return q;
}

std::vector<AttnCase> attention_cases() {
  std::vector<AttnCase> cases;
  cases.push_back({"mqa71_d64_decode_b1_ctx8003", 71, 1, 64, 16, {{1, 8003}}});
  cases.push_back({"mqa71_d64_prefill_mixed", 71, 1, 64, 16, {{130, 130}, {1, 77}, {64, 300}}});
  std::vector<std::pair<int32_t, int32_t>> b64;
  for (int i = 0; i < 64; ++i) b64.push_back({1, 1 + static_cast<int32_t>(rng()() % 3000)});
  cases.push_back({"gqa32x8_d128_decode_b64_bs32", 32, 8, 128, 32, b64});
  cases.push_back({"mha4_d64_prefill", 4, 4, 64, 16, {{1, 1}, {37, 37}, {300, 300}}});
  cases.push_back({"gqa16x2_d128_chunked", 16, 2, 128, 16, {{64, 1000}, {200, 200}, {1, 517}}});
  cases.push_back({"gqa8x2_d128_long_bs32", 8, 2, 128, 32, {{1000, 1000}}});
  cases.push_back({"gqa8x2_d64_chunk_ctx8k", 8, 2, 64, 32, {{96, 8191}, {1, 4097}}});
  cases.push_back({"mqa2_d128_decode_b8",
                   2,
                   1,
                   128,
                   16,
                   {{1, 1}, {1, 16}, {1, 17}, {1, 161}, {1, 1023}, {1, 2048}, {1, 5}, {1, 333}}});
  cases.push_back({"mqa4_d16_generic", 4, 1, 16, 16, {{50, 50}, {1, 20}}});
  cases.push_back({"gqa12x4_d32_generic", 12, 4, 32, 32, {{3, 40}, {9, 9}}});
  // ALiBi: the bias of absolute key positions (past 256, where bf16 rounds them),
  // prefill, chunks over cached context, decode with split-KV, GQA rows of one tile.
  cases.push_back({"alibi_mha12_d64_prefill", 12, 12, 64, 16, {{3, 3}, {30, 30}, {75, 75}}, true});
  cases.push_back(
      {"alibi_mha32_d64_decode_b4", 32, 32, 64, 16, {{1, 2000}, {1, 300}, {1, 17}, {1, 1}}, true});
  cases.push_back(
      {"alibi_mha32_d64_chunked_bs32", 32, 32, 64, 32, {{64, 700}, {1, 1500}, {100, 100}}, true});
  cases.push_back({"alibi_gqa8x2_d128_decode_ctx4097", 8, 2, 128, 16, {{1, 4097}, {5, 600}}, true});
  cases.push_back({"alibi_mha6_d32_generic", 6, 6, 32, 16, {{20, 50}, {1, 600}}, true});
  // v3's paths: 128-row tiles (rows not a multiple of 128), unmasked tiles inside
  // the causal range, tile ends on the causal diagonal (group 8: 16 tokens a
  // tile, key tiles of 64), partly empty tiles (a warp with no rows), split-KV
  // with 128-row tiles (71-row decode), ALiBi with 128-row tiles.
  cases.push_back({"mqa71_d64_prefill_300_chunk", 71, 1, 64, 16, {{300, 300}, {100, 612}}});
  cases.push_back({"gqa8x1_d64_diagonal_bs32", 8, 1, 64, 32, {{128, 128}, {64, 192}, {9, 73}}});
  cases.push_back({"gqa64x8_d64_prefill_odd_bs24", 64, 8, 64, 24, {{200, 200}, {17, 517}}});
  std::vector<std::pair<int32_t, int32_t>> b64_mqa;
  for (int i = 0; i < 64; ++i) b64_mqa.push_back({1, 1 + static_cast<int32_t>(rng()() % 4000)});
  cases.push_back({"mqa71_d64_decode_b64", 71, 1, 64, 16, b64_mqa});
  cases.push_back({"mqa71_d64_spec_q3_ctx2049", 71, 1, 64, 32, {{3, 2049}, {2, 70}}});
  cases.push_back(
      {"alibi_gqa16x2_d64_prefill_bs32", 16, 2, 64, 32, {{150, 150}, {40, 300}, {1, 900}}, true});
  cases.push_back({"gqa32x4_d128_prefill_diagonal", 32, 4, 128, 16, {{72, 72}, {8, 136}}});
  // Each again over an FP8 cache (--kv-cache-dtype fp8).
  const size_t n = cases.size();
  for (size_t i = 0; i < n; ++i) {
    AttnCase f = cases[i];
    f.name += "_fp8";
    f.fp8 = true;
    cases.push_back(f);
  }
  return cases;
}

void run_attention_case(const AttnCase& c) {
  const int64_t n_seqs = static_cast<int64_t>(c.seqs.size());
  const int64_t bs = c.block_size, d = c.head_dim;
  int64_t n_tokens = 0, total_blocks = 0, max_blocks = 1;
  int32_t max_kv = 0, max_q = 0;
  for (auto [ql, kl] : c.seqs) {
    n_tokens += ql;
    const int64_t nb = (kl + bs - 1) / bs;
    total_blocks += nb;
    max_blocks = std::max(max_blocks, nb);
    max_kv = std::max(max_kv, kl);
    max_q = std::max(max_q, ql);
  }
  const int64_t num_blocks = total_blocks + 3;
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng());
  std::vector<int32_t> tables(n_seqs * max_blocks, 0), cu{0}, lens;
  std::vector<char> used(num_blocks * bs, 0);
  int64_t next = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const auto [ql, kl] = c.seqs[s];
    for (int64_t i = 0; i < (kl + bs - 1) / bs; ++i) tables[s * max_blocks + i] = perm[next++];
    for (int64_t p = 0; p < kl; ++p) used[tables[s * max_blocks + p / bs] * bs + p % bs] = 1;
    cu.push_back(cu.back() + ql);
    lens.push_back(kl);
  }
  const Shape cache_shape{num_blocks, bs, c.n_kv_heads, d};
  Tensor kc = random_host(cache_shape), vc = random_host(cache_shape);
  const int64_t row = c.n_kv_heads * d;
  for (int64_t slot = 0; slot < num_blocks * bs; ++slot) {
    if (used[slot]) continue;
    std::fill(kc.data<float>() + slot * row, kc.data<float>() + (slot + 1) * row, 60.0f);
    std::fill(vc.data<float>() + slot * row, vc.data<float>() + (slot + 1) * row, 60.0f);
  }
  Tensor q = random_host({n_tokens, c.n_heads, d}, -2.0f, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  Tensor t_tables = host_i32(tables, {n_seqs, max_blocks});
  Tensor t_cu = host_i32(cu, {n_seqs + 1}), t_lens = host_i32(lens, {n_seqs});
  Tensor slopes;
  if (c.alibi) {
    const std::vector<float> s = alibi_slopes(c.n_heads, 0, c.n_heads);
    slopes = Tensor::empty(DType::kF32, {c.n_heads});
    std::copy(s.begin(), s.end(), slopes.data<float>());
  }
  if (c.fp8) {  // the same codes on both sides (they travel as bytes)
    kc = to_e4m3(kc);
    vc = to_e4m3(vc);
  }
  Tensor ref = Tensor::empty(DType::kF32, q.shape());
  ops::paged_attention(q, kc, vc, t_tables, t_cu, t_lens, max_kv, scale, ref, 0, slopes);
  const Tensor g_slopes = ops::to_device(slopes, Device::kCuda);

  const Tensor gq = to_gpu_bf16(q);
  const Tensor gk = c.fp8 ? ops::to_device(kc, Device::kCuda) : to_gpu_bf16(kc);
  const Tensor gv = c.fp8 ? ops::to_device(vc, Device::kCuda) : to_gpu_bf16(vc);
  const Tensor g_tables = ops::to_device(t_tables, Device::kCuda);
  const Tensor g_cu = ops::to_device(t_cu, Device::kCuda);
  const Tensor g_lens = ops::to_device(t_lens, Device::kCuda);
#ifdef KESTREL_CUDA
  const bool mma_ok = d == 64 || d == 128;
  // kernel 1: v1, 2: the tensor-core kernel (v3), 0: auto. v3's splits merged by their own
  // kernel (mode 0) or by the last block of a tile (1), and so with 3 splits forced (2). Each
  // launch after the first finds the counters the one before left (they must be zero again).
  for (int kernel : {1, 2, 0}) {
    if (kernel == 2 && !mma_ok) continue;
    for (int mode : {0, 1, 2}) {
      if (kernel == 1 && mode > 0) continue;
      set_attention_kernel(kernel, mode > 0, mode == 2 ? 3 : 0);
      for (int32_t mq : {max_q, 0}) {
        Tensor out = poisoned_gpu(q.shape());
        ops::paged_attention(gq, gk, gv, g_tables, g_cu, g_lens, max_kv, scale, out, mq, g_slopes);
        EXPECT_LE(gpu_error(out, ref), kAttentionBound)
            << c.name << " kernel " << kernel << " mode " << mode << " max_q_len " << mq;
      }
    }
  }
  set_attention_kernel(0);
#endif
}

class CudaAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttention, MatchesCpu) {
  REQUIRE_GPU();
  run_attention_case(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaAttention, ::testing::ValuesIn(attention_cases()),
                         [](const auto& info) { return info.param.name; });

// n distinct cache slots of [0, total), shuffled; and as an I64 tensor.
std::vector<int64_t> distinct_slots(int64_t n, int64_t total) {
  std::vector<int64_t> slots(total);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng());
  slots.resize(n);
  return slots;
}

Tensor slots_tensor(const std::vector<int64_t>& slots) {
  Tensor t = Tensor::empty(DType::kI64, {static_cast<int64_t>(slots.size())});
  std::copy(slots.begin(), slots.end(), t.data<int64_t>());
  return t;
}

TEST(CudaOps, KvWrite) {
  REQUIRE_GPU();
  const int64_t blocks = 12, bs = 16, kvh = 2, d = 64, n = 20;
  Tensor k = random_host({n, kvh, d}), v = random_host({n, kvh, d});
  const std::vector<int64_t> slots = distinct_slots(n, blocks * bs);
  Tensor t_slots = slots_tensor(slots);
  Tensor kc = random_host({blocks, bs, kvh, d}), vc = random_host({blocks, bs, kvh, d});
  Tensor gkc = to_gpu_bf16(kc), gvc = to_gpu_bf16(vc);
  ops::kv_write(k, v, t_slots, kc, vc);
  ops::kv_write(to_gpu_bf16(k), to_gpu_bf16(v), ops::to_device(t_slots, Device::kCuda), gkc, gvc);
  EXPECT_EQ(gpu_error(gkc, kc), 0.0);
  EXPECT_EQ(gpu_error(gvc, vc), 0.0);
}

// Into an FP8 cache: the CPU's codes, byte for byte (the values are BF16 on both sides).
TEST(CudaOps, KvWriteFp8) {
  REQUIRE_GPU();
  const int64_t blocks = 12, bs = 16, kvh = 2, d = 64, n = 20;
  Tensor k = random_host({n, kvh, d}, -600.0f, 600.0f), v = random_host({n, kvh, d});
  const Tensor t_slots = slots_tensor(distinct_slots(n, blocks * bs));
  Tensor kc = to_e4m3(random_host({blocks, bs, kvh, d})), vc = to_e4m3(random_host(kc.shape()));
  Tensor gkc = ops::to_device(kc, Device::kCuda), gvc = ops::to_device(vc, Device::kCuda);
  ops::kv_write(k, v, t_slots, kc, vc);
  ops::kv_write(to_gpu_bf16(k), to_gpu_bf16(v), ops::to_device(t_slots, Device::kCuda), gkc, gvc);
  const Tensor hk = ops::to_device(gkc, Device::kCpu), hv = ops::to_device(gvc, Device::kCpu);
  int64_t differ = 0;
  for (int64_t i = 0; i < kc.numel(); ++i)
    differ += (hk.data<uint8_t>()[i] != kc.data<uint8_t>()[i]) +
              (hv.data<uint8_t>()[i] != vc.data<uint8_t>()[i]);
  EXPECT_EQ(differ, 0);
}

// A cache's values as F32 on the host (F32 or E4M3 on the host; BF16 or E4M3 on the device).
Tensor cache_values(const Tensor& cache) {
  if (cache.dtype() != DType::kF8E4M3) return ops::to_host_f32(cache);
  const Tensor codes = ops::to_device(cache, Device::kCpu);
  Tensor out = Tensor::empty(DType::kF32, cache.shape());
  for (int64_t i = 0; i < out.numel(); ++i)
    out.data<float>()[i] = f8e4m3_to_f32(codes.data<uint8_t>()[i]);
  return out;
}

// The fused op (one kernel on CUDA) against the CPU's qkv_rotary + kv_write: rotated and not,
// MQA / GQA / MHA, block sizes 16 and 32, padding rows (slot -1) that must write nothing; into a
// BF16 cache and an FP8 one (E4M3 of the fp32 rotated value on both sides).
TEST(CudaOps, QkvRotaryKvWrite) {
  REQUIRE_GPU();
  for (bool fp8 : {false, true})
    for (auto [n, heads, kv_heads, d, bs, rotate] : {std::tuple{33, 71, 1, 64, 16, true},
                                                     {5, 8, 2, 128, 32, true},
                                                     {9, 4, 4, 16, 16, true},
                                                     {7, 12, 12, 64, 32, false},
                                                     {40, 32, 8, 64, 16, true}}) {
      const int64_t blocks = (n + bs - 1) / bs + 3;
      Tensor qkv = random_host({n, (heads + 2 * kv_heads) * d});
      Tensor cos = rotate ? random_host({n, d / 2}) : Tensor();
      Tensor sin = rotate ? random_host({n, d / 2}) : Tensor();
      std::vector<int64_t> slots = distinct_slots(n, blocks * bs);
      Tensor t_slots = slots_tensor(slots);
      // Row n / 2 is padding on CUDA (slot -1, skipped; the CPU refuses it): the CPU writes it
      // to its slot, which then gets its old contents back below.
      const int64_t pad_slot = slots[n / 2], row = kv_heads * d;
      slots[n / 2] = -1;
      Tensor g_slots = slots_tensor(slots);
      Tensor q = Tensor::empty(DType::kF32, {n, heads, d});
      Tensor k = Tensor::empty(DType::kF32, {n, kv_heads, d}),
             v = Tensor::empty(DType::kF32, {n, kv_heads, d});
      Tensor kc = random_host({blocks, bs, kv_heads, d}),
             vc = random_host({blocks, bs, kv_heads, d});
      if (fp8) {
        kc = to_e4m3(kc);
        vc = to_e4m3(vc);
      }
      Tensor gkc = fp8 ? ops::to_device(kc, Device::kCuda) : to_gpu_bf16(kc);
      Tensor gvc = fp8 ? ops::to_device(vc, Device::kCuda) : to_gpu_bf16(vc);
      const int64_t esize = fp8 ? 1 : 4;  // bytes of a cache element on the host
      auto* kb = static_cast<std::byte*>(kc.raw()) + pad_slot * row * esize;
      auto* vb = static_cast<std::byte*>(vc.raw()) + pad_slot * row * esize;
      const std::vector<std::byte> k_old(kb, kb + row * esize), v_old(vb, vb + row * esize);
      ops::qkv_rotary_kv_write(qkv, cos, sin, t_slots, q, k, v, kc, vc);
      std::copy(k_old.begin(), k_old.end(), kb);
      std::copy(v_old.begin(), v_old.end(), vb);
      kc = cache_values(kc);
      vc = cache_values(vc);
      Tensor gq = poisoned_gpu({n, heads, d}), gk = poisoned_gpu({n, kv_heads, d}),
             gv = poisoned_gpu({n, kv_heads, d});
      const auto dev = [](const Tensor& t) {
        return t.defined() ? ops::to_device(t, Device::kCuda) : Tensor();
      };
      ops::qkv_rotary_kv_write(to_gpu_bf16(qkv), dev(cos), dev(sin), dev(g_slots), gq, gk, gv, gkc,
                               gvc);
      EXPECT_LE(gpu_error(gq, q), kElementwiseBound) << heads << "/" << kv_heads << " d" << d;
      EXPECT_LE(norm_error(cache_values(gkc), kc), kElementwiseBound)
          << heads << "/" << kv_heads << " d" << d << " fp8 " << fp8;
      EXPECT_EQ(norm_error(cache_values(gvc), vc), 0.0)
          << heads << "/" << kv_heads << " d" << d << " fp8 " << fp8;
    }
}

}  // namespace
}  // namespace kestrel

namespace kestrel {
namespace {

// The name reports print (bench's first line, serve's log): the card and its SM count.
TEST(CudaOps, DeviceNameSaysWhichCard) {
  REQUIRE_GPU();
  const std::string name = ops::device_name(Device::kCuda);
  EXPECT_EQ(name.rfind("cuda: ", 0), 0u) << name;
  EXPECT_NE(name.find(" SMs"), std::string::npos) << name;
  EXPECT_GT(name.size(), std::string("cuda: , 1 SMs").size()) << name;
  EXPECT_EQ(ops::device_name(Device::kCpu), "cpu");
}

TEST(CudaOps, RandomUniformMatchesCpu) {
  REQUIRE_GPU();
  for (float amp : {0.0f, 0.5f}) {
    Tensor cpu = ops::random_uniform({1000, 7}, DType::kF32, Device::kCpu, 42, amp, 1.0f);
    Tensor gpu = ops::random_uniform({1000, 7}, DType::kF32, Device::kCuda, 42, amp, 1.0f);
    EXPECT_LE(norm_error(ops::to_host_f32(gpu), cpu), 1e-6);
  }
}

}  // namespace
}  // namespace kestrel
