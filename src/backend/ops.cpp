// Input checks and device dispatch for every op, in one place.
#include "backend/ops.h"

#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#ifdef KESTREL_CUDA
#include "backend/cuda/cuda_ops.h"
#endif

namespace kestrel::ops {
namespace {

// Calls cpu::NAME or cuda::NAME for the device of `dev_tensor`.
#ifdef KESTREL_CUDA
#define KESTREL_DISPATCH(dev_tensor, name, ...)   \
  do {                                            \
    if ((dev_tensor).device() == Device::kCuda) { \
      ::kestrel::cuda::name(__VA_ARGS__);         \
    } else {                                      \
      ::kestrel::cpu::name(__VA_ARGS__);          \
    }                                             \
  } while (0)
#else
#define KESTREL_DISPATCH(dev_tensor, name, ...)                                                \
  do {                                                                                         \
    KESTREL_CHECK((dev_tensor).device() == Device::kCpu, #name,                                \
                  ": this kestrel was built without CUDA (configure with -DKESTREL_CUDA=ON)"); \
    ::kestrel::cpu::name(__VA_ARGS__);                                                         \
  } while (0)
#endif

void same_device(const char* op, const Tensor& a, const Tensor& b) {
  KESTREL_CHECK(a.device() == b.device(), op, ": tensors on different devices");
}

void expect(const char* op, const char* what, const Tensor& t, DType dtype, int ndim) {
  KESTREL_CHECK(t.defined(), op, ": ", what, " is undefined");
  KESTREL_CHECK(t.dtype() == dtype, op, ": ", what, " has dtype ", dtype_name(t.dtype()),
                ", expected ", dtype_name(dtype));
  KESTREL_CHECK(t.ndim() == ndim, op, ": ", what, " has shape ", shape_str(t.shape()),
                ", expected ", ndim, " dims");
}

// Activations are F32 on the CPU and BF16 on CUDA.
DType act_dtype(const Tensor& t) {
  return t.device() == Device::kCpu ? DType::kF32 : DType::kBF16;
}

}  // namespace

bool cuda_available() {
#ifdef KESTREL_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef KESTREL_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

void synchronize(Device device) {
#ifdef KESTREL_CUDA
  if (device == Device::kCuda) cuda::synchronize();
#endif
}

Tensor to_host_f32(const Tensor& src) {
  KESTREL_CHECK(src.defined(), "to_host_f32: undefined tensor");
  if (src.device() == Device::kCpu) {
    if (src.dtype() == DType::kF32) return src;
    Tensor out = Tensor::empty(DType::kF32, src.shape());
    convert_to_f32(src.raw(), src.dtype(), static_cast<size_t>(src.numel()), out.data<float>());
    return out;
  }
#ifdef KESTREL_CUDA
  Tensor out = Tensor::empty(DType::kF32, src.shape());
  cuda::copy(src, out);
  return out;
#else
  KESTREL_FAIL("to_host_f32: this kestrel was built without CUDA");
#endif
}

void copy_to_device(const Tensor& src, Tensor& dst) {
  KESTREL_CHECK(
      src.device() == Device::kCpu && src.dtype() == dst.dtype() && src.nbytes() == dst.nbytes(),
      "copy_to_device: host ", dtype_name(src.dtype()), " ", shape_str(src.shape()), " into ",
      dtype_name(dst.dtype()), " ", shape_str(dst.shape()));
  if (dst.device() == Device::kCpu) {
    std::memcpy(dst.raw(), src.raw(), src.nbytes());
    return;
  }
#ifdef KESTREL_CUDA
  cuda::copy(src, dst);
#endif
}

DType weight_dtype(Device device) {
  return device == Device::kCpu ? DType::kF32 : DType::kBF16;
}

Tensor to_device(const Tensor& src, Device device) {
  if (src.device() == device) return src;
#ifdef KESTREL_CUDA
  if (!src.defined()) return src;
  Tensor dst = Tensor::empty(src.dtype(), src.shape(), device);
  cuda::copy(src, dst);
  return dst;
#else
  KESTREL_FAIL("to_device: this kestrel was built without CUDA");
#endif
}

void copy_2d(const Tensor& src, int64_t src_offset, int64_t src_stride, Tensor& dst,
             int64_t dst_offset, int64_t dst_stride, int64_t rows, int64_t width) {
  KESTREL_CHECK(src.dtype() == dst.dtype() && src.device() == dst.device(),
                "copy_2d: src and dst differ in dtype or device");
  KESTREL_CHECK(rows >= 0 && width >= 0 && src_offset >= 0 && dst_offset >= 0 &&
                    width <= src_stride && width <= dst_stride,
                "copy_2d: ", rows, " rows of ", width, " with strides ", src_stride, " / ",
                dst_stride);
  if (rows == 0 || width == 0) return;
  KESTREL_CHECK(src_offset + (rows - 1) * src_stride + width <= src.numel() &&
                    dst_offset + (rows - 1) * dst_stride + width <= dst.numel(),
                "copy_2d: block of ", rows, " x ", width, " leaves src ", shape_str(src.shape()),
                " or dst ", shape_str(dst.shape()));
  const size_t es = dtype_size(src.dtype());
  const auto* s = static_cast<const char*>(src.raw()) + src_offset * es;
  auto* d = static_cast<char*>(dst.raw()) + dst_offset * es;
  if (src.device() == Device::kCpu) {
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(d + i * dst_stride * es, s + i * src_stride * es, width * es);
    return;
  }
#ifdef KESTREL_CUDA
  cuda::copy_2d(s, src_stride * es, d, dst_stride * es, width * es, rows);
#endif
}

Tensor upload_weight(const void* data, DType src_dtype, const Shape& shape, DType dtype,
                     Device device) {
  const int64_t n = shape_numel(shape);
  // FP8 codes mean nothing without their scale: they travel as they are, never widened here.
  KESTREL_CHECK(!is_fp8(src_dtype) || src_dtype == dtype, "upload_weight: ", dtype_name(src_dtype),
                " weights are loaded as FP8 with their scales, not as ", dtype_name(dtype));
  if (device == Device::kCpu && is_fp8(dtype)) {
    Tensor out = Tensor::empty(dtype, shape);
    std::memcpy(out.raw(), data, static_cast<size_t>(n));
    return out;
  }
  if (device == Device::kCpu) {
    KESTREL_CHECK(dtype == DType::kF32, "upload_weight: the CPU backend computes in F32");
    Tensor out = Tensor::empty(DType::kF32, shape);
    convert_to_f32(data, src_dtype, static_cast<size_t>(n), out.data<float>());
    return out;
  }
#ifdef KESTREL_CUDA
  return cuda::upload_weight(data, src_dtype, shape, dtype);
#else
  KESTREL_FAIL("upload_weight: this kestrel was built without CUDA");
#endif
}

Tensor random_uniform(const Shape& shape, DType dtype, Device device, uint64_t seed, float amp,
                      float constant) {
  KESTREL_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "random_uniform: dtype ",
                dtype_name(dtype));
#ifdef KESTREL_CUDA
  if (device == Device::kCuda) return cuda::random_uniform(shape, dtype, seed, amp, constant);
#endif
  KESTREL_CHECK(device == Device::kCpu, "random_uniform: built without CUDA");
  return cpu::random_uniform(shape, dtype, seed, amp, constant);
}

void embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  expect("embedding", "ids", ids, DType::kI32, 1);
  expect("embedding", "out", out, act_dtype(out), 2);
  KESTREL_CHECK(table.ndim() == 2 && out.dim(0) == ids.dim(0) && out.dim(1) == table.dim(1),
                "embedding: ids ", shape_str(ids.shape()), ", table ", shape_str(table.shape()),
                ", out ", shape_str(out.shape()));
  same_device("embedding", table, out);
  KESTREL_DISPATCH(out, embedding, ids, table, out);
}

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) {
  expect("layer_norm", "x", x, act_dtype(x), 2);
  KESTREL_CHECK(out.shape() == x.shape(), "layer_norm: out ", shape_str(out.shape()), " vs x ",
                shape_str(x.shape()));
  KESTREL_CHECK(weight.numel() == x.dim(1) && bias.numel() == x.dim(1), "layer_norm: weight ",
                shape_str(weight.shape()), " / bias ", shape_str(bias.shape()), " for hidden ",
                x.dim(1));
  KESTREL_DISPATCH(x, layer_norm, x, weight, bias, eps, out);
}

