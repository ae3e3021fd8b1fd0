// The KV cache plan: a profile forward of the largest step, then the cache
// from what is left of the memory budget.
#include "model/memory_plan.h"

#include <algorithm>

#include "backend/ops.h"
#include "core/error.h"
#include "core/logging.h"
#include "model/falcon_model.h"

namespace kestrel {
namespace {

constexpr double kGiB = 1073741824.0;

// Peak bytes allocated by one forward of max_batch_prefill_tokens prompt
// tokens (prompts of at most max_input_length) with logits for
// max(n_seqs, max_running_seqs) rows.
int64_t profile_activations(const FalconModel& model, const KvPlanOptions& o) {
  const Device dev = model.device();
  const int64_t n_tokens = o.max_batch_prefill_tokens;
  const int64_t max_len = std::max<int64_t>(
      1, std::min({o.max_input_length, n_tokens, model.config().max_position_embeddings}));
  ForwardBatch b;
  b.cu_seqlens.push_back(0);
  std::vector<int64_t> lens;
  for (int64_t left = n_tokens; left > 0; left -= max_len) lens.push_back(std::min(left, max_len));
  int64_t max_blocks = (max_len + o.block_size - 1) / o.block_size;
  int64_t blocks = 0;
  for (int64_t len : lens) {
    for (int64_t p = 0; p < len; ++p) {
      b.input_ids.push_back(static_cast<int32_t>(p % model.config().vocab_size));
      b.positions.push_back(static_cast<int32_t>(p));
      b.slots.push_back(blocks * o.block_size + p);
    }
    b.cu_seqlens.push_back(static_cast<int32_t>(b.input_ids.size()));
    b.kv_lens.push_back(static_cast<int32_t>(len));
    const int64_t nb = (len + o.block_size - 1) / o.block_size;
    for (int64_t j = 0; j < max_blocks; ++j)
      b.block_tables.push_back(static_cast<int32_t>(j < nb ? blocks + j : 0));
    blocks += nb;
  }
  b.max_blocks = static_cast<int32_t>(max_blocks);
  const int64_t n_rows = std::min<int64_t>(
      n_tokens, std::max<int64_t>(static_cast<int64_t>(lens.size()), o.max_running_seqs));
  for (int64_t r = 0; r < n_rows; ++r) b.lm_head_indices.push_back(static_cast<int32_t>(r));

  ops::synchronize(dev);
  {
    KvCache cache = model.make_kv_cache(blocks, o.block_size);
    ops::reset_peak_memory(dev);
    const int64_t with_cache = ops::device_memory(dev).in_use;
    Tensor logits = model.forward_device(b, cache);
    ops::synchronize(dev);
    const int64_t peak = ops::device_memory(dev).peak_in_use;
    (void)logits;
    spdlog::info("profile step: {} tokens in {} prompts, {} logits rows: {:.2f} GiB of activations",
                 n_tokens, lens.size(), n_rows, (peak - with_cache) / kGiB);
    return std::max<int64_t>(0, peak - with_cache);
  }
}

}  // namespace

KvPlan plan_kv_cache(const FalconModel& model, const KvPlanOptions& o) {
  KESTREL_CHECK(o.block_size >= 1, "--block-size must be positive, got ", o.block_size);
  const FalconConfig& c = model.config();
  KvPlan plan;
  plan.bytes_per_block = model.kv_bytes_per_block(o.block_size);
  const Device dev = model.device();
  if (o.kv_cache_memory > 0) {
    plan.kv_bytes = o.kv_cache_memory;
  } else {
    KESTREL_CHECK(dev == Device::kCuda,
                  "the KV cache size on the CPU needs --kv-cache-memory (bytes, e.g. 256MiB)");
    KESTREL_CHECK(o.gpu_memory_fraction > 0 && o.gpu_memory_fraction <= 1,
                  "--gpu-memory-fraction must be in (0, 1], got ", o.gpu_memory_fraction);
    // The forward's peak, plus the GPU sampler's scratch for a full decode batch, plus (CUDA
    // graphs on) the graph pool: a decode step's temporaries at its largest bucket, bounded by
    // the profiled step's.
    const int64_t profiled = profile_activations(model, o);
    plan.activation_bytes =
        profiled + (model.cuda_graphs() ? profiled : 0) +
        static_cast<int64_t>(ops::sampling_workspace_bytes(dev, o.max_running_seqs, c.vocab_size));
    ops::release_cached_memory(dev);
    const ops::DeviceMemory m = ops::device_memory(dev);
    plan.total = m.total;
    plan.used_before = m.total - m.free;
    plan.margin_bytes = int64_t{512} << 20;
    const int64_t budget =
        static_cast<int64_t>(o.gpu_memory_fraction * static_cast<double>(m.total));
    plan.reserved_bytes = std::max<int64_t>(0, o.reserved_bytes);
    plan.kv_bytes =
        budget - plan.used_before - plan.activation_bytes - plan.margin_bytes - plan.reserved_bytes;
    KESTREL_CHECK(plan.kv_bytes >= plan.bytes_per_block,
                  "no device memory left for the KV cache: ", o.gpu_memory_fraction, " of ",
                  m.total / kGiB, " GiB is ", budget / kGiB, " GiB, ", plan.used_before / kGiB,
                  " GiB are in use after loading, ", plan.activation_bytes / kGiB,
                  " GiB go to activations and ", plan.reserved_bytes / kGiB,
                  " GiB are reserved for LoRA adapters; raise --gpu-memory-fraction or lower "
                  "--max-batch-prefill-tokens (or --max-loaded-adapters / --adapter-memory)");
  }
  plan.num_blocks = plan.kv_bytes / plan.bytes_per_block;
  KESTREL_CHECK(plan.num_blocks >= 1, "the KV cache holds no block: ", plan.kv_bytes,
                " bytes for blocks of ", plan.bytes_per_block, " bytes; raise --kv-cache-memory");
  plan.kv_bytes = plan.num_blocks * plan.bytes_per_block;
  return plan;
}

int64_t lora_adapter_bytes(const FalconModel& model, int64_t r) {
  const FalconConfig& c = model.config();
  const int64_t n = model.tensor_parallel();
  // Per layer: qkv A [r, hidden] on every rank + B [qkv_out, r] split; dense A [r, heads * d]
  // split + B [hidden, r] on every rank; dense_h_to_4h like qkv; dense_4h_to_h like dense.
  const int64_t per_layer = r * (c.qkv_out_dim() + c.n_heads * c.head_dim + 2 * c.ffn_hidden_size +
                                 4 * n * c.hidden_size);
  return c.n_layers * per_layer *
         static_cast<int64_t>(dtype_size(ops::weight_dtype(model.device())));
}

}  // namespace kestrel
