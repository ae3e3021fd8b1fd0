// The Tensor-level CUDA ops: ops.cpp has checked shapes; here the dtypes the
// kernels need are checked and the raw pointers handed to kernels.h.
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tuning.h"

namespace kestrel::cuda {
namespace {

void need(const char* op, const char* what, const Tensor& t, DType dtype) {
  KESTREL_CHECK(t.defined() && t.device() == Device::kCuda, op, " (cuda): ", what,
                " must be a CUDA tensor");
  KESTREL_CHECK(t.dtype() == dtype, op, " (cuda): ", what, " has dtype ", dtype_name(t.dtype()),
                ", expected ", dtype_name(dtype));
}

// A KV cache pair: BF16, or E4M3 codes (--kv-cache-dtype fp8), both the same.
void need_kv_cache(const char* op, const Tensor& k_cache, const Tensor& v_cache) {
  const DType d = k_cache.dtype() == DType::kF8E4M3 ? DType::kF8E4M3 : DType::kBF16;
  need(op, "k_cache", k_cache, d);
  need(op, "v_cache", v_cache, d);
}

const uint16_t* bf(const Tensor& t) {
  return t.data<uint16_t>();
}
uint16_t* bf_mut(Tensor& t) {
  return t.data<uint16_t>();
}

int sm_count() {
  static int n = [] {
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
  }();
  return n;
}

}  // namespace

void embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  need("embedding", "ids", ids, DType::kI32);
  need("embedding", "table", table, DType::kBF16);
  need("embedding", "out", out, DType::kBF16);
  kernels::embedding(ids.data<int32_t>(), bf(table), ids.dim(0), table.dim(0), table.dim(1),
                     bf_mut(out), stream());
  CUDA_CHECK_LAUNCH();
}

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) {
  need("layer_norm", "x", x, DType::kBF16);
  need("layer_norm", "weight", weight, DType::kBF16);
  need("layer_norm", "bias", bias, DType::kBF16);
  need("layer_norm", "out", out, DType::kBF16);
  kernels::layer_norm(bf(x), bf(weight), bf(bias), x.dim(0), x.dim(1), eps, bf_mut(out), stream());
  CUDA_CHECK_LAUNCH();
}

void gelu(Tensor& x) {
  need("gelu", "x", x, DType::kBF16);
  kernels::gelu(bf_mut(x), x.numel(), stream());
  CUDA_CHECK_LAUNCH();
}

void add(const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out) {
  need("add", "a", a, DType::kBF16);
  need("add", "b", b, DType::kBF16);
  if (c.defined()) need("add", "c", c, DType::kBF16);
  need("add", "out", out, DType::kBF16);
  kernels::add(bf(a), bf(b), c.defined() ? bf(c) : nullptr, bf_mut(out), a.numel(), stream());
  CUDA_CHECK_LAUNCH();
}

namespace {

// The segment table's way to the device: a ring of pinned host slots (each written by the
// host, then copied with cudaMemcpyAsync on kestrel's stream into the one device table that
// the kernels read; stream order keeps the next copy behind the previous kernels). An event
// per slot says when its copy has run, so a slot is rewritten only after that.
constexpr int kLoraSlotSegments = 256;
constexpr int kLoraSlots = 64;

struct LoraTables {
  kernels::LoraSegDesc* host = nullptr;    // [kLoraSlots][kLoraSlotSegments], pinned
  kernels::LoraSegDesc* device = nullptr;  // [kLoraSlotSegments]
  cudaEvent_t done[kLoraSlots] = {};
  bool recorded[kLoraSlots] = {};
  int next = 0;
};

LoraTables& lora_tables() {
  static LoraTables* t = [] {
    ensure_device();
    auto* st = new LoraTables;
    CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&st->host),
                              sizeof(kernels::LoraSegDesc) * kLoraSlots * kLoraSlotSegments));
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&st->device),
                          sizeof(kernels::LoraSegDesc) * kLoraSlotSegments));
    for (cudaEvent_t& e : st->done)
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return st;
  }();
  return *t;
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace

void lora_add(const Tensor& x, const std::vector<ops::LoraSegment>& segments, Tensor& out) {
  need("lora_add", "x", x, DType::kBF16);
  need("lora_add", "out", out, DType::kBF16);
  const int64_t in = x.dim(1), out_dim = out.dim(1);
  std::vector<kernels::LoraSegDesc> descs;
  descs.reserve(segments.size());
  int max_r = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const ops::LoraSegment& g = segments[i];
    KESTREL_CHECK(g.a->device() == Device::kCuda && g.b->device() == Device::kCuda &&
                      (g.a->dtype() == DType::kBF16 || g.a->dtype() == DType::kF16) &&
                      g.b->dtype() == g.a->dtype(),
                  "lora_add (cuda): segment ", i, " has a ", dtype_name(g.a->dtype()), " and b ",
                  dtype_name(g.b->dtype()), "; both BF16 or both F16 on the GPU expected");
    const int64_t r = g.a->dim(0);
    KESTREL_CHECK(r <= kernels::kMaxLoraRank, "lora_add (cuda): segment ", i, " has rank ", r,
                  ", the CUDA kernels take at most ", kernels::kMaxLoraRank);
    if (g.end == g.begin || r == 0) continue;
    kernels::LoraSegDesc d;
    d.begin = g.begin;
    d.end = g.end;
    d.r = static_cast<int32_t>(r);
    d.scale = g.scale;
    d.a = bf(*g.a);
    d.b = bf(*g.b);
    d.f16 = g.a->dtype() == DType::kF16 ? 1 : 0;
    d.vec = (in % 8 == 0 && aligned16(d.a) ? kernels::kLoraVecA : 0) |
            (d.r % 8 == 0 && aligned16(d.b) ? kernels::kLoraVecB : 0);
    descs.push_back(d);
    max_r = std::max(max_r, d.r);
  }
  if (descs.empty()) return;
  LoraTables& tab = lora_tables();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream(), &capture));
  for (size_t c0 = 0; c0 < descs.size(); c0 += kLoraSlotSegments) {
    const size_t n = std::min<size_t>(kLoraSlotSegments, descs.size() - c0);
    const int slot = tab.next;
    tab.next = (tab.next + 1) % kLoraSlots;
    if (tab.recorded[slot]) CUDA_CHECK(cudaEventSynchronize(tab.done[slot]));
    kernels::LoraSegDesc* h = tab.host + static_cast<size_t>(slot) * kLoraSlotSegments;
    int max_rows = 0;
    bool vec_in = in % 8 == 0 && aligned16(x.raw()), vec_b = true;
    for (size_t i = 0; i < n; ++i) {
      h[i] = descs[c0 + i];
      max_rows = std::max(max_rows, h[i].end - h[i].begin);
      vec_in = vec_in && aligned16(h[i].a);
      vec_b = vec_b && h[i].r % 8 == 0 && aligned16(h[i].b);
    }
    CUDA_CHECK(cudaMemcpyAsync(tab.device, h, n * sizeof(kernels::LoraSegDesc),
                               cudaMemcpyHostToDevice, stream()));
    if (capture == cudaStreamCaptureStatusNone) {
      CUDA_CHECK(cudaEventRecord(tab.done[slot], stream()));
      tab.recorded[slot] = true;
    }
    const int splits =
        kernels::lora_shrink_splits(in, static_cast<int>(n), max_rows, max_r, vec_in);
    Tensor v = Tensor::empty(DType::kF32, {splits, x.dim(0), max_r}, Device::kCuda);
    kernels::lora_add(tab.device, static_cast<int>(n), max_rows, max_r, vec_in, vec_b, bf(x),
                      x.dim(0), in, v.data<float>(), splits, out_dim, bf_mut(out), stream());
    CUDA_CHECK_LAUNCH();
  }
}

static_assert(sizeof(ops::LoraTableEntry) == sizeof(kernels::LoraSegDesc) &&
                  offsetof(ops::LoraTableEntry, a) == offsetof(kernels::LoraSegDesc, a) &&
                  offsetof(ops::LoraTableEntry, b) == offsetof(kernels::LoraSegDesc, b) &&
                  offsetof(ops::LoraTableEntry, scale) == offsetof(kernels::LoraSegDesc, scale) &&
                  offsetof(ops::LoraTableEntry, vec) == offsetof(kernels::LoraSegDesc, vec),
              "ops::LoraTableEntry must have kernels::LoraSegDesc's layout");

ops::LoraTableEntry lora_table_entry(const ops::LoraSegment& g, int64_t in) {
  const Tensor &a = *g.a, &b = *g.b;
  KESTREL_CHECK(a.device() == Device::kCuda && b.device() == Device::kCuda &&
                    (a.dtype() == DType::kBF16 || a.dtype() == DType::kF16) &&
                    b.dtype() == a.dtype() && a.ndim() == 2 && b.ndim() == 2 && a.dim(1) == in &&
                    b.dim(1) == a.dim(0),
                "lora_table_entry (cuda): a ", shape_str(a.shape()), " ", dtype_name(a.dtype()),
                ", b ", shape_str(b.shape()), " ", dtype_name(b.dtype()), " for x of ", in,
                " columns; CUDA bf16 or f16 pairs expected");
  KESTREL_CHECK(a.dim(0) <= kernels::kMaxLoraRank, "lora_table_entry (cuda): rank ", a.dim(0),
                ", the CUDA kernels take at most ", kernels::kMaxLoraRank);
  ops::LoraTableEntry e;
  e.begin = g.begin;
  e.end = g.end;
  e.r = static_cast<int32_t>(a.dim(0));
  e.scale = g.scale;
  e.a = a.raw();
  e.b = b.raw();
  e.f16 = a.dtype() == DType::kF16 ? 1 : 0;
  e.vec = (in % 8 == 0 && aligned16(e.a) ? kernels::kLoraVecA : 0) |
          (e.r % 8 == 0 && aligned16(e.b) ? kernels::kLoraVecB : 0);
  return e;
}