static void check_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
                         const LinearEpilogue& epilogue) {
  expect("linear", "x", x, act_dtype(x), 2);
  // On CUDA the output may also be F32 (the logits).
  if (x.device() == Device::kCuda && out.dtype() == DType::kF32) {
    expect("linear", "out", out, DType::kF32, 2);
  } else {
    expect("linear", "out", out, act_dtype(x), 2);
  }
  KESTREL_CHECK(weight.ndim() == 2 && weight.dim(1) == x.dim(1) && out.dim(0) == x.dim(0) &&
                    out.dim(1) == weight.dim(0),
                "linear: x ", shape_str(x.shape()), ", weight ", shape_str(weight.shape()),
                ", out ", shape_str(out.shape()));
  KESTREL_CHECK(!bias.defined() || bias.numel() == weight.dim(0), "linear: bias ",
                shape_str(bias.shape()), " for ", weight.dim(0), " outputs");
  same_device("linear", x, weight);
  if (weight.dtype() == DType::kF8E4M3) {
    const Tensor* s = epilogue.weight_scale;
    KESTREL_CHECK(s && s->defined() && s->dtype() == DType::kF32 &&
                      (s->numel() == weight.dim(0) || s->numel() == 1),
                  "linear: an F8_E4M3 weight [", weight.dim(0),
                  ", ...] needs F32 scales of one per row or one in all");
    same_device("linear", x, *s);
  } else {
    KESTREL_CHECK(weight.dtype() == act_dtype(x), "linear: weight dtype ",
                  dtype_name(weight.dtype()), " for activations of ", dtype_name(act_dtype(x)));
    KESTREL_CHECK(!epilogue.weight_scale && !epilogue.fp8_activations,
                  "linear: weight scales or FP8 activations need an F8_E4M3 weight");
  }
  KESTREL_CHECK(!epilogue.accumulate || out.raw() != x.raw(),
                "linear: accumulate needs out apart from x");
  if (epilogue.addend) {
    KESTREL_CHECK(epilogue.accumulate, "linear: an addend needs accumulate");
    KESTREL_CHECK(epilogue.addend->raw() != out.raw() && epilogue.addend->raw() != x.raw(),
                  "linear: the addend must be apart from out and x");
    KESTREL_CHECK(epilogue.addend->shape() == out.shape() &&
                      epilogue.addend->dtype() == out.dtype() &&
                      epilogue.addend->device() == out.device(),
                  "linear: addend ", shape_str(epilogue.addend->shape()), " ",
                  dtype_name(epilogue.addend->dtype()), " for out ", shape_str(out.shape()), " ",
                  dtype_name(out.dtype()));
  }
  if (const LinearTerm& t = epilogue.plus; t.x || t.weight || t.bias) {
    KESTREL_CHECK(t.x && t.weight, "linear: a second product needs its x and weight");
    KESTREL_CHECK(epilogue.accumulate && !epilogue.gelu && !epilogue.addend,
                  "linear: a second product needs accumulate, without GELU or an addend");
    KESTREL_CHECK(weight.dtype() == act_dtype(x) && t.weight->dtype() == act_dtype(x),
                  "linear: a second product needs both weights at full width");
    expect("linear", "second x", *t.x, act_dtype(x), 2);
    KESTREL_CHECK(t.weight->ndim() == 2 && t.x->dim(0) == x.dim(0) &&
                      t.weight->dim(0) == weight.dim(0) && t.weight->dim(1) == t.x->dim(1),
                  "linear: second x ", shape_str(t.x->shape()), ", weight ",
                  shape_str(t.weight->shape()), " beside x ", shape_str(x.shape()), ", weight ",
                  shape_str(weight.shape()));
    KESTREL_CHECK(!t.bias || !t.bias->defined() || t.bias->numel() == weight.dim(0),
                  "linear: second bias ", shape_str(t.bias->shape()), " for ", weight.dim(0),
                  " outputs");
    KESTREL_CHECK(t.x->raw() != out.raw(), "linear: the second x must be apart from out");
    same_device("linear", x, *t.x);
    same_device("linear", x, *t.weight);
  }
}

