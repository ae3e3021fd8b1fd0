// ops::lora_add and ops::lora_add_table on CUDA against the CPU op: decode (one row a segment),
// prefill segments, mixed ranks 1..128, F16 weights, odd shapes (scalar loads), device-side
// tables with unused and rank-0 entries. Timing: bench/cuda_ops_bench.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "cuda_test_util.h"

namespace kestrel {
namespace {

using namespace test;  // NOLINT(google-build-using-namespace): the shared test helpers

// --- LoRA (ops::lora_add) ---------------------------------------------------------------------

constexpr double kLoraBound = 1e-2;  // out rounded once to bf16 after base + fp32 delta

struct LoraCase {
  int64_t in, out;
  std::vector<int64_t> ranks;                     // one per segment
  std::vector<std::pair<int32_t, int32_t>> rows;  // [begin, end) per segment
  int64_t n_rows;
};

// How check_lora's adapter weights are made: bf16 values on the GPU as bf16; F16-precision
// values on the GPU as F16 (every other segment, or all), or the same values rounded to bf16.
enum class LoraWeights { kBf16, kF16, kF16Mixed, kF16AsBf16 };

// A host F32 tensor of uniform values in [lo, hi), rounded to F16.
Tensor random_host_f16(Shape shape, float lo, float hi) {
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = f16_to_f32(f32_to_f16(u(rng())));
  return t;
}

Tensor to_gpu_f16(const Tensor& host) {
  Tensor h = Tensor::empty(DType::kF16, host.shape());
  for (int64_t i = 0; i < host.numel(); ++i)
    h.data<uint16_t>()[i] = f32_to_f16(host.data<float>()[i]);
  return ops::to_device(h, Device::kCuda);
}

// Checks the CUDA op against the CPU op (F32) and returns the delta's own normalised error.
// zero_base: out starts at 0, so the delta's error is not hidden under the base's rounding.
double check_lora(const LoraCase& c, LoraWeights w = LoraWeights::kBf16, bool zero_base = false) {
  Tensor x = random_host({c.n_rows, c.in});
  Tensor base = random_host({c.n_rows, c.out});
  if (zero_base) std::fill(base.data<float>(), base.data<float>() + base.numel(), 0.0f);
  std::vector<Tensor> a, b, ga, gb;
  for (int64_t r : c.ranks) {
    const bool f16_values = w != LoraWeights::kBf16;
    a.push_back(f16_values ? random_host_f16({r, c.in}, -0.1f, 0.1f)
                           : random_host({r, c.in}, -0.1f, 0.1f));
    b.push_back(f16_values ? random_host_f16({c.out, r}, -0.1f, 0.1f)
                           : random_host({c.out, r}, -0.1f, 0.1f));
    const bool as_f16 =
        w == LoraWeights::kF16 || (w == LoraWeights::kF16Mixed && a.size() % 2 == 1);
    ga.push_back(as_f16 ? to_gpu_f16(a.back()) : to_gpu_bf16(a.back()));
    gb.push_back(as_f16 ? to_gpu_f16(b.back()) : to_gpu_bf16(b.back()));
  }
  std::vector<ops::LoraSegment> seg, gseg;
  for (size_t s = 0; s < c.ranks.size(); ++s) {
    const float scale = 0.5f + static_cast<float>(s % 4);
    seg.push_back({c.rows[s].first, c.rows[s].second, &a[s], &b[s], scale});
    gseg.push_back({c.rows[s].first, c.rows[s].second, &ga[s], &gb[s], scale});
  }
  Tensor ref = Tensor::empty(DType::kF32, {c.n_rows, c.out});
  std::copy(base.data<float>(), base.data<float>() + base.numel(), ref.data<float>());
  ops::lora_add(x, seg, ref);
  Tensor out = to_gpu_bf16(base);
  ops::lora_add(to_gpu_bf16(x), gseg, out);
  Tensor got = ops::to_host_f32(out);
  // Rows in no segment: exactly the base. The rest: normalised error of the delta.
  std::vector<bool> covered(static_cast<size_t>(c.n_rows), false);
  for (auto [b0, e0] : c.rows)
    for (int32_t i = b0; i < e0; ++i) covered[static_cast<size_t>(i)] = true;
  double num = 0.0, den = 0.0;
  int64_t changed_base = 0;
  for (int64_t i = 0; i < c.n_rows; ++i) {
    for (int64_t o = 0; o < c.out; ++o) {
      const int64_t k = i * c.out + o;
      const double g = got.data<float>()[k], r = ref.data<float>()[k], b0 = base.data<float>()[k];
      if (!covered[static_cast<size_t>(i)]) {
        changed_base += g != b0;
        continue;
      }
      num += (g - r) * (g - r);
      den += (r - b0) * (r - b0);
      if (!std::isfinite(g)) num = INFINITY;
    }
  }
  EXPECT_EQ(changed_base, 0) << "rows outside the segments changed";
  // Error relative to the delta's size, plus bf16's rounding of the base it is added to.
  double base_den = 0.0;
  for (int64_t k = 0; k < ref.numel(); ++k) base_den += ref.data<float>()[k] * ref.data<float>()[k];
  const double err = std::sqrt(num / std::max(den, 1e-30));
  const double err_total = std::sqrt(num / std::max(base_den, 1e-30));
  EXPECT_LE(err_total, kLoraBound) << c.in << "->" << c.out << " segments " << c.ranks.size();
  // The delta itself (r up to 64, 0.1-scaled weights): within 5e-2 of its own norm; the
  // bf16 rounding of out (relative 2^-9 of the base) dominates when the delta is small.
  EXPECT_LE(err, 5e-2 + 4e-3 * std::sqrt(base_den / std::max(den, 1e-30)))
      << c.in << "->" << c.out << " segments " << c.ranks.size();
  return err;
}

TEST(CudaOps, LoraAddMatchesCpu) {
  REQUIRE_GPU();
  // Decode: 1 row per segment at falcon-7b's qkv, fc2 and fc1 shapes (the shrink splits `in`
  // over blocks here, up to 64 parts): 32 adapters of one rank covering every row, and 1, 3 or
  // 32 segments of mixed ranks with a row in no segment on either side.
  for (int64_t r : {1, 8, 16, 24, 64, 128}) {
    for (auto [in, out] : {std::pair<int64_t, int64_t>{4544, 4672}, {18176, 4544}, {4544, 18176}}) {
      LoraCase all{in, out, {}, {}, 32};
      for (int32_t s = 0; s < 32; ++s) {
        all.ranks.push_back(r);
        all.rows.push_back({s, s + 1});
      }
      check_lora(all);
      for (int32_t n : {1, 3, 32}) {
        LoraCase c{in, out, {}, {}, n + 2};
        for (int32_t s = 0; s < n; ++s) {
          c.ranks.push_back(s % 3 == 2 ? std::max<int64_t>(1, r / 2) : r);
          c.rows.push_back({s + 1, s + 2});
        }
        check_lora(c);
      }
    }
  }
  // Batch 1 (one row, the most splits), and 8 adapters of 4 rows (tiles of 4 rows).
  for (int64_t r : {16, 128}) {
    check_lora({18176, 4544, {r}, {{0, 1}}, 1});
    check_lora({4544, 18176, {r}, {{0, 1}}, 1});
  }
  {
    LoraCase c{4544, 4672, {}, {}, 32};
    for (int32_t s = 0; s < 8; ++s) {
      c.ranks.push_back(16);
      c.rows.push_back({4 * s, 4 * s + 4});
    }
    check_lora(c);
  }
  // Prefill: long segments with gaps (rows 0-2, 300-309 and 700-719 in none), mixed ranks.
  check_lora({4544, 4672, {16, 8, 64}, {{3, 300}, {310, 700}, {720, 1024}}, 1024});
  check_lora({18176, 4544, {128, 1, 24}, {{0, 13}, {13, 200}, {250, 256}}, 260});
  // A prefill segment next to decode rows of other adapters, ranks 1 .. 128, gaps.
  check_lora({4544, 4544, {32, 1, 128, 8}, {{0, 97}, {97, 98}, {99, 100}, {101, 102}}, 103});
  // Small odd shapes (scalar loads), ranks 1 .. 64, one segment up to 64 segments with gaps.
  check_lora({37, 53, {1}, {{0, 5}}, 5});
  check_lora({37, 53, {3, 7, 64}, {{1, 2}, {4, 19}, {19, 30}}, 33});
  check_lora({37, 53, {1, 3, 7, 64, 5}, {{0, 1}, {1, 2}, {3, 4}, {4, 5}, {6, 7}}, 7});
  {
    LoraCase c{100, 260, {}, {}, 130};
    for (int32_t s = 0; s < 64; ++s) {
      c.ranks.push_back(1 + (s * 7) % 64);
      c.rows.push_back({2 * s, 2 * s + 1 + (s % 2)});
    }
    check_lora(c);
  }
  // 300 segments: more than one table upload of 256 in one call.
  {
    LoraCase c{64, 96, {}, {}, 300};
    for (int32_t s = 0; s < 300; ++s) {
      c.ranks.push_back(8);
      c.rows.push_back({s, s + 1});
    }
    check_lora(c);
  }
}

// F16 adapter weights stay F16 on the GPU: the same F16-precision values give a smaller error
// than when rounded to bf16 (out starts at 0, so the delta's error shows), and F16 and bf16
// segments mix in one call; the scalar paths (in % 8 != 0, r % 8 != 0) read F16 too.
TEST(CudaOps, LoraAddF16Weights) {
  REQUIRE_GPU();
  LoraCase c{4544, 4672, {}, {}, 32};
  for (int32_t s = 0; s < 32; ++s) {
    c.ranks.push_back(16);
    c.rows.push_back({s, s + 1});
  }
  const double e16 = check_lora(c, LoraWeights::kF16, true);
  const double ebf = check_lora(c, LoraWeights::kF16AsBf16, true);
  std::printf("lora_add delta error, F16 weights kept %.3e, rounded to bf16 %.3e\n", e16, ebf);
  EXPECT_LT(e16, ebf);
  EXPECT_LE(e16, 3e-3);  // out's own bf16 rounding (2^-9 rms relative) and fp32 sums
  check_lora(c, LoraWeights::kF16Mixed);
  check_lora({4544, 4672, {16, 8, 64}, {{3, 300}, {310, 700}, {720, 1024}}, 1024},
             LoraWeights::kF16Mixed);
  check_lora({37, 53, {3, 7, 64}, {{1, 2}, {4, 19}, {19, 30}}, 33}, LoraWeights::kF16);
  check_lora({100, 260, {5, 16}, {{0, 1}, {1, 9}}, 9}, LoraWeights::kF16Mixed);
  check_lora({100, 260, {5, 16, 16, 9}, {{0, 1}, {1, 2}, {2, 3}, {5, 6}}, 6},
             LoraWeights::kF16Mixed);
  LoraCase eight{4544, 4672, {}, {}, 8};
  for (int32_t s = 0; s < 8; ++s) {
    eight.ranks.push_back(16);
    eight.rows.push_back({s, s + 1});
  }
  check_lora(eight, LoraWeights::kF16Mixed);
}

// One entry of a device-side table: its row (-1: unused, begin == end), rank (0: an entry with
// no weights, which must leave its row as it is) and whether its weights are F16.
struct TableEntrySpec {
  int32_t row;
  int64_t r;
  bool f16 = false;
};

// ops::lora_add_table against the CPU's lora_add over x [n_rows, in]; the error is normalised
// over the named rows; the other rows must come back exactly as they were.
void check_table(int64_t in, int64_t out_dim, int64_t n_rows,
                 const std::vector<TableEntrySpec>& spec, int max_r) {
  Tensor x = random_host({n_rows, in});
  Tensor base = random_host({n_rows, out_dim}, -2.0f, 2.0f);
  Tensor ref = Tensor::empty(DType::kF32, {n_rows, out_dim});
  std::copy(base.data<float>(), base.data<float>() + base.numel(), ref.data<float>());
  std::vector<Tensor> a(spec.size()), b(spec.size()), ga(spec.size()), gb(spec.size());
  std::vector<ops::LoraTableEntry> table(spec.size());
  std::vector<bool> named(static_cast<size_t>(n_rows), false);
  for (size_t i = 0; i < spec.size(); ++i) {
    const TableEntrySpec& e = spec[i];
    if (e.row < 0) continue;  // unused: default entry, begin == end
    named[static_cast<size_t>(e.row)] = true;
    if (e.r == 0) {
      table[i].begin = e.row;
      table[i].end = e.row + 1;
      continue;
    }
    a[i] = e.f16 ? random_host_f16({e.r, in}, -0.1f, 0.1f) : random_host({e.r, in}, -0.1f, 0.1f);
    b[i] = e.f16 ? random_host_f16({out_dim, e.r}, -0.1f, 0.1f)
                 : random_host({out_dim, e.r}, -0.1f, 0.1f);
    ga[i] = e.f16 ? to_gpu_f16(a[i]) : to_gpu_bf16(a[i]);
    gb[i] = e.f16 ? to_gpu_f16(b[i]) : to_gpu_bf16(b[i]);
    const float scale = 0.5f + static_cast<float>(i % 3);
    ops::lora_add(x, {{e.row, e.row + 1, &a[i], &b[i], scale}}, ref);
    table[i] = ops::lora_table_entry({e.row, e.row + 1, &ga[i], &gb[i], scale}, in);
  }
  const int64_t words = static_cast<int64_t>(table.size() * sizeof(ops::LoraTableEntry) / 4);
  Tensor host_table = Tensor::empty(DType::kI32, {words});
  std::memcpy(host_table.raw(), table.data(), table.size() * sizeof(ops::LoraTableEntry));
  Tensor dev_table = ops::to_device(host_table, Device::kCuda);
  Tensor out = to_gpu_bf16(base);
  ops::lora_add_table(to_gpu_bf16(x), dev_table.raw(), static_cast<int>(spec.size()), max_r, out);
  Tensor got = ops::to_host_f32(out);
  double num = 0.0, den = 0.0;
  int64_t changed = 0;
  for (int64_t i = 0; i < n_rows; ++i) {
    for (int64_t o = 0; o < out_dim; ++o) {
      const int64_t k = i * out_dim + o;
      const double g = got.data<float>()[k], r = ref.data<float>()[k];
      if (!named[static_cast<size_t>(i)]) {
        changed += g != base.data<float>()[k];
        continue;
      }
      num += std::isfinite(g) ? (g - r) * (g - r) : INFINITY;
      den += r * r;
    }
  }
  EXPECT_EQ(changed, 0) << "rows no entry names changed";
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), kLoraBound)
      << in << "->" << out_dim << " entries " << spec.size();
}