void lora_add_table(const Tensor& x, const void* table, int n_entries, int max_r, Tensor& out) {
  need("lora_add_table", "x", x, DType::kBF16);
  need("lora_add_table", "out", out, DType::kBF16);
  const int64_t in = x.dim(1), rows = x.dim(0);
  const bool x_vec = in % 8 == 0 && aligned16(x.raw());
  const int splits = kernels::lora_shrink_splits(in, n_entries, 1, max_r, x_vec);
  // Under capture v comes from the graph pool: one address for every replay.
  Tensor v = Tensor::empty(DType::kF32, {splits, rows, max_r}, Device::kCuda);
  kernels::lora_add_graph(static_cast<const kernels::LoraSegDesc*>(table), n_entries, max_r, x_vec,
                          bf(x), rows, in, v.data<float>(), splits, out.dim(1), bf_mut(out),
                          stream());
  CUDA_CHECK_LAUNCH();
}

void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) {
  need("gather_rows", "indices", indices, DType::kI32);
  need("gather_rows", "x", x, x.dtype());
  const int64_t row_bytes = x.dim(1) * static_cast<int64_t>(dtype_size(x.dtype()));
  kernels::gather_rows(x.raw(), indices.data<int32_t>(), indices.dim(0), x.dim(0), row_bytes,
                       out.raw(), stream());
  CUDA_CHECK_LAUNCH();
}

void argmax_rows(const Tensor& logits, Tensor& out) {
  need("argmax_rows", "logits", logits, DType::kF32);
  need("argmax_rows", "out", out, DType::kI32);
  kernels::argmax_rows(logits.data<float>(), logits.dim(0), logits.dim(1), out.data<int32_t>(),
                       stream());
  CUDA_CHECK_LAUNCH();
}

void apply_token_bitmask(Tensor& logits, const std::vector<int32_t>& rows,
                         const std::vector<int32_t>& bitmask, int64_t words) {
  need("apply_token_bitmask", "logits", logits, DType::kF32);
  // Rows and masks in one upload.
  std::vector<int32_t> packed(rows);
  packed.insert(packed.end(), bitmask.begin(), bitmask.end());
  Tensor h = Tensor::borrow(packed.data(), DType::kI32, {static_cast<int64_t>(packed.size())});
  Tensor d = Tensor::empty(DType::kI32, h.shape(), Device::kCuda);
  copy(h, d);
  kernels::apply_token_bitmask(logits.data<float>(), logits.dim(1), d.data<int32_t>(),
                               static_cast<int64_t>(rows.size()), words, stream());
  CUDA_CHECK_LAUNCH();
}

void greedy_rows(const Tensor& logits, Tensor& ids, Tensor& logprobs) {
  need("greedy_rows", "logits", logits, DType::kF32);
  need("greedy_rows", "ids", ids, DType::kI32);
  need("greedy_rows", "logprobs", logprobs, DType::kF32);
  kernels::greedy_rows(logits.data<float>(), logits.dim(0), logits.dim(1), ids.data<int32_t>(),
                       logprobs.data<float>(), stream());
  CUDA_CHECK_LAUNCH();
}

void qkv_rotary(const Tensor& qkv, const Tensor& cos, const Tensor& sin, Tensor& q, Tensor& k,
                Tensor& v) {
  need("qkv_rotary", "qkv", qkv, DType::kBF16);
  const bool rotary = cos.defined();  // undefined: split only (ALiBi models)
  if (rotary) need("qkv_rotary", "cos", cos, DType::kF32);
  if (rotary) need("qkv_rotary", "sin", sin, DType::kF32);
  need("qkv_rotary", "q", q, DType::kBF16);
  need("qkv_rotary", "k", k, DType::kBF16);
  need("qkv_rotary", "v", v, DType::kBF16);
  kernels::qkv_rotary(bf(qkv), rotary ? cos.data<float>() : nullptr,
                      rotary ? sin.data<float>() : nullptr, q.dim(0), q.dim(1), k.dim(1), q.dim(2),
                      bf_mut(q), bf_mut(k), bf_mut(v), stream());
  CUDA_CHECK_LAUNCH();
}

