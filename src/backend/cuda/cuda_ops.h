// The CUDA implementations of backend/ops.h (bf16 activations and weights, fp32
// accumulation), plus the device plumbing ops.cpp needs: copies, weight upload,
// the caching allocator. A plain C++ header: nothing here includes CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/ops.h"
#include "core/tensor.h"

namespace kestrel::cuda {

// Number of visible CUDA devices (0 when there is no driver or no GPU; never throws).
int device_count();
// Waits for all work queued on kestrel's stream (this thread's side stream inside a
// SideStream scope).
void synchronize();

// While alive, the work this thread queues (copies, uploads, kernels) runs on a stream of its
// own instead of kestrel's: each allocation orders it after the work queued on kestrel's
// stream so far (a reused block may still be read there), each free waits for it, and the
// destructor waits for all of it (ops::BackgroundDeviceWork).
class SideStream {
 public:
  SideStream();
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
};

// Copies between any two of host and device; shapes must hold the same bytes.
// Converts BF16 on the device to F32 on the host (or F32 device to BF16 device)
// when the dtypes differ that way; otherwise dtypes must match.
void copy(const Tensor& src, Tensor& dst);
// cudaMemcpy2DAsync on kestrel's stream between device buffers (pitches and width in bytes).
void copy_2d(const void* src, size_t src_pitch, void* dst, size_t dst_pitch, size_t width,
             int64_t rows);
// Host weights (F32/F16/BF16) into a new device tensor of `dtype` (BF16 or F32),
// converted on the GPU after a copy through a pinned staging buffer.
Tensor upload_weight(const void* data, DType src_dtype, const Shape& shape, DType dtype);

// Uniform [-amp, amp] (amp 0: `constant`) by the hash of ops::random_uniform.
Tensor random_uniform(const Shape& shape, DType dtype, uint64_t seed, float amp, float constant);

// Caching allocator statistics (bytes held from cudaMalloc, bytes handed out).
struct MemoryStats {
  size_t reserved = 0;
  size_t in_use = 0;
  size_t peak_in_use = 0;
};
MemoryStats memory_stats();
// Sets the peak to what is in use now.
void reset_peak_memory();
// Returns cached free blocks to the driver.
void empty_cache();
// cudaMemGetInfo: bytes free and total on the device.
struct DeviceMemoryInfo {
  size_t free = 0;
  size_t total = 0;
};
DeviceMemoryInfo device_memory_info();
// The GPU kestrel runs on, as "cuda: NVIDIA H100 80GB HBM3, 132 SMs" (figures say which card).
std::string device_name();

// Whether this device runs the wgmma decode GEMM (compute capability 9.0), and how many linears
// it has run in this process (tests: a fallback to cuBLASLt runs none).
bool decode_gemm_available();
int64_t decode_gemm_launches();
// The decode GEMM variant that KESTREL_DECODE_GEMM=-1 gives a linear of `rows` x [n, k] weights
// (0: cuBLASLt): where it measured faster on the H100, 3..32 rows of weights of 192 MiB and more.
int decode_gemm_choice(int64_t rows, int64_t n, int64_t k);

// ops::capture_graph on CUDA: body runs once eagerly, then once under stream capture; the
// device memory both runs take comes from the graph pool (graph_pool_bytes: what it holds).
std::unique_ptr<ops::DeviceGraph> capture_graph(const std::function<Tensor()>& body, Tensor* out);
size_t graph_pool_bytes();

void embedding(const Tensor& ids, const Tensor& table, Tensor& out);
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out);
void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
            const ops::LinearEpilogue& epilogue);
// ops::linear_pair in one launch where the GEMV or the decode GEMM takes the rows (BF16
// operands and outs), with the norm folded into the GEMV's load of x where norm is given (then
// only there); false where it does not (the caller runs the norm, then two linears).
bool linear_pair(const Tensor& x, const Tensor& w1, const Tensor& b1, Tensor& out1,
                 const Tensor& w2, const Tensor& b2, Tensor& out2, bool gelu2,
                 const ops::PairNorm* norm = nullptr);
void quantize_fp8(const Tensor& weight, Tensor& q, Tensor& scale);
void gelu(Tensor& x);
void add(const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out);
void qkv_rotary(const Tensor& qkv, const Tensor& cos, const Tensor& sin, Tensor& q, Tensor& k,
                Tensor& v);
void kv_write(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
              Tensor& v_cache);
void qkv_rotary_kv_write(const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                         const Tensor& slots, Tensor& q, Tensor& k_cache, Tensor& v_cache);
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& block_tables, const Tensor& cu_q, const Tensor& kv_lens,
                     int32_t max_kv_len, float scale, Tensor& out, int32_t max_q_len,
                     const Tensor& alibi_slopes);
void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out);
void lora_add(const Tensor& x, const std::vector<ops::LoraSegment>& segments, Tensor& out);
ops::LoraTableEntry lora_table_entry(const ops::LoraSegment& s, int64_t in);
void lora_add_table(const Tensor& x, const void* table, int n_entries, int max_r, Tensor& out);
void argmax_rows(const Tensor& logits, Tensor& out);
void greedy_rows(const Tensor& logits, Tensor& ids, Tensor& logprobs);
void apply_token_bitmask(Tensor& logits, const std::vector<int32_t>& rows,
                         const std::vector<int32_t>& bitmask, int64_t words);
// ops::sample_on_device (sampling.cpp).
std::vector<ops::SampleResult> sample_on_device(const Tensor& logits,
                                                const std::vector<ops::SampleSpec>& rows,
                                                std::vector<uint8_t>* masks);
size_t sampling_workspace_bytes(int64_t n_rows, int64_t vocab);

}  // namespace kestrel::cuda
