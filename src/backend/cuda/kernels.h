// Launchers of the CUDA backend's kernels: raw pointers, sizes and a stream,
// no framework types (FlashInfer's habit). bf16 buffers are passed as
// uint16_t* (bit patterns), so that this header stays plain C++.
// Each returns after queueing; errors of the launch are checked by the caller.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace kestrel::cuda::kernels {

// --- conversions -----------------------------------------------------------
// dst[i] = bf16(src[i]); src_kind 0: f32, 1: f16, 2: bf16.
void to_bf16(const void* src, int src_kind, uint16_t* dst, int64_t n, cudaStream_t s);
void bf16_to_f32(const uint16_t* src, float* dst, int64_t n, cudaStream_t s);
void f16_to_f32(const uint16_t* src, float* dst, int64_t n, cudaStream_t s);

// dst[0, n) = src[0, n), 16 bytes a thread at a time (both 16-byte aligned, n % 16 == 0).
void copy_bytes(const void* src, void* dst, int64_t n, cudaStream_t s);
// dst [n] (bf16 when bf16_out, else f32) = amp * (2 u - 1) with u = hash(seed, i), or constant.
void random_uniform(void* dst, bool bf16_out, int64_t n, uint64_t seed, float amp, float constant,
                    cudaStream_t s);

// --- elementwise and row ops -----------------------------------------------
// out [T, hidden] = table [vocab, hidden] rows ids [T]; an id outside [0, vocab) gives zeros.
void embedding(const int32_t* ids, const uint16_t* table, int64_t n_tokens, int64_t vocab,
               int64_t hidden, uint16_t* out, cudaStream_t s);
// out [T, hidden] = LayerNorm(x [T, hidden]) * w + b, fp32 statistics.
void layer_norm(const uint16_t* x, const uint16_t* w, const uint16_t* b, int64_t n_tokens,
                int64_t hidden, float eps, uint16_t* out, cudaStream_t s);
void gelu(uint16_t* x, int64_t n, cudaStream_t s);
// out [rows, cols] (f32 when f32_out, else bf16) += bias [cols] (bf16).
void add_bias(void* out, bool f32_out, const uint16_t* bias, int64_t rows, int64_t cols,
              cudaStream_t s);
// out = a + b (+ c when not null), summed in fp32, rounded once.
void add(const uint16_t* a, const uint16_t* b, const uint16_t* c, uint16_t* out, int64_t n,
         cudaStream_t s);
// out [n, row_bytes] = x rows idx [n]; an index outside [0, n_rows) gives zeros.
void gather_rows(const void* x, const int32_t* idx, int64_t n, int64_t n_rows, int64_t row_bytes,
                 void* out, cudaStream_t s);
// out [n] = argmax of each row of logits [n, vocab] F32 (first on ties).
void argmax_rows(const float* logits, int64_t n, int64_t vocab, int32_t* out, cudaStream_t s);
// packed = [rows (n) | bitmask (n x words)] I32: logits[rows[i], j] = -inf where bit j of
// bitmask row i is clear.
void apply_token_bitmask(float* logits, int64_t vocab, const int32_t* packed, int64_t n,
                         int64_t words, cudaStream_t s);
// ids [n] = argmax of each row of logits [n, vocab] F32, logprobs [n] its log-softmax.
void greedy_rows(const float* logits, int64_t n, int64_t vocab, int32_t* ids, float* logprobs,
                 cudaStream_t s);

// qkv [T, n_kv_heads * (group + 2) * d] -> q [T, n_heads, d] and k [T, n_kv_heads, d]
// rotated (NeoX), v [T, n_kv_heads, d]; cos, sin [T, d / 2] F32, or both null: no rotation.
// With cache (k_cache non-null): k and v go to rows slots[t] of the caches [n_slots,
// n_kv_heads * d] instead (kv_write's job in the same pass; a slot outside [0, n_slots) is
// skipped), and k, v are not written.
struct KvSlots {
  const int64_t* slots = nullptr;
  int64_t n_slots = 0;
  void* k_cache = nullptr;  // BF16, or with fp8 E4M3 codes under a scale of 1
  void* v_cache = nullptr;
  bool fp8 = false;
};
void qkv_rotary(const uint16_t* qkv, const float* cos, const float* sin, int64_t n_tokens,
                int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, uint16_t* q, uint16_t* k,
                uint16_t* v, cudaStream_t s, KvSlots cache = {});
// Caches [n_slots, row] (BF16, or with fp8 E4M3 under a scale of 1); k, v [T, row] BF16;
// slots [T]. A slot outside [0, n_slots) is skipped.
void kv_write(const uint16_t* k, const uint16_t* v, const int64_t* slots, int64_t n_tokens,
              int64_t row, int64_t n_slots, void* k_cache, void* v_cache, bool fp8, cudaStream_t s);

