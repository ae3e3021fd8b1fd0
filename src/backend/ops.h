// The ops the model is written against. Each checks its inputs here, once, and
// dispatches on the device of its tensors to backend/cpu or backend/cuda; the
// model never branches on the backend. Shapes use the fixed dimension names:
// n_tokens (T), n_seqs (B), n_heads, n_kv_heads, head_dim (d).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace kestrel::ops {

// Whether this build has the CUDA backend.
bool cuda_available();
// Visible CUDA devices (0 without the backend, a driver or a GPU).
int cuda_device_count();
// Waits for the device's queued work (no-op on the CPU).
void synchronize(Device device);

// A copy of `src` on `device` (the same tensor when it already is there).
Tensor to_device(const Tensor& src, Device device);
// A host F32 copy of `src` (any float dtype, any device): logits and hidden
// states for CPU consumers.
Tensor to_host_f32(const Tensor& src);
// The weight dtype the backend computes with: F32 on the CPU, BF16 on CUDA.
DType weight_dtype(Device device);
// Converts host weights (F32/F16/BF16) into a new tensor of `dtype` on `device`.
Tensor upload_weight(const void* data, DType src_dtype, const Shape& shape, DType dtype,
                     Device device);

// A new tensor of uniform values in [-amp, amp] (amp 0: all `constant`), from a
// counter-based hash of (seed, index): the same values on every device.
Tensor random_uniform(const Shape& shape, DType dtype, Device device, uint64_t seed, float amp,
                      float constant);

// out[t] = table[ids[t]]. ids [T] I32, table [vocab, hidden], out [T, hidden].
void embedding(const Tensor& ids, const Tensor& table, Tensor& out);

// out = LayerNorm(x) * weight + bias over the last dim. x, out [T, hidden].
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out);

// out = x @ weight^T (+ bias). x [T, in], weight [out, in], bias [out] or undefined.
void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out);

// x = gelu(x), exact (erf) form. In place.
void gelu(Tensor& x);

// out = a + b (+ c when defined), elementwise; out may alias a.
void add(const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out);

// Splits the fused query_key_value output and applies NeoX rotary to q and k.
// qkv [T, n_kv_heads * (n_heads / n_kv_heads + 2) * d] grouped per K/V head as
// [n_kv_heads][group queries, 1 key, 1 value][d] (every Falcon layout is this
// one: multi-query is one group, interleaved multi-head is groups of one).
// cos, sin [T, d / 2] F32, or both undefined: no rotation (ALiBi models).
// q [T, n_heads, d], k and v [T, n_kv_heads, d].
void qkv_rotary(const Tensor& qkv, const Tensor& cos, const Tensor& sin, Tensor& q, Tensor& k,
                Tensor& v);

// Writes k, v [T, n_kv_heads, d] to slots [T] I64 of the caches
// [num_blocks, block_size, n_kv_heads, d].
void kv_write(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
              Tensor& v_cache);

// Attention over the paged cache. Sequence b's new tokens are rows
// [cu_q[b], cu_q[b+1]) of q; it has kv_lens[b] tokens in the cache (its new
// ones included, already written), and new token j attends causally to
// context positions [0, kv_lens[b] - q_len + j].
// q [T, n_heads, d]; caches [num_blocks, block_size, n_kv_heads, d];
// block_tables [B, max_blocks] I32; cu_q [B + 1] I32; kv_lens [B] I32;
// out [T, n_heads, d]. max_kv_len bounds kv_lens (sizes scratch space);
// max_q_len (0: unknown, taken as T) bounds the new tokens of one sequence and
// sizes the CUDA grid.
// alibi_slopes (undefined: none) [n_heads] F32 on q's device: ALiBi as
// transformers' Falcon applies it, score = (q.k + bias) * scale with
// bias = bf16(bf16(slope[h]) * bf16(p)), p the key's absolute position in its
// sequence (so chunks, pages and cached prefixes see the same bias).
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& block_tables, const Tensor& cu_q, const Tensor& kv_lens,
                     int32_t max_kv_len, float scale, Tensor& out, int32_t max_q_len = 0,
                     const Tensor& alibi_slopes = Tensor());

// out[i] = x[indices[i]]. x [T, hidden], indices [N] I32, out [N, hidden].
void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out);

// out[i] = argmax of row i of logits [N, vocab] F32 (the first on ties); out [N] I32.
void argmax_rows(const Tensor& logits, Tensor& out);

}  // namespace kestrel::ops