void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out,
            const LinearEpilogue& epilogue) {
  check_linear(x, weight, bias, out, epilogue);
  KESTREL_DISPATCH(x, linear, x, weight, bias, out, epilogue);
}

void linear_pair(const Tensor& x, const Tensor& w1, const Tensor& b1, Tensor& out1,
                 const Tensor& w2, const Tensor& b2, Tensor& out2, bool gelu2,
                 const PairNorm& norm) {
  check_linear(x, w1, b1, out1, {});
  check_linear(x, w2, b2, out2, {.gelu = gelu2});
  KESTREL_CHECK(w1.dtype() == act_dtype(x) && w2.dtype() == act_dtype(x),
                "linear_pair: weights at full width only");
  KESTREL_CHECK(out1.raw() != x.raw() && out2.raw() != x.raw() && out1.raw() != out2.raw(),
                "linear_pair: out1, out2 and x must be apart");
  const Tensor* in = &x;
  if (norm.weight) {
    KESTREL_CHECK(norm.bias && norm.out, "linear_pair: a norm needs its bias and out");
    KESTREL_CHECK(norm.out->shape() == x.shape() && norm.out->dtype() == x.dtype(),
                  "linear_pair: the norm's out ", shape_str(norm.out->shape()), " vs x ",
                  shape_str(x.shape()));
    KESTREL_CHECK(norm.weight->numel() == x.dim(1) && norm.bias->numel() == x.dim(1),
                  "linear_pair: norm weight ", shape_str(norm.weight->shape()), " / bias ",
                  shape_str(norm.bias->shape()), " for hidden ", x.dim(1));
    KESTREL_CHECK(norm.out->raw() != x.raw() && norm.out->raw() != out1.raw() &&
                      norm.out->raw() != out2.raw(),
                  "linear_pair: the norm's out must be apart from x and the outs");
    same_device("linear_pair", x, *norm.weight);
    same_device("linear_pair", x, *norm.bias);
    same_device("linear_pair", x, *norm.out);
#ifdef KESTREL_CUDA
    if (x.device() == Device::kCuda &&
        cuda::linear_pair(x, w1, b1, out1, w2, b2, out2, gelu2, &norm))
      return;
#endif
    layer_norm(x, *norm.weight, *norm.bias, norm.eps, *norm.out);
    in = norm.out;
  }
#ifdef KESTREL_CUDA
  if (x.device() == Device::kCuda && cuda::linear_pair(*in, w1, b1, out1, w2, b2, out2, gelu2))
    return;
#endif
  linear(*in, w1, b1, out1);
  linear(*in, w2, b2, out2, {.gelu = gelu2});
}

