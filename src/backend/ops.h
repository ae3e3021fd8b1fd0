// The ops the model is written against. Each checks its inputs here, once, and
// dispatches on the device of its tensors to backend/cpu or backend/cuda; the
// model never branches on the backend. Shapes use the fixed dimension names:
// n_tokens (T), n_seqs (B), n_heads, n_kv_heads, head_dim (d).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
// Copies host `src` into the existing tensor `dst` on the device (same dtype and bytes).
void copy_to_device(const Tensor& src, Tensor& dst);
// A host F32 copy of `src` (any float dtype, any device): logits and hidden
// states for CPU consumers.
Tensor to_host_f32(const Tensor& src);
// The weight dtype the backend computes with: F32 on the CPU, BF16 on CUDA.
DType weight_dtype(Device device);
// Converts host weights (F32/F16/BF16) into a new tensor of `dtype` on `device`.
Tensor upload_weight(const void* data, DType src_dtype, const Shape& shape, DType dtype,
                     Device device);

// Copies `rows` rows of `width` elements between two row-major buffers on one device, of one
// dtype: row i of the block starts at element src_offset + i * src_stride of src and
// dst_offset + i * dst_stride of dst (a strided re-layout, e.g. vocabulary shards of logits).
void copy_2d(const Tensor& src, int64_t src_offset, int64_t src_stride, Tensor& dst,
             int64_t dst_offset, int64_t dst_stride, int64_t rows, int64_t width);

// A new tensor of uniform values in [-amp, amp] (amp 0: all `constant`), from a
// counter-based hash of (seed, index): the same values on every device.
Tensor random_uniform(const Shape& shape, DType dtype, Device device, uint64_t seed, float amp,
                      float constant);

// out[t] = table[ids[t]]. ids [T] I32, table [vocab, hidden], out [T, hidden].
void embedding(const Tensor& ids, const Tensor& table, Tensor& out);

// out = LayerNorm(x) * weight + bias over the last dim. x, out [T, hidden].
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out);

// What linear does with y = x @ weight^T (+ bias) before it lands in out.
// gelu: y = gelu(y), exact (erf) form, as ops::gelu. accumulate: out += y (a residual
// add, cuBLAS's beta = 1) instead of out = y; with addend (accumulate only; out's shape and
// dtype, apart from out and x): out += y + *addend, summed in fp32 and rounded once (parallel
// attention's x += attn + mlp).
// A second product that linear sums with its own before the epilogue: x2 [T, in2] @
// weight2 [out, in2]^T (+ bias2 [out]), the same rows and outputs, any in2.
struct LinearTerm {
  const Tensor* x = nullptr;
  const Tensor* weight = nullptr;
  const Tensor* bias = nullptr;  // null or undefined: none
};

struct LinearEpilogue {
  bool gelu = false;
  bool accumulate = false;
  const Tensor* addend = nullptr;
  // out += x @ weight^T + bias + plus (accumulate only, no GELU or addend, weights at full
  // width): parallel attention's x += fc2(ffn) + dense(attn), both products summed in fp32 and
  // rounded once, in one kernel where the GEMV or the decode GEMM takes the rows (CUDA; else
  // dense apart, rounded, as the addend).
  LinearTerm plus = {};
  // FP8 weights (weight F8_E4M3): the F32 scales that dequantize it, one per output row [out] or
  // one for the tensor [1]: y = x @ (weight * scale)^T. Required with an FP8 weight, refused with
  // any other.
  const Tensor* weight_scale = nullptr;
  // With an FP8 weight: x rounded per row to E4M3 with a dynamic scale (the row's amax / 448)
  // before the product, as the FP8 tensor-core GEMM does, at every row count. Without it the CPU
  // multiplies x as it is, and CUDA does so up to 8 rows (its weight-only GEMV) and rounds
  // from 9 rows on (the tensor-core GEMM).
  bool fp8_activations = false;
};

// FP8 E4M3 weights: q [out, in] F8_E4M3 and scale [out] F32 with weight ~ q * scale, one scale
// per output row (the row's amax / 448; 1 for a row of zeros), rounded to nearest even and
// saturating. weight [out, in] in the device's weight dtype or F32. A scale already defined on
// entry
// ([out] F32 on the weight's device) is used as given: a row-parallel shard of a weight is
// quantized with the scales of its whole rows.
void quantize_fp8(const Tensor& weight, Tensor& q, Tensor& scale);

