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

DType weight_dtype(Device device) {
  return device == Device::kCpu ? DType::kF32 : DType::kBF16;
}

Tensor to_device(const Tensor& src, Device device) {
  if (src.device() == device) return src;
#ifdef KESTREL_CUDA
  Tensor dst = Tensor::empty(src.dtype(), src.shape(), device);
  cuda::copy(src, dst);
  return dst;
#else
  KESTREL_FAIL("to_device: this kestrel was built without CUDA");
#endif
}

Tensor upload_weight(const void* data, DType src_dtype, const Shape& shape, DType dtype,
                     Device device) {
  const int64_t n = shape_numel(shape);
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

void linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& out) {
  expect("linear", "x", x, act_dtype(x), 2);
  expect("linear", "out", out, act_dtype(x), 2);
  KESTREL_CHECK(weight.ndim() == 2 && weight.dim(1) == x.dim(1) && out.dim(0) == x.dim(0) &&
                    out.dim(1) == weight.dim(0),
                "linear: x ", shape_str(x.shape()), ", weight ", shape_str(weight.shape()),
                ", out ", shape_str(out.shape()));
  KESTREL_CHECK(!bias.defined() || bias.numel() == weight.dim(0), "linear: bias ",
                shape_str(bias.shape()), " for ", weight.dim(0), " outputs");
  same_device("linear", x, weight);
  KESTREL_DISPATCH(x, linear, x, weight, bias, out);
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

void qkv_rotary(const Tensor& qkv, const Tensor& cos, const Tensor& sin, Tensor& q, Tensor& k,
                Tensor& v) {
  expect("qkv_rotary", "q", q, act_dtype(q), 3);
  expect("qkv_rotary", "k", k, act_dtype(q), 3);
  expect("qkv_rotary", "cos", cos, DType::kF32, 2);
  const int64_t n_tokens = q.dim(0), n_heads = q.dim(1), head_dim = q.dim(2);
  const int64_t n_kv_heads = k.dim(1);
  KESTREL_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && head_dim % 2 == 0,
                "qkv_rotary: ", n_heads, " heads over ", n_kv_heads, " K/V heads of size ",
                head_dim);
  KESTREL_CHECK(qkv.ndim() == 2 && qkv.dim(0) == n_tokens &&
                    qkv.dim(1) == (n_heads + 2 * n_kv_heads) * head_dim,
                "qkv_rotary: qkv ", shape_str(qkv.shape()), " for q ", shape_str(q.shape()), ", k ",
                shape_str(k.shape()));
  KESTREL_CHECK(k.shape() == v.shape() && k.dim(0) == n_tokens && k.dim(2) == head_dim,
                "qkv_rotary: k ", shape_str(k.shape()), ", v ", shape_str(v.shape()));
  KESTREL_CHECK(cos.shape() == sin.shape() && cos.dim(0) == n_tokens && cos.dim(1) == head_dim / 2,
                "qkv_rotary: cos/sin ", shape_str(cos.shape()), " for ", n_tokens,
                " tokens of head_dim ", head_dim);
  KESTREL_DISPATCH(q, qkv_rotary, qkv, cos, sin, q, k, v);
}

void kv_write(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
              Tensor& v_cache) {
  expect("kv_write", "slots", slots, DType::kI64, 1);
  KESTREL_CHECK(k.ndim() == 3 && k.shape() == v.shape() && slots.dim(0) == k.dim(0), "kv_write: k ",
                shape_str(k.shape()), ", v ", shape_str(v.shape()), ", slots ",
                shape_str(slots.shape()));
  KESTREL_CHECK(k_cache.ndim() == 4 && k_cache.shape() == v_cache.shape() &&
                    k_cache.dim(2) == k.dim(1) && k_cache.dim(3) == k.dim(2),
                "kv_write: cache ", shape_str(k_cache.shape()), " for k ", shape_str(k.shape()));
  KESTREL_CHECK(k_cache.dtype() == k.dtype(), "kv_write: cache dtype ", dtype_name(k_cache.dtype()),
                " vs k ", dtype_name(k.dtype()));
  KESTREL_DISPATCH(k, kv_write, k, v, slots, k_cache, v_cache);
}

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& block_tables, const Tensor& cu_q, const Tensor& kv_lens,
                     int32_t max_kv_len, float scale, Tensor& out) {
  expect("paged_attention", "q", q, act_dtype(q), 3);
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
  KESTREL_DISPATCH(q, paged_attention, q, k_cache, v_cache, block_tables, cu_q, kv_lens, max_kv_len,
                   scale, out);
}

void gather_rows(const Tensor& x, const Tensor& indices, Tensor& out) {
  expect("gather_rows", "indices", indices, DType::kI32, 1);
  KESTREL_CHECK(x.ndim() == 2 && out.ndim() == 2 && out.dim(0) == indices.dim(0) &&
                    out.dim(1) == x.dim(1) && out.dtype() == x.dtype(),
                "gather_rows: x ", shape_str(x.shape()), ", indices ", shape_str(indices.shape()),
                ", out ", shape_str(out.shape()));
  KESTREL_DISPATCH(x, gather_rows, x, indices, out);
}

}  // namespace kestrel::ops