void quantize_fp8(const Tensor& weight, Tensor& q, Tensor& scale) {
  KESTREL_CHECK(weight.defined() && weight.ndim() == 2, "quantize_fp8: weight must be 2-D");
  KESTREL_CHECK(weight.dtype() == weight_dtype(weight.device()) || weight.dtype() == DType::kF32,
                "quantize_fp8: weight dtype ", dtype_name(weight.dtype()));
  KESTREL_CHECK(
      !scale.defined() || (scale.dtype() == DType::kF32 && scale.numel() == weight.dim(0) &&
                           scale.device() == weight.device()),
      "quantize_fp8: a given scale must be F32 [", weight.dim(0), "] on the weight's device");
  KESTREL_DISPATCH(weight, quantize_fp8, weight, q, scale);
}

void gelu(Tensor& x) {
  KESTREL_CHECK(x.dtype() == act_dtype(x), "gelu: dtype ", dtype_name(x.dtype()));
  KESTREL_DISPATCH(x, gelu, x);
}

void add(const Tensor& a, const Tensor& b, const Tensor& c, Tensor& out) {
  KESTREL_CHECK(a.shape() == b.shape() && a.shape() == out.shape() &&
                    (!c.defined() || c.shape() == a.shape()),
                "add: shapes ", shape_str(a.shape()), ", ", shape_str(b.shape()), ", ",
                shape_str(out.shape()));
  KESTREL_DISPATCH(a, add, a, b, c, out);
}

