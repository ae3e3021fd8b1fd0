// The CUDA kernels at falcon-7b's shapes, timed with Google Benchmark (manual time: the device's
// work between two synchronisations): paged attention (the tensor-core v3 against the generic
// v1), the linears of 1-8 rows (cuBLASLt against each GEMV variant, weights rotated past the L2),
// the linears of 4-128 rows (cuBLASLt against the wgmma decode GEMM), and one decode step's LoRA
// work beside the base linears. Counters give TFLOP/s or TB/s.
//   cuda_ops_bench [--benchmark_filter=Attention|Linear|DecodeGemm|Residual|Pair|Lora]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cuda/tuning.h"
#include "backend/ops.h"

namespace {

using namespace kestrel;  // NOLINT(google-build-using-namespace): a benchmark's main file

Tensor device_bf16(const Shape& shape, uint64_t seed, float amp = 1.0f) {
  return ops::random_uniform(shape, DType::kBF16, Device::kCuda, seed, amp, 0.0f);
}

Tensor device_i32(const std::vector<int32_t>& v, const Shape& shape) {
  Tensor t = Tensor::empty(DType::kI32, shape);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return ops::to_device(t, Device::kCuda);
}

void with_tuning(void (*set)(cuda::Tuning&, int), int value) {
  cuda::Tuning t = cuda::tuning();
  set(t, value);
  cuda::set_tuning(t);
}

// Runs `fn` per iteration, timing the device from launch to completion.
template <typename Fn>
void time_device(benchmark::State& state, Fn&& fn) {
  for (int w = 0; w < 3; ++w) fn(0);
  ops::synchronize(Device::kCuda);
  int64_t i = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(++i);
    ops::synchronize(Device::kCuda);
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

struct AttentionShape {
  const char* name;
  int64_t n_heads, n_kv_heads, head_dim, batch;
  int32_t q_len, kv_len;
};
const AttentionShape kAttention[] = {{"prefill 1x2048", 71, 1, 64, 1, 2048, 2048},
                                     {"prefill 8x512", 71, 1, 64, 8, 512, 512},
                                     {"decode b1 ctx 256", 71, 1, 64, 1, 1, 256},
                                     {"decode b32 ctx 256", 71, 1, 64, 32, 1, 256},
                                     {"decode b128 ctx 256", 71, 1, 64, 128, 1, 256},
                                     {"gqa32x8 d128 prefill 1x2048", 32, 8, 128, 1, 2048, 2048}};

// Args: shape index, kernel (2 = v3, 1 = v1). Causal FLOPs: 4 d per (row, key) pair in range.
void BM_Attention(benchmark::State& state) {
  const AttentionShape& c = kAttention[state.range(0)];
  const int kernel = static_cast<int>(state.range(1));
  state.SetLabel(std::string(c.name) + (kernel == 2 ? ", v3" : ", v1"));
  const int64_t bs = 16, per_seq = (c.kv_len + bs - 1) / bs, blocks = c.batch * per_seq;
  const int64_t n_tokens = c.batch * c.q_len;
  std::vector<int32_t> tables(blocks), cu{0}, lens;
  std::iota(tables.begin(), tables.end(), 0);
  double flops = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    cu.push_back(cu.back() + c.q_len);
    lens.push_back(c.kv_len);
    for (int32_t j = 0; j < c.q_len; ++j)
      flops += 4.0 * c.head_dim * c.n_heads * (c.kv_len - c.q_len + j + 1);
  }
  const Tensor q = device_bf16({n_tokens, c.n_heads, c.head_dim}, 1);
  const Tensor kc = device_bf16({blocks, bs, c.n_kv_heads, c.head_dim}, 2);
  const Tensor vc = device_bf16({blocks, bs, c.n_kv_heads, c.head_dim}, 3);
  const Tensor g_tables = device_i32(tables, {c.batch, per_seq});
  const Tensor g_cu = device_i32(cu, {c.batch + 1});
  const Tensor g_lens = device_i32(lens, {c.batch});
  Tensor out = Tensor::empty(DType::kBF16, {n_tokens, c.n_heads, c.head_dim}, Device::kCuda);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  with_tuning([](cuda::Tuning& t, int v) { t.attention_kernel = v; }, kernel);
  time_device(state, [&](int64_t) {
    ops::paged_attention(q, kc, vc, g_tables, g_cu, g_lens, c.kv_len, scale, out, c.q_len,
                         Tensor());
  });
  with_tuning([](cuda::Tuning& t, int v) { t.attention_kernel = v; }, 0);
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Attention)
    ->ArgsProduct({{0, 1, 2, 3, 4, 5}, {2, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

struct LinearShape {
  const char* name;
  int64_t in, out;
  bool f32_out;
};
const LinearShape kLinear[] = {{"qkv", 4544, 4672, false},
                               {"dense", 4544, 4544, false},
                               {"fc1", 4544, 18176, false},
                               {"fc2", 18176, 4544, false},
                               {"lm_head", 4544, 65024, true}};

// The operands of a linear at a shape of kLinear with m rows: weights in copies that together
// pass 200 MB (rotated, so the L2 does not serve them), x, out; bytes: one copy's.
struct LinearOperands {
  std::vector<Tensor> ws;
  Tensor x, out;
  double bytes = 0;
  int64_t copies = 0;

  LinearOperands(const LinearShape& sh, int64_t m) : bytes(2.0 * sh.in * sh.out) {
    copies = std::max(2, static_cast<int>(std::ceil(200e6 / bytes)));
    for (int64_t i = 0; i < copies; ++i) ws.push_back(device_bf16({sh.out, sh.in}, 7 + i, 0.03f));
    x = device_bf16({m, sh.in}, 3);
    out = Tensor::empty(sh.f32_out ? DType::kF32 : DType::kBF16, {m, sh.out}, Device::kCuda);
  }
  void run(int64_t i) { ops::linear(x, ws[i % copies], Tensor(), out); }
  void count(benchmark::State& state) const {
    state.counters["TB/s"] =
        benchmark::Counter(bytes * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  }
};

// Args: shape index, rows, GEMV mode (0 cuBLASLt, 1..6 the variant). Weights rotate over copies
// that together pass 200 MB, so the L2 does not serve them.
void BM_Linear(benchmark::State& state) {
  const LinearShape& sh = kLinear[state.range(0)];
  const int64_t m = state.range(1);
  const int mode = static_cast<int>(state.range(2));
  state.SetLabel(std::string(sh.name) + (mode == 0 ? ", cublaslt" : ", gemv v") +
                 (mode == 0 ? "" : std::to_string(mode)));
  LinearOperands op(sh, m);
  with_tuning([](cuda::Tuning& t, int v) { t.gemv = v; }, mode);
  time_device(state, [&](int64_t i) { op.run(i); });
  with_tuning([](cuda::Tuning& t, int v) { t.gemv = v; }, -1);
  op.count(state);
}
BENCHMARK(BM_Linear)
    ->ArgsProduct({{0, 1, 2, 3, 4}, {1, 2, 4, 8}, {0, 1, 2, 3, 4, 5, 6}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Times run(i) (i = 1, 2, ...) 8 times back to back per iteration, as in a forward, after 3
// warm-up calls; reports the time of one.
template <typename Run>
void time_back_to_back(benchmark::State& state, Run run) {
  constexpr int kLaunches = 8;
  int64_t i = 0;
  for (int w = 0; w < 3; ++w) run(++i);
  ops::synchronize(Device::kCuda);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int l = 0; l < kLaunches; ++l) run(++i);
    ops::synchronize(Device::kCuda);
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kLaunches);
  }
}

// Args: shape index, rows, mode (0 cuBLASLt, 1..2 the wgmma decode GEMM's variant). Each timed
// iteration is 8 launches back to back, as in a forward (the per-launch time is reported).
void BM_DecodeGemm(benchmark::State& state) {
  const LinearShape& sh = kLinear[state.range(0)];
  const int mode = static_cast<int>(state.range(2));
  state.SetLabel(std::string(sh.name) +
                 (mode == 0 ? ", cublaslt" : ", decode gemm v" + std::to_string(mode)));
  LinearOperands op(sh, state.range(1));
  with_tuning([](cuda::Tuning& t, int v) { t.gemv = v; }, 0);
  with_tuning([](cuda::Tuning& t, int v) { t.decode_gemm = v; }, mode);
  time_back_to_back(state, [&](int64_t i) { op.run(i); });
  with_tuning([](cuda::Tuning& t, int v) { t.gemv = v; }, -1);
  with_tuning([](cuda::Tuning& t, int v) { t.decode_gemm = v; }, cuda::Tuning{}.decode_gemm);
  op.count(state);
}
BENCHMARK(BM_DecodeGemm)
    ->ArgsProduct({{0, 1, 2, 3, 4}, {4, 16, 32, 64, 128}, {0, 2, 3, 4}})
    ->UseManualTime()
    ->MinTime(0.05)
    ->Unit(benchmark::kMicrosecond);

// Parallel attention's residual at falcon-7b's shapes: x += fc2(ffn) + dense(attn), as two
// linears (dense apart, then fc2 with it as the addend) or as one linear of two products.
// Args: rows, fused (0 / 1), decode GEMM mode (0 cuBLASLt, -1 its choice, 1..4 a variant); the
// GEMV as linear picks it. Each timed iteration is 8 of them back to back (per pair reported);
// weights rotate past the L2.
void BM_Residual(benchmark::State& state) {
  const int64_t m = state.range(0);
  const bool fused = state.range(1) != 0;
  const int mode = static_cast<int>(state.range(2));
  state.SetLabel(std::string(fused ? "fused" : "apart") + ", decode gemm " + std::to_string(mode));
  LinearOperands fc2(kLinear[3], m), dense(kLinear[1], m);
  Tensor x = device_bf16({m, 4544}, 5), attn_out = device_bf16({m, 4544}, 6);
  with_tuning([](cuda::Tuning& t, int v) { t.decode_gemm = v; }, mode);
  with_tuning([](cuda::Tuning& t, int v) { t.two_products = v != 0; }, 1);
  auto run = [&](int64_t i) {
    const Tensor& wd = dense.ws[i % dense.copies];
    const Tensor& wf = fc2.ws[i % fc2.copies];
    if (fused) {
      ops::linear(fc2.x, wf, Tensor(), x, {.accumulate = true, .plus = {&dense.x, &wd}});
    } else {
      ops::linear(dense.x, wd, Tensor(), attn_out);
      ops::linear(fc2.x, wf, Tensor(), x, {.accumulate = true, .addend = &attn_out});
    }
  };
  time_back_to_back(state, run);
  with_tuning([](cuda::Tuning& t, int v) { t.decode_gemm = v; }, cuda::Tuning{}.decode_gemm);
  with_tuning([](cuda::Tuning& t, int v) { t.two_products = v != 0; }, cuda::Tuning{}.two_products);
  state.counters["TB/s"] = benchmark::Counter((fc2.bytes + dense.bytes) * 1e-12,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Residual)
    ->ArgsProduct({{1, 2, 4, 16, 32, 64, 128}, {0, 1}, {0, -1, 4}})
    ->UseManualTime()
    ->MinTime(0.05)
    ->Unit(benchmark::kMicrosecond);

// The LayerNorm, then qkv and fc1 + GELU of its output at falcon-7b's shapes: form 0 the norm
// and two linears, 1 the norm and one linear_pair, 2 linear_pair with the norm folded into the
// GEMV where it takes the rows (ops::PairNorm). Args: rows, form, decode GEMM mode (as
// BM_Residual's).
void BM_Pair(benchmark::State& state) {
  const int64_t m = state.range(0);
  const int form = static_cast<int>(state.range(1));
  const int mode = static_cast<int>(state.range(2));
  state.SetLabel(std::string(form == 0   ? "apart"
                             : form == 1 ? "pair"
                                         : "pair + norm") +
                 ", decode gemm " + std::to_string(mode));
  LinearOperands qkv(kLinear[0], m), fc1(kLinear[2], m);
  Tensor x = device_bf16({m, 4544}, 7), ln = device_bf16({m, 4544}, 8);
  Tensor g = device_bf16({4544}, 9), b = device_bf16({4544}, 10);
  with_tuning([](cuda::Tuning& t, int v) { t.decode_gemm = v; }, mode);
  with_tuning([](cuda::Tuning& t, int v) { t.two_products = v != 0; }, form > 0 ? 1 : 0);
  with_tuning([](cuda::Tuning& t, int v) { t.norm_in_gemv = v != 0; }, form == 2 ? 1 : 0);
  auto run = [&](int64_t i) {
    ops::linear_pair(x, qkv.ws[i % qkv.copies], Tensor(), qkv.out, fc1.ws[i % fc1.copies], Tensor(),
                     fc1.out, true, {&g, &b, 1e-5f, &ln});
  };
  time_back_to_back(state, run);
  with_tuning([](cuda::Tuning& t, int v) { t.decode_gemm = v; }, cuda::Tuning{}.decode_gemm);
  with_tuning([](cuda::Tuning& t, int v) { t.two_products = v != 0; }, cuda::Tuning{}.two_products);
  with_tuning([](cuda::Tuning& t, int v) { t.norm_in_gemv = v != 0; }, cuda::Tuning{}.norm_in_gemv);
  state.counters["TB/s"] = benchmark::Counter((qkv.bytes + fc1.bytes) * 1e-12,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Pair)
    ->ArgsProduct({{1, 2, 4, 16, 32, 64, 128}, {0, 1, 2}, {0, -1, 4}})
    ->UseManualTime()
    ->MinTime(0.05)
    ->Unit(benchmark::kMicrosecond);

// One decode step's LoRA work at falcon-7b's shapes: 4 modules x 32 layers, `batch` rows (one a
// sequence) over `adapters` distinct rank-16 adapters (sorted: one segment each). Args: batch,
// adapters; adapters 0 times the step's base linears instead.
void BM_LoraDecode(benchmark::State& state) {
  const int64_t batch = state.range(0), n_adapters = state.range(1), rank = 16;
  const std::vector<std::pair<int64_t, int64_t>> mods{
      {4544, 4672}, {4544, 4544}, {4544, 18176}, {18176, 4544}};
  std::vector<Tensor> xs, outs, ws;
  for (size_t m = 0; m < mods.size(); ++m) {
    xs.push_back(device_bf16({batch, mods[m].first}, 10 + m));
    outs.push_back(device_bf16({batch, mods[m].second}, 20 + m));
    ws.push_back(device_bf16({mods[m].second, mods[m].first}, 30 + m, 0.01f));
  }
  if (n_adapters == 0) {
    state.SetLabel("base linears");
    time_device(state, [&](int64_t) {
      for (int l = 0; l < 32; ++l)
        for (size_t m = 0; m < mods.size(); ++m) ops::linear(xs[m], ws[m], Tensor(), outs[m]);
    });
    return;
  }
  std::vector<std::vector<Tensor>> a(32 * mods.size()), b(32 * mods.size());
  uint64_t seed = 100;
  for (size_t k = 0; k < a.size(); ++k)
    for (int64_t s = 0; s < n_adapters; ++s) {
      a[k].push_back(device_bf16({rank, mods[k % mods.size()].first}, seed++, 0.05f));
      b[k].push_back(device_bf16({mods[k % mods.size()].second, rank}, seed++, 0.05f));
    }
  state.SetLabel("lora_add, rank 16");
  time_device(state, [&](int64_t) {
    for (int l = 0; l < 32; ++l)
      for (size_t m = 0; m < mods.size(); ++m) {
        const size_t k = l * mods.size() + m;
        std::vector<ops::LoraSegment> seg;
        for (int64_t s = 0; s < n_adapters; ++s)
          seg.push_back({static_cast<int32_t>(s * batch / n_adapters),
                         static_cast<int32_t>((s + 1) * batch / n_adapters), &a[k][s], &b[k][s],
                         2.0f});
        ops::lora_add(xs[m], seg, outs[m]);
      }
  });
  const double bytes = 32.0 * n_adapters * rank * (31808 + 31936) * 2;
  state.counters["TB/s"] =
      benchmark::Counter(bytes * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_LoraDecode)
    ->Args({1, 0})
    ->Args({1, 1})
    ->Args({32, 0})
    ->Args({32, 1})
    ->Args({32, 8})
    ->Args({32, 32})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (ops::cuda_device_count() == 0) {
    std::fprintf(stderr, "cuda_ops_bench: no CUDA device visible\n");
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
