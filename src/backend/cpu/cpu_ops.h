// The CPU implementations of backend/ops.h (fp32, OpenMP over both cores,
// OpenBLAS GEMM when built with it). Inputs were checked by ops.cpp.
#pragma once

#include <cstdint>

#include <vector>
#include "core/tensor.h"

namespace kestrel::ops {
struct LoraSegment;
struct LinearEpilogue;
}  // namespace kestrel::ops

namespace kestrel::cpu {

Tensor random_uniform(const Shape& shape, DType dtype, uint64_t seed, float amp, float constant);
void embedding(const Tensor& ids, const Tensor& table, Tensor& out);
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out);
void quantize_fp8(const Tensor& weight, Tensor& q, Tensor& scale);
void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
            const ops::LinearEpilogue& epilogue);
void gelu(Tensor& x);
void add(const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out);
void qkv_rotary(const Tensor& qkv, const Tensor& cos, const Tensor& sin, Tensor& q, Tensor& k,
                Tensor& v);
void kv_write(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
              Tensor& v_cache);
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& block_tables, const Tensor& cu_q, const Tensor& kv_lens,
                     int32_t max_kv_len, float scale, Tensor& out, const Tensor& alibi_slopes);
void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out);
void argmax_rows(const Tensor& logits, Tensor& out);
void greedy_rows(const Tensor& logits, Tensor& ids, Tensor& logprobs);
void apply_token_bitmask(Tensor& logits, const std::vector<int32_t>& rows,
                         const std::vector<int32_t>& bitmask, int64_t words);
void lora_add(const Tensor& x, const std::vector<ops::LoraSegment>& segments, Tensor& out);

}  // namespace kestrel::cpu