static void check_qkv_rotary(const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                             const Tensor& q, const Tensor& k, const Tensor& v) {
  expect("qkv_rotary", "q", q, act_dtype(q), 3);
  expect("qkv_rotary", "k", k, act_dtype(q), 3);
  const bool rotate = cos.defined() || sin.defined();
  if (rotate) expect("qkv_rotary", "cos", cos, DType::kF32, 2);
  const int64_t n_tokens = q.dim(0), n_heads = q.dim(1), head_dim = q.dim(2);
  const int64_t n_kv_heads = k.dim(1);
  KESTREL_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && (!rotate || head_dim % 2 == 0),
                "qkv_rotary: ", n_heads, " heads over ", n_kv_heads, " K/V heads of size ",
                head_dim);
  KESTREL_CHECK(qkv.ndim() == 2 && qkv.dim(0) == n_tokens &&
                    qkv.dim(1) == (n_heads + 2 * n_kv_heads) * head_dim,
                "qkv_rotary: qkv ", shape_str(qkv.shape()), " for q ", shape_str(q.shape()), ", k ",
                shape_str(k.shape()));
  KESTREL_CHECK(k.shape() == v.shape() && k.dim(0) == n_tokens && k.dim(2) == head_dim,
                "qkv_rotary: k ", shape_str(k.shape()), ", v ", shape_str(v.shape()));
  KESTREL_CHECK(!rotate || (cos.defined() && sin.defined() && cos.shape() == sin.shape() &&
                            cos.dim(0) == n_tokens && cos.dim(1) == head_dim / 2),
                "qkv_rotary: cos/sin ", shape_str(cos.shape()), " / ", shape_str(sin.shape()),
                " for ", n_tokens, " tokens of head_dim ", head_dim);
}

static void check_kv_write(const Tensor& k, const Tensor& v, const Tensor& slots,
                           const Tensor& k_cache, const Tensor& v_cache) {
  expect("kv_write", "slots", slots, DType::kI64, 1);
  KESTREL_CHECK(k.ndim() == 3 && k.shape() == v.shape() && slots.dim(0) == k.dim(0), "kv_write: k ",
                shape_str(k.shape()), ", v ", shape_str(v.shape()), ", slots ",
                shape_str(slots.shape()));
  KESTREL_CHECK(k_cache.ndim() == 4 && k_cache.shape() == v_cache.shape() &&
                    k_cache.dim(2) == k.dim(1) && k_cache.dim(3) == k.dim(2),
                "kv_write: cache ", shape_str(k_cache.shape()), " for k ", shape_str(k.shape()));
  KESTREL_CHECK(k_cache.dtype() == v_cache.dtype() &&
                    (k_cache.dtype() == k.dtype() || k_cache.dtype() == DType::kF8E4M3),
                "kv_write: cache dtype ", dtype_name(k_cache.dtype()), " vs k ",
                dtype_name(k.dtype()));
}

void qkv_rotary(const Tensor& qkv, const Tensor& cos, const Tensor& sin, Tensor& q, Tensor& k,
                Tensor& v) {
  check_qkv_rotary(qkv, cos, sin, q, k, v);
  KESTREL_DISPATCH(q, qkv_rotary, qkv, cos, sin, q, k, v);
}

void kv_write(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
              Tensor& v_cache) {
  check_kv_write(k, v, slots, k_cache, v_cache);
  KESTREL_DISPATCH(k, kv_write, k, v, slots, k_cache, v_cache);
}