// --- linear for a few rows (gemv.cu) ------------------------------------------
// out [rows, n] = epilogue(x [rows, k] @ w [n, k]^T + bias [n] (null: none)), bf16 in, fp32
// sums; out bf16 or f32 (f32_out). Epilogue: gelu (exact erf), + addend [rows, n] (bf16 out
// only; null: none), then accumulate (out += y).
// Needs gemv_supported: 1..kGemvMaxRows rows, k % 8 == 0, x and w 16-byte aligned.
// variant: 1 one row a warp, 8 chunks in flight per lane; 2 two rows, 4 (2 for rows > 4); 3
// four rows, 2; 4 (what linear uses) a block of 4 warps per 2 rows (1 for rows > 4), k split
// between the warps.
// A second product in the same launch (gemv, decode_gemm). Summed with the first before the
// epilogue (k > 0): x [rows, k] @ w [n, k]^T + bias [n] (null: none). Or beside it
// (out set; x, k unused): the launch's n rows are the first weight's n1 rows, then w's n - n1
// rows (same x and k as the first), written to out [rows, n - n1] BF16 with bias [n - n1] and
// GELU where gelu, the first product's to its out [rows, n1] (no accumulate or addend then).
struct SecondTerm {
  const uint16_t* x = nullptr;
  const uint16_t* w = nullptr;
  const uint16_t* bias = nullptr;
  int64_t k = 0;
  void* out = nullptr;
  int64_t n1 = 0;
  bool gelu = false;
};
// The LayerNorm of x, folded into a pair's load of it (SecondTerm::out set): the launch
// multiplies layer_norm(x) (mean, variance of x - mean, (x - mean) * rsqrt(var + eps) * w + b,
// rounded to bf16, as layer_norm computes it) instead of x. w null: none.
struct NormTerm {
  const uint16_t* w = nullptr;
  const uint16_t* b = nullptr;
  float eps = 0.0f;
};
constexpr int kGemvMaxRows = 8;
bool gemv_supported(int64_t rows, int64_t k, const void* x, const void* w);
// Whether the split kernels (variants 4..6) take a NormTerm for rows of k: up to
// kGemvNormMaxRows rows (those the GEMV takes by default), held normalized in the block's shared
// memory (rows x k x 2 bytes, at most kGemvNormMaxBytes: with the kernel's static shared memory
// it stays under the 48 KiB a launch gets without opting in); x and both weights as
// gemv_supported asks, the norm's w and b 16-byte aligned.
constexpr int kGemvNormMaxRows = 2;
constexpr int64_t kGemvNormMaxBytes = 47 * 1024;
bool gemv_norm_supported(int variant, int64_t rows, int64_t k, const NormTerm& norm);
// The variants that take a second product (4..6: the split kernels; each product's k and
// pointers as gemv_supported asks).
bool gemv_two_supported(int variant);
void gemv(const uint16_t* x, const uint16_t* w, const uint16_t* bias, int64_t rows, int64_t n,
          int64_t k, bool gelu, bool accumulate, const uint16_t* addend, void* out, bool f32_out,
          int variant, cudaStream_t s, const SecondTerm& plus = {}, const NormTerm& norm = {});
// --- linear for decode batches on Hopper's tensor cores (decode_gemm.cu) --------
// As gemv (same arguments and epilogue) for 1..kDecodeGemmMaxRows rows: tiles of 128 rows of w
// by all rows of x, streamed by TMA into shared memory and multiplied by wgmma, the steps of all
// tiles shared equally by a persistent grid (stream-K). Needs decode_gemm_supported and a
// workspace with sm90 set; returns false when it did not launch (another card, more tiles than
// flags, or the driver refused a tensor map): the caller takes another path. variant: 1 plain
// loads, 2 w's loads marked evict-first in L2, 3 that with a stage's wgmma left running while the
// next stage's is issued, 4 that with 256 k a stage up to 32 rows (128 above).
constexpr int kDecodeGemmMaxRows = 128;
// A partial tile a block (partial_floats floats) and a flag a tile (n_flags ints, zero before
// the first use; each launch leaves them zero). One workspace a stream: launches on it must not
// overlap.
struct DecodeGemmWorkspace {
  float* partial = nullptr;
  int64_t partial_floats = 0;
  int* flags = nullptr;
  int64_t n_flags = 0;
  int sms = 1;
  bool sm90 = false;  // the device is compute capability 9.0 (the kernel is sm_90a code)
};
// The partial floats a workspace for a card of `sms` multiprocessors holds.
int64_t decode_gemm_workspace_floats(int sms);
bool decode_gemm_supported(int64_t rows, int64_t n, int64_t k, const void* x, const void* w);
bool decode_gemm(const uint16_t* x, const uint16_t* w, const uint16_t* bias, int64_t rows,
                 int64_t n, int64_t k, bool gelu, bool accumulate, const uint16_t* addend,
                 void* out, bool f32_out, int variant, const DecodeGemmWorkspace& ws,
                 cudaStream_t s, const SecondTerm& plus = {});