// Device-side tables as decode graphs fill them: one row an entry, unused entries after the
// rows, adapters of several ranks up to the bound (F16 and bf16), rank-0 entries, buckets of
// 1 to 40, scalar loads.
TEST(CudaOps, LoraAddTableMatchesCpu) {
  REQUIRE_GPU();
  // Bucket 40 over 34 rows: 24 adapter rows (every third F16), 8 rank-0 entries, 2 rows unnamed.
  std::vector<TableEntrySpec> bucket40;
  for (int32_t i = 0; i < 32; ++i) bucket40.push_back({i, i % 4 == 3 ? 0 : 16, i % 3 == 0});
  for (int i = 0; i < 8; ++i) bucket40.push_back({-1, 0});
  check_table(4544, 18176, 34, bucket40, 16);
  // Bound 32: ranks 8, 32, 1 (scalar b loads) and 0.
  check_table(4544, 4672, 12, {{0, 8}, {1, 32}, {2, 1}, {3, 0}, {5, 32}, {6, 8}, {-1, 0}, {-1, 0}},
              32);
  // Buckets 1 and 2 (batch 1).
  check_table(18176, 4544, 1, {{0, 16}}, 16);
  check_table(4544, 18176, 2, {{1, 16}, {0, 0}}, 16);
  // Bound 128 at fc2's shape; in % 8 != 0 (scalar x and a).
  check_table(18176, 4544, 8, {{0, 128}, {2, 64}, {3, 128, true}, {7, 100}, {-1, 0}}, 128);
  check_table(100, 260, 6, {{0, 3}, {1, 8}, {2, 0}, {4, 16, true}, {-1, 0}}, 16);
}

TEST(CudaOps, LoraAddRefusesRankAbove128) {
  REQUIRE_GPU();
  Tensor x = to_gpu_bf16(random_host({2, 64})), out = to_gpu_bf16(random_host({2, 32}));
  Tensor a = to_gpu_bf16(random_host({129, 64})), b = to_gpu_bf16(random_host({32, 129}));
  std::vector<ops::LoraSegment> seg{{0, 2, &a, &b, 1.0f}};
  try {
    ops::lora_add(x, seg, out);
    FAIL() << "rank 129 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kestrel