void qkv_rotary_kv_write(const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                         const Tensor& slots, Tensor& q, Tensor& k, Tensor& v, Tensor& k_cache,
                         Tensor& v_cache) {
#ifdef KESTREL_CUDA
  if (q.device() == Device::kCuda) {
    check_qkv_rotary(qkv, cos, sin, q, k, v);
    check_kv_write(k, v, slots, k_cache, v_cache);
    cuda::qkv_rotary_kv_write(qkv, cos, sin, slots, q, k_cache, v_cache);
    return;
  }
#endif
  qkv_rotary(qkv, cos, sin, q, k, v);
  kv_write(k, v, slots, k_cache, v_cache);
}

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& block_tables, const Tensor& cu_q, const Tensor& kv_lens,
                     int32_t max_kv_len, float scale, Tensor& out, int32_t max_q_len,
                     const Tensor& alibi_slopes) {
  expect("paged_attention", "q", q, act_dtype(q), 3);
  if (alibi_slopes.defined()) {
    expect("paged_attention", "alibi_slopes", alibi_slopes, DType::kF32, 1);
    KESTREL_CHECK(alibi_slopes.dim(0) == q.dim(1) && alibi_slopes.device() == q.device(),
                  "paged_attention: alibi_slopes ", shape_str(alibi_slopes.shape()),
                  " must hold one slope per query head (", q.dim(1), ") on q's device");
  }
  expect("paged_attention", "block_tables", block_tables, DType::kI32, 2);
  expect("paged_attention", "cu_q", cu_q, DType::kI32, 1);
  expect("paged_attention", "kv_lens", kv_lens, DType::kI32, 1);
  const int64_t n_seqs = kv_lens.dim(0);
  KESTREL_CHECK(cu_q.dim(0) == n_seqs + 1 && block_tables.dim(0) == n_seqs,
                "paged_attention: cu_q ", shape_str(cu_q.shape()), ", block_tables ",
                shape_str(block_tables.shape()), " for ", n_seqs, " sequences");
  KESTREL_CHECK(k_cache.ndim() == 4 && k_cache.shape() == v_cache.shape() &&
                    k_cache.dim(3) == q.dim(2) && q.dim(1) % k_cache.dim(2) == 0,
                "paged_attention: cache ", shape_str(k_cache.shape()), " for q ",
                shape_str(q.shape()));
  KESTREL_CHECK(out.shape() == q.shape(), "paged_attention: out ", shape_str(out.shape()), " vs q ",
                shape_str(q.shape()));
  KESTREL_CHECK(max_kv_len <= block_tables.dim(1) * k_cache.dim(1), "paged_attention: max_kv_len ",
                max_kv_len, " beyond ", block_tables.dim(1), " blocks of ", k_cache.dim(1));
  KESTREL_CHECK(max_q_len >= 0 && max_q_len <= q.dim(0), "paged_attention: max_q_len ", max_q_len,
                " for ", q.dim(0), " rows");
  KESTREL_CHECK(k_cache.dtype() == v_cache.dtype() &&
                    (k_cache.dtype() == q.dtype() || k_cache.dtype() == DType::kF8E4M3),
                "paged_attention: a ", dtype_name(k_cache.dtype()), " cache for ",
                dtype_name(q.dtype()), " q");
#ifdef KESTREL_CUDA
  if (q.device() == Device::kCuda) {
    cuda::paged_attention(q, k_cache, v_cache, block_tables, cu_q, kv_lens, max_kv_len, scale, out,
                          max_q_len, alibi_slopes);
    return;
  }
#endif
  KESTREL_CHECK(q.device() == Device::kCpu, "paged_attention: built without CUDA");
  cpu::paged_attention(q, k_cache, v_cache, block_tables, cu_q, kv_lens, max_kv_len, scale, out,
                       alibi_slopes);
}

void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) {
  expect("gather_rows", "indices", indices, DType::kI32, 1);
  KESTREL_CHECK(x.ndim() == 2 && out.ndim() == 2 && out.dim(0) == indices.dim(0) &&
                    out.dim(1) == x.dim(1) && out.dtype() == x.dtype(),
                "gather_rows: x ", shape_str(x.shape()), ", indices ", shape_str(indices.shape()),
                ", out ", shape_str(out.shape()));
  KESTREL_DISPATCH(x, gather_rows, x, indices, out);
}

void lora_add(const Tensor& x, const std::vector<LoraSegment>& segments, Tensor& out) {
  expect("lora_add", "x", x, act_dtype(x), 2);
  expect("lora_add", "out", out, act_dtype(x), 2);
  KESTREL_CHECK(out.dim(0) == x.dim(0), "lora_add: x ", shape_str(x.shape()), ", out ",
                shape_str(out.shape()));
  same_device("lora_add", x, out);
  int32_t prev_end = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const LoraSegment& g = segments[s];
    KESTREL_CHECK(g.a && g.b && g.a->defined() && g.b->defined(), "lora_add: segment ", s,
                  " has no a or b");
    KESTREL_CHECK(g.begin >= prev_end && g.begin <= g.end && g.end <= x.dim(0),
                  "lora_add: segment ", s, " rows [", g.begin, ", ", g.end,
                  ") overlap or leave [0, ", x.dim(0), ")");
    prev_end = g.end;
    const Tensor &a = *g.a, &b = *g.b;
    KESTREL_CHECK(a.ndim() == 2 && b.ndim() == 2 && a.dim(1) == x.dim(1) &&
                      b.dim(0) == out.dim(1) && b.dim(1) == a.dim(0),
                  "lora_add: segment ", s, ": a ", shape_str(a.shape()), ", b ",
                  shape_str(b.shape()), " for x ", shape_str(x.shape()), ", out ",
                  shape_str(out.shape()));
    // CUDA also takes F16 weights with bf16 x (F16 adapters are kept as F16 there).
    const bool f16_ok = x.device() == Device::kCuda && a.dtype() == DType::kF16;
    KESTREL_CHECK((a.dtype() == x.dtype() || f16_ok) && b.dtype() == a.dtype(),
                  "lora_add: segment ", s, " weights in ", dtype_name(a.dtype()), " and ",
                  dtype_name(b.dtype()), ", x in ", dtype_name(x.dtype()));
    same_device("lora_add", x, a);
    same_device("lora_add", x, b);
  }
  if (segments.empty()) return;
  KESTREL_DISPATCH(x, lora_add, x, segments, out);
}