// out = epilogue(x @ weight^T (+ bias)). x [T, in], weight [out, in], bias [out] or undefined.
void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
            const LinearEpilogue& epilogue = {});

// The LayerNorm before a linear_pair (weight null: none): the products take
// layer_norm(x, weight, bias, eps) for x. Its output is written to out (x's shape, apart from x
// and the pair's outs) unless the backend folds the norm into the products' load of x (CUDA's
// GEMV at 1-2 rows: no launch of its own), which leaves out as it was.
struct PairNorm {
  const Tensor* weight = nullptr;
  const Tensor* bias = nullptr;
  float eps = 0.0f;
  Tensor* out = nullptr;
};

// Two linears of one x (parallel attention's qkv and fc1 + GELU), weights at full width:
// out1 = x @ w1^T + b1 and out2 = x @ w2^T + b2, GELU on out2 where gelu2, x first normalized
// where norm says. On CUDA one launch over both weights' rows where the GEMV or the decode GEMM
// takes the rows; elsewhere two linears.
void linear_pair(const Tensor& x, const Tensor& w1, const Tensor& b1, Tensor& out1,
                 const Tensor& w2, const Tensor& b2, Tensor& out2, bool gelu2,
                 const PairNorm& norm = {});

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

// qkv_rotary, then kv_write of its k and v: q as there, K and V into their cache slots. k and v
// are scratch of their shapes: the CPU goes through them, CUDA writes the caches from the one
// kernel and leaves them untouched.
void qkv_rotary_kv_write(const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                         const Tensor& slots, Tensor& q, Tensor& k, Tensor& v, Tensor& k_cache,
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

// LoRA deltas over segments of rows (the segmented / SGMV form of Punica and LoRAX): for each
// segment s, rows [begin, end) of x and out, out[rows] += scale * (x[rows] @ a^T) @ b^T, with
// a [r, in] and b [out_dim, r] in x's dtype on x's device (r may differ per segment). Segments
// must not overlap; rows in no segment are left as they are. x [T, in], out [T, out_dim] (the
// base linear's output, updated in place). The base GEMM runs once for the whole batch before.
struct LoraSegment {
  int32_t begin = 0, end = 0;
  const Tensor* a = nullptr;
  const Tensor* b = nullptr;
  float scale = 1.0f;
};
void lora_add(const Tensor& x, const std::vector<LoraSegment>& segments, Tensor& out);

// lora_add over a segment table already on the device (CUDA graphs, model/decode_graphs.h): the
// launch depends only on n_entries, max_r and the shapes of x and out, never on the table's
// contents, so a captured launch serves any later table (other adapters, other rows). Each entry
// is one row (end == begin + 1) or unused (end == begin); every r <= max_r <= 128. The layout is
// the CUDA kernels' (40 bytes; checked in cuda_ops.cpp); vec: per-entry vector-load flags.
struct LoraTableEntry {
  int32_t begin = 0, end = 0, r = 0;
  float scale = 0.0f;
  const void* a = nullptr;  // [r, in], bf16 or f16 (f16 != 0)
  const void* b = nullptr;  // [out_dim, r], the same dtype
  int32_t f16 = 0, vec = 0;
};
// The entry of segment s for an x of `in` columns (a and b CUDA tensors, bf16 or f16, r <= 128).
LoraTableEntry lora_table_entry(const LoraSegment& s, int64_t in);
// out [T, out_dim] += the deltas of the n_entries entries at `table` (device memory) for x [T, in].
void lora_add_table(const Tensor& x, const void* table, int n_entries, int max_r, Tensor& out);

// out[i] = x[indices[i]]. x [T, hidden], indices [N] I32, out [N, hidden].
void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out);

// out[i] = argmax of row i of logits [N, vocab] F32 (the first on ties); out [N] I32.
void argmax_rows(const Tensor& logits, Tensor& out);

// Greedy picks with their log-probabilities: ids[i] = argmax of row i of
// logits [N, vocab] F32 (the first on ties), logprobs[i] = its log-softmax
// (clamped at log(1e-38), as the host sampler). ids [N] I32, logprobs [N] F32.
void greedy_rows(const Tensor& logits, Tensor& ids, Tensor& logprobs);

