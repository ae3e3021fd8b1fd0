// The CUDA backend's tuning: the choices between kernels and launch modes that measurements
// settled (docs/gpu.md says why, docs/benchmarks.md gives the figures). Read once, at first use,
// from the KESTREL_* variable named beside each field (for benchmarks that compare the
// alternatives; no user needs them, so none is a CLI flag), or set by tests through set_tuning().
// Launchers read tuning() and nothing else.
#pragma once

#include <cstdint>

namespace kestrel::cuda {

struct Tuning {
  // Attention (attention.cu). KESTREL_ATTN_KERNEL: 0 automatic (the tensor-core kernel v3 for
  // head_dim 64 / 128, else the generic v1), 1 v1 always, 2 v3 where it applies.
  int attention_kernel = 0;
  // KESTREL_ATTN_SPLITS: 0 the measured rule for splitting the context over blocks
  // (flash-decoding: only while the grid leaves half the multiprocessors idle), N > 0 forces N.
  int attention_splits = 0;
  // Linears of 1..8 rows (gemm.cpp, gemv.cu). KESTREL_GEMV: -1 the GEMV where it measured
  // faster and applies (variant 4 for 1 row, 6 for 2), 0 cuBLASLt only, 1..6 that GEMV variant
  // for every 1..8 rows.
  int gemv = -1;
  // Linears of 3..128 rows (gemm.cpp, decode_gemm.cu). KESTREL_DECODE_GEMM: -1 the wgmma decode
  // GEMM where it measured faster than cuBLASLt (cuda::decode_gemm_choice: 3-32 rows of 192 MiB
  // of weights and more: falcon-7b's two-product launches and lm_head),
  // 0 cuBLASLt only, 1 the decode GEMM for every 3..128 rows where it applies, 2 the same with
  // w's loads marked evict-first in L2, 3 that with a stage's wgmma left running while the next
  // stage's is issued, 4 that with 256 k a stage (128 above 32 rows).
  int decode_gemm = -1;
  // Two products in one launch (LinearEpilogue::plus: parallel attention's fc2 + dense;
  // linear_pair: qkv + fc1) in the GEMV and the decode GEMM. KESTREL_TWO_PRODUCTS=0: each as two
  // launches (dense apart, then fc2 with it as the addend; two linears).
  bool two_products = true;
  // KESTREL_NORM_IN_GEMV=1: the LayerNorm before a pair of 1-2 rows folded into the GEMV's
  // load of x (ops::PairNorm), not a launch of its own (not yet measured on a GPU: off).
  bool norm_in_gemv = false;
  // KESTREL_GELU_EPILOGUE=0: the exact erf GELU as a kernel after fc1, not cuBLASLt's tanh GELU
  // epilogue (within 5e-4 of erf's; one more pass over fc1's output when off).
  bool gelu_epilogue = true;
  // KESTREL_PDL: programmatic dependent launch; 0 never (measured slower, docs/gpu.md), 1 inside
  // CUDA graph captures only, 2 always.
  int pdl = 0;
  // KESTREL_GEMV_PREFETCH=1: the GEMV asks L2 for its weight rows before waiting on the kernel
  // before it (matters with PDL only; measured slower).
  bool gemv_prefetch = false;
  // LoRA (lora.cu). KESTREL_LORA_PDL=0: the expand launched plainly after the whole shrink.
  bool lora_pdl = true;
  // KESTREL_LORA_WIDE=0: one output column a thread in the expand always.
  bool lora_wide = true;
  // KESTREL_LORA_ROWS1=0: one-row segments through the 8-row kernels.
  bool lora_rows1 = true;
  // KESTREL_LORA_SHRINK_BLOCKS: the blocks the shrink's split aims for.
  int64_t lora_shrink_blocks = 264;

  // The defaults, with every KESTREL_* variable that is set applied (out-of-range values clamp).
  static Tuning from_environment();
};

// The process's tuning (from_environment() at first use).
const Tuning& tuning();
// Replaces it (tests and benchmarks, between launches; not thread-safe against running launches).
void set_tuning(const Tuning& t);

}  // namespace kestrel::cuda