// The scales of a product of FP8 codes: row [rows] (per token), col [cols] per_col, else [1].
// row null: y is not scaled.
struct Fp8Scales {
  const float* row = nullptr;
  const float* col = nullptr;
  bool per_col = false;
};
// out [rows, cols] = epilogue(y [rows, cols] F32 (times its scales) + bias [cols] (null: none)),
// as gemv's, with the addend [rows, cols] (BF16 out) if given.
void linear_epilogue(const float* y, const uint16_t* bias, int64_t rows, int64_t cols, bool gelu,
                     bool accumulate, void* out, bool f32_out, cudaStream_t s,
                     const Fp8Scales& scales = {}, const uint16_t* addend = nullptr);

// --- FP8 E4M3 weights (fp8.cu) ------------------------------------------------
// w [rows, cols] BF16 -> q [rows, cols] E4M3 and scale [rows] F32: per row amax / 448 (1 for
// zeros), round to nearest even, saturating (the CPU's ops::quantize_fp8, code for code); with
// given_scale, scale is read, not computed.
// w is F32 with f32_in, else BF16.
void quantize_fp8_rows(const void* w, bool f32_in, int64_t rows, int64_t cols, uint8_t* q,
                       float* scale, bool given_scale, cudaStream_t s);
// out [rows, cols] BF16 = q * scale (scale [rows] per_row, else [1]).
void dequantize_fp8_rows(const uint8_t* q, const float* scale, bool per_row, int64_t rows,
                         int64_t cols, uint16_t* out, cudaStream_t s);
// gemv with FP8 weights w [n, k] and their scales (per_row: [n], else [1]): weight-only, x BF16;
// y = (x @ dequant(w)^T) then bias and the epilogue as gemv's. Needs gemv_fp8_supported:
// 1..kFp8GemvMaxRows rows, k % 16 == 0, x and w 16-byte aligned. (From 4 rows on cuBLASLt's FP8
// GEMM measured faster on the H100: falcon-7b decode at batch 4, 931 against 855 tok/s.)
constexpr int kFp8GemvMaxRows = 2;
bool gemv_fp8_supported(int64_t rows, int64_t k, const void* x, const void* w);
void gemv_fp8(const uint16_t* x, const uint8_t* w, const float* scale, bool per_row,
              const uint16_t* bias, int64_t rows, int64_t n, int64_t k, bool gelu, bool accumulate,
              const uint16_t* addend, void* out, bool f32_out, cudaStream_t s);

// --- sampling (sampling.cu) --------------------------------------------------
// One row's sampling parameters, as engine/sampler.cpp applies them; u is the
// request's one uniform draw in [0, 1) for this token (unused when greedy).
struct SampleRowParams {
  int32_t do_sample = 0;
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float typical_p = 1.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int32_t top_n = 0;  // alternatives wanted (<= max_top_n)
  double u = 0.0;
};
struct SampleRowsArgs {
  const float* logits = nullptr;            // [n_rows, vocab]
  const SampleRowParams* params = nullptr;  // [n_rows], device
  const int32_t* seen_off = nullptr;        // [n_rows + 1] CSR into seen_ids (prompt + generated)
  const int32_t* seen_ids = nullptr;
  const int32_t* gen_off = nullptr;  // [n_rows + 1] CSR into gen_ids / gen_counts
  const int32_t* gen_ids = nullptr;
  const int32_t* gen_counts = nullptr;
  int32_t* out_ids = nullptr;     // [n_rows]
  float* out_logprobs = nullptr;  // [n_rows]
  int32_t* alt_ids = nullptr;     // [n_rows, max_top_n]
  float* alt_logprobs = nullptr;  // [n_rows, max_top_n]
  uint8_t* keep_out = nullptr;    // optional [n_rows, vocab]: the masks (tests)
  int64_t n_rows = 0, vocab = 0;
  int32_t max_top_n = 0;
  bool typical = false;  // some row has typical_p < 1
};
size_t sample_workspace_bytes(int64_t n_rows, int64_t vocab, bool typical);
void sample_rows(const SampleRowsArgs& args, void* workspace, cudaStream_t s);

