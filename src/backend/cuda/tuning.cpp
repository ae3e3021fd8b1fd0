#include "backend/cuda/tuning.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "core/env.h"

namespace kestrel::cuda {
namespace {

std::optional<int64_t> env_int(const char* name) {
  const std::optional<std::string> v = env_var(name);
  if (!v) return std::nullopt;
  return std::strtoll(v->c_str(), nullptr, 10);
}

Tuning& current() {
  static Tuning t = Tuning::from_environment();
  return t;
}

}  // namespace

Tuning Tuning::from_environment() {
  Tuning t;
  if (auto v = env_int("KESTREL_ATTN_KERNEL"))
    t.attention_kernel = static_cast<int>(std::clamp<int64_t>(*v, 0, 2));
  if (auto v = env_int("KESTREL_ATTN_SPLITS"))
    t.attention_splits = static_cast<int>(std::clamp<int64_t>(*v, 0, 32));
  if (auto v = env_int("KESTREL_GEMV")) t.gemv = static_cast<int>(std::clamp<int64_t>(*v, -1, 6));
  if (auto v = env_int("KESTREL_DECODE_GEMM"))
    t.decode_gemm = static_cast<int>(std::clamp<int64_t>(*v, -1, 4));
  if (auto v = env_int("KESTREL_TWO_PRODUCTS")) t.two_products = *v != 0;
  if (auto v = env_int("KESTREL_NORM_IN_GEMV")) t.norm_in_gemv = *v != 0;
  if (auto v = env_int("KESTREL_GELU_EPILOGUE")) t.gelu_epilogue = *v != 0;
  if (auto v = env_int("KESTREL_PDL")) t.pdl = static_cast<int>(std::clamp<int64_t>(*v, 0, 2));
  if (auto v = env_int("KESTREL_GEMV_PREFETCH")) t.gemv_prefetch = *v == 1;
  if (auto v = env_int("KESTREL_LORA_PDL")) t.lora_pdl = *v != 0;
  if (auto v = env_int("KESTREL_LORA_WIDE")) t.lora_wide = *v != 0;
  if (auto v = env_int("KESTREL_LORA_ROWS1")) t.lora_rows1 = *v != 0;
  if (auto v = env_int("KESTREL_LORA_SHRINK_BLOCKS"); v && *v > 0) t.lora_shrink_blocks = *v;
  return t;
}

const Tuning& tuning() {
  return current();
}

void set_tuning(const Tuning& t) {
  current() = t;
}

}  // namespace kestrel::cuda