// Structured output: row rows[i] of logits [N, vocab] F32 keeps token j only where bit j % 32 of
// word j / 32 of bitmask row i is set (the others become -inf). bitmask [rows.size(), words]
// int32 on the host, words >= ceil(vocab / 32); it travels to the device in one copy with rows.
void apply_token_bitmask(Tensor& logits, const std::vector<int32_t>& rows,
                         const std::vector<int32_t>& bitmask, int64_t words);

// Device memory as the driver sees it (free, total) and what kestrel's
// allocator holds (reserved from the driver, in use, peak in use since the
// last reset). All zero for the CPU.
struct DeviceMemory {
  int64_t free = 0, total = 0;
  int64_t reserved = 0, in_use = 0, peak_in_use = 0;
};
DeviceMemory device_memory(Device device);
// What the device is, for reports: "cuda: " and the GPU's name and SM count, or "cpu".
std::string device_name(Device device);
// Resets the peak to what is in use now, and returns cached free blocks to
// the driver (both no-ops on the CPU).
void reset_peak_memory(Device device);
void release_cached_memory(Device device);

// While alive, the device work this thread queues (the copies and uploads of an adapter being
// loaded) runs on a stream of its own beside the forward passes instead of queueing between
// them, and it has all ended when the scope does. No GEMMs inside (cuBLASLt's plans belong to
// the forward passes' stream). Nothing on the CPU.
class BackgroundDeviceWork {
 public:
  explicit BackgroundDeviceWork(Device device);
  ~BackgroundDeviceWork();
  BackgroundDeviceWork(const BackgroundDeviceWork&) = delete;
  BackgroundDeviceWork& operator=(const BackgroundDeviceWork&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// CUDA graphs (docs/gpu.md, "CUDA graphs"): capture_graph runs body once eagerly, then
// captures the work body queues on the device's stream; replay() runs that work again on the
// same addresses (update the inputs it reads in place, by copies, before each replay). Device
// memory body allocates comes from a pool shared by every graph of the process, so a graph's
// temporaries and its output (*out) stay valid only until another graph replays. No host
// synchronisation inside body. CUDA only (throws for the CPU).
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  virtual void replay() = 0;
};
std::unique_ptr<DeviceGraph> capture_graph(Device device, const std::function<Tensor()>& body,
                                           Tensor* out);
// Bytes the graph pool holds (0 on the CPU or before any capture).
int64_t graph_pool_bytes(Device device);

// Sampling on the device with engine/sampler.cpp's semantics (that is the CPU
// reference): per row, penalties over `seen` (prompt + generated ids, for
// repetition_penalty) and `generated` (id, count), temperature, softmax, the
// top_k / top_p / typical_p masks over the probabilities sorted most likely
// first (ties by id), and the token where the kept mass walked in id order
// passes u * kept total. u is the request's one uniform draw in [0, 1) for the
// token (the host draws it from the request's generator, so a seed reproduces
// the same tokens on either device); greedy rows take the argmax.
struct SampleSpec {
  bool do_sample = false;
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f, typical_p = 1.0f;
  float repetition_penalty = 1.0f, frequency_penalty = 0.0f, presence_penalty = 0.0f;
  int32_t top_n = 0;  // alternatives wanted
  double u = 0.0;
  std::vector<int32_t> seen;
  std::vector<std::pair<int32_t, int32_t>> generated;
};
struct SampleResult {
  int32_t id = 0;
  float logprob = 0.0f;  // log-softmax of the processed logits (before the masks)
  std::vector<std::pair<int32_t, float>> alternatives;  // top_n most likely (id, logprob)
};
// logits [rows.size(), vocab] F32 on CUDA. masks (tests): when given, the keep
// flags [rows.size() * vocab] of the sampled rows.
std::vector<SampleResult> sample_on_device(const Tensor& logits,
                                           const std::vector<SampleSpec>& rows,
                                           std::vector<uint8_t>* masks = nullptr);
// Device scratch sample_on_device takes for n_rows rows (typical_p included;
// 0 on the CPU), for sizing the KV cache.
size_t sampling_workspace_bytes(Device device, int64_t n_rows, int64_t vocab);

}  // namespace kestrel::ops
