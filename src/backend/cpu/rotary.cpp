// CPU split of the fused query_key_value rows with NeoX rotary on q and k (or
// none, for ALiBi models), and the write of new keys and values into their
// cache slots.
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace kestrel::cpu {
namespace {

// dst[d] = src rotated: the two halves (x1, x2) become (x1 c - x2 s, x2 c + x1 s).
inline void rotate(const float* src, const float* cos, const float* sin, int64_t head_dim,
                   float* dst) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = src[i], x2 = src[i + half];
    dst[i] = x1 * cos[i] - x2 * sin[i];
    dst[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

}  // namespace

void qkv_rotary(const Tensor& qkv, const Tensor& cos, const Tensor& sin, Tensor& q, Tensor& k,
                Tensor& v) {
  const int64_t n_tokens = q.dim(0), n_heads = q.dim(1), head_dim = q.dim(2);
  const int64_t n_kv_heads = k.dim(1), group = n_heads / n_kv_heads, half = head_dim / 2;
  const int64_t row = qkv.dim(1);
  const bool rotary = cos.defined();  // undefined: split only (ALiBi models)
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* src = qkv.data<float>() + t * row;
    const float* c = rotary ? cos.data<float>() + t * half : nullptr;
    const float* s = rotary ? sin.data<float>() + t * half : nullptr;
    auto put = [&](const float* from, float* to) {
      if (rotary) {
        rotate(from, c, s, head_dim, to);
      } else {
        std::memcpy(to, from, sizeof(float) * head_dim);
      }
    };
    for (int64_t g = 0; g < n_kv_heads; ++g) {
      const float* gp = src + g * (group + 2) * head_dim;
      for (int64_t h = 0; h < group; ++h) {
        put(gp + h * head_dim, q.data<float>() + (t * n_heads + g * group + h) * head_dim);
      }
      put(gp + group * head_dim, k.data<float>() + (t * n_kv_heads + g) * head_dim);
      std::memcpy(v.data<float>() + (t * n_kv_heads + g) * head_dim, gp + (group + 1) * head_dim,
                  sizeof(float) * head_dim);
    }
  }
}

void kv_write(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
              Tensor& v_cache) {
  const int64_t n_tokens = k.dim(0);
  const int64_t n_slots = k_cache.dim(0) * k_cache.dim(1);
  const int64_t row = k.dim(1) * k.dim(2);
  const int64_t* slot = slots.data<int64_t>();
  const bool fp8 = k_cache.dtype() == DType::kF8E4M3;
  for (int64_t t = 0; t < n_tokens; ++t) {
    KESTREL_CHECK(slot[t] >= 0 && slot[t] < n_slots, "kv_write: slot ", slot[t],
                  " outside the cache's ", n_slots, " slots");
    if (fp8) {  // E4M3 under a scale of 1 (docs/fp8.md, "KV cache")
      for (int64_t i = 0; i < row; ++i) {
        k_cache.data<uint8_t>()[slot[t] * row + i] = f32_to_f8e4m3(k.data<float>()[t * row + i]);
        v_cache.data<uint8_t>()[slot[t] * row + i] = f32_to_f8e4m3(v.data<float>()[t * row + i]);
      }
      continue;
    }
    std::memcpy(k_cache.data<float>() + slot[t] * row, k.data<float>() + t * row,
                sizeof(float) * row);
    std::memcpy(v_cache.data<float>() + slot[t] * row, v.data<float>() + t * row,
                sizeof(float) * row);
  }
}

}  // namespace kestrel::cpu