LoraTableEntry lora_table_entry(const LoraSegment& s, int64_t in) {
  KESTREL_CHECK(s.a && s.b && s.a->defined() && s.b->defined(), "lora_table_entry: no a or b");
#ifdef KESTREL_CUDA
  return cuda::lora_table_entry(s, in);
#else
  (void)in;
  KESTREL_FAIL("lora_table_entry: this kestrel was built without CUDA");
#endif
}

void lora_add_table(const Tensor& x, const void* table, int n_entries, int max_r, Tensor& out) {
  expect("lora_add_table", "x", x, act_dtype(x), 2);
  expect("lora_add_table", "out", out, act_dtype(x), 2);
  KESTREL_CHECK(out.dim(0) == x.dim(0), "lora_add_table: x ", shape_str(x.shape()), ", out ",
                shape_str(out.shape()));
  KESTREL_CHECK(x.device() == Device::kCuda, "lora_add_table: device-side tables are CUDA only");
  KESTREL_CHECK(n_entries >= 0 && max_r > 0 && max_r <= 128, "lora_add_table: ", n_entries,
                " entries of rank up to ", max_r, " (1..128)");
  same_device("lora_add_table", x, out);
  if (n_entries == 0) return;
#ifdef KESTREL_CUDA
  cuda::lora_add_table(x, table, n_entries, max_r, out);
#else
  (void)table;
#endif
}

void argmax_rows(const Tensor& logits, Tensor& out) {
  expect("argmax_rows", "logits", logits, DType::kF32, 2);
  expect("argmax_rows", "out", out, DType::kI32, 1);
  KESTREL_CHECK(out.dim(0) == logits.dim(0) && logits.dim(1) > 0, "argmax_rows: logits ",
                shape_str(logits.shape()), ", out ", shape_str(out.shape()));
  same_device("argmax_rows", logits, out);
  KESTREL_DISPATCH(logits, argmax_rows, logits, out);
}

void apply_token_bitmask(Tensor& logits, const std::vector<int32_t>& rows,
                         const std::vector<int32_t>& bitmask, int64_t words) {
  expect("apply_token_bitmask", "logits", logits, DType::kF32, 2);
  const int64_t n = logits.dim(0), vocab = logits.dim(1);
  KESTREL_CHECK(words * 32 >= vocab && static_cast<int64_t>(bitmask.size()) ==
                                           static_cast<int64_t>(rows.size()) * words,
                "apply_token_bitmask: ", rows.size(), " rows of ", words, " words for vocab ",
                vocab, ", bitmask of ", bitmask.size());
  for (int32_t r : rows) {
    KESTREL_CHECK(r >= 0 && r < n, "apply_token_bitmask: row ", r, " outside ", n);
  }
  if (rows.empty()) return;
  KESTREL_DISPATCH(logits, apply_token_bitmask, logits, rows, bitmask, words);
}