// --- attention ---------------------------------------------------------------
struct AttentionParams {
  const uint16_t* q;            // [T, n_heads, d]
  const void* k_cache;          // [num_blocks, block_size, n_kv_heads, d], BF16 or kv_fp8
  const void* v_cache;          // [num_blocks, block_size, n_kv_heads, d]
  const int32_t* block_tables;  // [n_seqs, max_blocks]
  const int32_t* cu_q;          // [n_seqs + 1]
  const int32_t* kv_lens;       // [n_seqs]
  uint16_t* out;                // [T, n_heads, d]
  int64_t n_tokens = 0, n_seqs = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t num_blocks = 0, block_size = 0, max_blocks = 0;
  int32_t max_kv_len = 0;
  int32_t max_q_len = 0;  // bound on cu_q[b+1] - cu_q[b] (sizes the grid)
  float scale = 1.0f;
  // [n_heads] ALiBi slopes or null: score = (q.k + bf16(bf16(slope) * bf16(key pos))) * scale.
  const float* alibi_slopes = nullptr;
  bool kv_fp8 = false;  // the caches hold E4M3 codes under a scale of 1
};
// One block per (token, head); any head_dim up to 256. Always correct, slow for long prefill.
void attention_generic(const AttentionParams& p, cudaStream_t s);
// Tensor-core (mma.sync bf16) flash attention over the pages: rows are (token,
// query head of the group) pairs of one sequence and K/V head, so each K/V tile is
// read once for the whole group. head_dim 64 or 128. Splits the context over
// blocks (flash-decoding) when the grid would be small; scratch is then needed:
// workspace of attention_workspace_bytes(p) bytes.
bool attention_mma_supported(const AttentionParams& p);
size_t attention_workspace_bytes(const AttentionParams& p, int n_sms);
void attention_mma(const AttentionParams& p, void* workspace, int n_sms, cudaStream_t s);

// --- LoRA (lora.cu) -----------------------------------------------------------
// One segment of ops::lora_add in the device-side table: rows [begin, end) of x and out,
// a [r, in] and b [out_dim, r] (bf16, or f16 when f16 != 0), scale. vec: kLoraVecA when in % 8
// == 0 and a is 16-byte aligned, kLoraVecB when r % 8 == 0 and b is (read by lora_add_graph;
// lora_add decides for the whole launch). 40 bytes, the layout of ops::LoraTableEntry.
struct LoraSegDesc {
  int32_t begin = 0, end = 0, r = 0;
  float scale = 1.0f;
  const uint16_t* a = nullptr;
  const uint16_t* b = nullptr;
  int32_t f16 = 0;
  int32_t vec = 0;
};
constexpr int32_t kLoraVecA = 1, kLoraVecB = 2;
constexpr int kMaxLoraRank = 128;  // r above it is refused by the host op
constexpr int kLoraTileRows = 8;   // rows per tile of both kernels
// How many parts the shrink splits `in` into for this launch (1 for long segments, up to 64
// when the grid would be small, as in decode); v needs splits x rows x max_r floats.
int lora_shrink_splits(int64_t in, int n_segments, int max_rows, int max_r, bool vec_in);
// out [rows, out_dim] (bf16) += scale * (x [rows, in] a^T) b^T for each of the n_segments
// entries of table (a device pointer); v [splits, rows, max_r] F32 scratch (splits from
// lora_shrink_splits with the same arguments; rows in no segment are not touched).
// max_rows: the longest segment; vec_in: in % 8 == 0 and x, every a 16-byte aligned; vec_b:
// every r % 8 == 0 and every b 16-byte aligned. Two launches; the second is a programmatic
// dependent of the first (KESTREL_LORA_PDL=0: a plain launch).
void lora_add(const LoraSegDesc* table, int n_segments, int max_rows, int max_r, bool vec_in,
              bool vec_b, const uint16_t* x, int64_t rows, int64_t in, float* v, int splits,
              int64_t out_dim, uint16_t* out, cudaStream_t s);

// The launch of a CUDA graph (ops::lora_add_table): the grid follows n_segments, max_r and the
// shapes only; each entry is one row or empty (begin == end), r <= max_r; the vector loads are
// chosen per entry from LoraSegDesc::vec (x_vec: in % 8 == 0 and x 16-byte aligned, else none).
// v [splits, rows, max_r] F32 with splits = lora_shrink_splits(in, n_segments, 1, max_r, x_vec).
void lora_add_graph(const LoraSegDesc* table, int n_segments, int max_r, bool x_vec,
                    const uint16_t* x, int64_t rows, int64_t in, float* v, int splits,
                    int64_t out_dim, uint16_t* out, cudaStream_t s);

}  // namespace kestrel::cuda::kernels