void qkv_rotary_kv_write(const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                         const Tensor& slots, Tensor& q, Tensor& k_cache, Tensor& v_cache) {
  need("qkv_rotary_kv_write", "qkv", qkv, DType::kBF16);
  const bool rotary = cos.defined();
  if (rotary) need("qkv_rotary_kv_write", "cos", cos, DType::kF32);
  if (rotary) need("qkv_rotary_kv_write", "sin", sin, DType::kF32);
  need("qkv_rotary_kv_write", "q", q, DType::kBF16);
  need("qkv_rotary_kv_write", "slots", slots, DType::kI64);
  need_kv_cache("qkv_rotary_kv_write", k_cache, v_cache);
  const kernels::KvSlots cache{slots.data<int64_t>(), k_cache.dim(0) * k_cache.dim(1),
                               k_cache.raw(), v_cache.raw(), k_cache.dtype() == DType::kF8E4M3};
  kernels::qkv_rotary(bf(qkv), rotary ? cos.data<float>() : nullptr,
                      rotary ? sin.data<float>() : nullptr, q.dim(0), q.dim(1), k_cache.dim(2),
                      q.dim(2), bf_mut(q), nullptr, nullptr, stream(), cache);
  CUDA_CHECK_LAUNCH();
}

void kv_write(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
              Tensor& v_cache) {
  need("kv_write", "k", k, DType::kBF16);
  need("kv_write", "v", v, DType::kBF16);
  need("kv_write", "slots", slots, DType::kI64);
  need_kv_cache("kv_write", k_cache, v_cache);
  kernels::kv_write(bf(k), bf(v), slots.data<int64_t>(), k.dim(0), k.dim(1) * k.dim(2),
                    k_cache.dim(0) * k_cache.dim(1), k_cache.raw(), v_cache.raw(),
                    k_cache.dtype() == DType::kF8E4M3, stream());
  CUDA_CHECK_LAUNCH();
}

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& block_tables, const Tensor& cu_q, const Tensor& kv_lens,
                     int32_t max_kv_len, float scale, Tensor& out, int32_t max_q_len,
                     const Tensor& alibi_slopes) {
  need("paged_attention", "q", q, DType::kBF16);
  if (alibi_slopes.defined()) need("paged_attention", "alibi_slopes", alibi_slopes, DType::kF32);
  need_kv_cache("paged_attention", k_cache, v_cache);
  need("paged_attention", "block_tables", block_tables, DType::kI32);
  need("paged_attention", "cu_q", cu_q, DType::kI32);
  need("paged_attention", "kv_lens", kv_lens, DType::kI32);
  need("paged_attention", "out", out, DType::kBF16);
  kernels::AttentionParams p;
  p.q = bf(q);
  p.k_cache = k_cache.raw();
  p.v_cache = v_cache.raw();
  p.kv_fp8 = k_cache.dtype() == DType::kF8E4M3;
  p.block_tables = block_tables.data<int32_t>();
  p.cu_q = cu_q.data<int32_t>();
  p.kv_lens = kv_lens.data<int32_t>();
  p.out = bf_mut(out);
  p.n_tokens = q.dim(0);
  p.n_seqs = kv_lens.dim(0);
  p.n_heads = q.dim(1);
  p.head_dim = q.dim(2);
  p.num_blocks = k_cache.dim(0);
  p.block_size = k_cache.dim(1);
  p.n_kv_heads = k_cache.dim(2);
  p.max_blocks = block_tables.dim(1);
  p.max_kv_len = max_kv_len;
  p.max_q_len = max_q_len > 0 ? max_q_len : static_cast<int32_t>(q.dim(0));
  p.scale = scale;
  p.alibi_slopes = alibi_slopes.defined() ? alibi_slopes.data<float>() : nullptr;
  if (p.n_tokens == 0 || p.n_seqs == 0) return;
  const int which = tuning().attention_kernel;
  if (which != 1 && kernels::attention_mma_supported(p)) {
    const int sms = sm_count();
    const size_t ws_bytes = kernels::attention_workspace_bytes(p, sms);
    Tensor ws;
    if (ws_bytes > 0)
      ws = Tensor::empty(DType::kU8, {static_cast<int64_t>(ws_bytes)}, Device::kCuda);
    const bool fused = tuning().attention_fused_combine;
    kernels::attention_mma(p, ws_bytes > 0 ? ws.raw() : nullptr,
                           fused ? stream_counters(CounterSlot::kAttention) : nullptr,
                           fused ? kCountersPerSlot : 0, sms, stream());
  } else {
    KESTREL_CHECK(which != 2,
                  "paged_attention (cuda): the tensor-core kernel needs head_dim 64 "
                  "or 128, got ",
                  p.head_dim);
    KESTREL_CHECK(p.head_dim <= 256, "paged_attention (cuda): head_dim ", p.head_dim, " above 256");
    kernels::attention_generic(p, stream());
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace kestrel::cuda