void greedy_rows(const Tensor& logits, Tensor& ids, Tensor& logprobs) {
  expect("greedy_rows", "logits", logits, DType::kF32, 2);
  expect("greedy_rows", "ids", ids, DType::kI32, 1);
  expect("greedy_rows", "logprobs", logprobs, DType::kF32, 1);
  KESTREL_CHECK(
      ids.dim(0) == logits.dim(0) && logprobs.dim(0) == logits.dim(0) && logits.dim(1) > 0,
      "greedy_rows: logits ", shape_str(logits.shape()), ", ids ", shape_str(ids.shape()),
      ", logprobs ", shape_str(logprobs.shape()));
  same_device("greedy_rows", logits, ids);
  same_device("greedy_rows", logits, logprobs);
  KESTREL_DISPATCH(logits, greedy_rows, logits, ids, logprobs);
}

std::string device_name(Device device) {
#ifdef KESTREL_CUDA
  if (device == Device::kCuda) return cuda::device_name();
#endif
  return device == Device::kCpu ? "cpu" : "cuda";
}

DeviceMemory device_memory(Device device) {
  DeviceMemory m;
#ifdef KESTREL_CUDA
  if (device == Device::kCuda) {
    const cuda::DeviceMemoryInfo d = cuda::device_memory_info();
    const cuda::MemoryStats st = cuda::memory_stats();
    m.free = static_cast<int64_t>(d.free);
    m.total = static_cast<int64_t>(d.total);
    m.reserved = static_cast<int64_t>(st.reserved);
    m.in_use = static_cast<int64_t>(st.in_use);
    m.peak_in_use = static_cast<int64_t>(st.peak_in_use);
  }
#else
  (void)device;
#endif
  return m;
}

void reset_peak_memory(Device device) {
#ifdef KESTREL_CUDA
  if (device == Device::kCuda) cuda::reset_peak_memory();
#else
  (void)device;
#endif
}

void release_cached_memory(Device device) {
#ifdef KESTREL_CUDA
  if (device == Device::kCuda) cuda::empty_cache();
#else
  (void)device;
#endif
}

#ifdef KESTREL_CUDA
struct BackgroundDeviceWork::Impl {
  cuda::SideStream side;
};
#else
struct BackgroundDeviceWork::Impl {};
#endif

BackgroundDeviceWork::BackgroundDeviceWork(Device device) {
  if (device == Device::kCuda) impl_ = std::make_unique<Impl>();
}
BackgroundDeviceWork::~BackgroundDeviceWork() = default;

std::vector<SampleResult> sample_on_device(const Tensor& logits,
                                           const std::vector<SampleSpec>& rows,
                                           std::vector<uint8_t>* masks) {
  expect("sample_on_device", "logits", logits, DType::kF32, 2);
  KESTREL_CHECK(logits.dim(0) == static_cast<int64_t>(rows.size()) && logits.dim(1) > 0,
                "sample_on_device: logits ", shape_str(logits.shape()), " for ", rows.size(),
                " rows");
  for (const SampleSpec& r : rows) {
    KESTREL_CHECK(r.u >= 0.0 && r.u < 1.0, "sample_on_device: u must be in [0, 1), got ", r.u);
    KESTREL_CHECK(r.temperature > 0.0f, "sample_on_device: temperature must be positive, got ",
                  r.temperature);
  }
#ifdef KESTREL_CUDA
  if (logits.device() == Device::kCuda) return cuda::sample_on_device(logits, rows, masks);
#endif
  KESTREL_FAIL("sample_on_device: logits must be on CUDA (the CPU samples in engine/sampler.cpp)");
}

size_t sampling_workspace_bytes(Device device, int64_t n_rows, int64_t vocab) {
#ifdef KESTREL_CUDA
  if (device == Device::kCuda) return cuda::sampling_workspace_bytes(n_rows, vocab);
#else
  (void)device, (void)n_rows, (void)vocab;
#endif
  return 0;
}

std::unique_ptr<DeviceGraph> capture_graph(Device device, const std::function<Tensor()>& body,
                                           Tensor* out) {
  KESTREL_CHECK(device == Device::kCuda, "capture_graph: graphs are CUDA only");
#ifdef KESTREL_CUDA
  return cuda::capture_graph(body, out);
#else
  (void)body;
  (void)out;
  KESTREL_FAIL("capture_graph: this kestrel was built without CUDA");
#endif
}

int64_t graph_pool_bytes(Device device) {
#ifdef KESTREL_CUDA
  if (device == Device::kCuda) return static_cast<int64_t>(cuda::graph_pool_bytes());
#endif
  (void)device;
  return 0;
}

}  // namespace kestrel::ops
