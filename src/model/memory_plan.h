// Sizing the paged KV cache from the device memory left after the weights and
// the activation workspace (vLLM's profile run): one forward of the largest
// step the scheduler may issue measures the workspace, and the cache gets what
// remains of --gpu-memory-fraction of the device.
#pragma once

#include <cstdint>

namespace kestrel {

class FalconModel;

struct KvPlanOptions {
  int64_t block_size = 16;
  int64_t max_batch_prefill_tokens = 4096;  // tokens of the largest step
  int64_t max_running_seqs = 128;           // logits rows of the largest decode step
  int64_t max_input_length = 1024;          // longest prompt (caps the profile's sequences)
  double gpu_memory_fraction = 0.9;         // of the device's total memory
  int64_t kv_cache_memory = 0;              // bytes; > 0: this instead of the fraction
  // Kept free beside the KV cache for the LoRA adapters a server loads later (CUDA, when the
  // cache is sized from the fraction; docs/lora.md "Adapter store").
  int64_t reserved_bytes = 0;
};

struct KvPlan {
  int64_t num_blocks = 0;
  int64_t kv_bytes = 0;          // num_blocks * bytes per block
  int64_t bytes_per_block = 0;   // all layers, K and V
  int64_t total = 0;             // device memory
  int64_t used_before = 0;       // in use on the device after loading (weights, context, others)
  int64_t activation_bytes = 0;  // peak workspace of the profiled step
  int64_t margin_bytes = 0;      // kept free for fragmentation and library workspaces
  int64_t reserved_bytes = 0;    // kept free for LoRA adapters (KvPlanOptions::reserved_bytes)
};

// On the CPU only kv_cache_memory counts (it must be set). On CUDA the profile
// step runs once (its temporary cache is freed after). Throws kestrel::Error
// when nothing is left for one block, naming the sizes.
KvPlan plan_kv_cache(const FalconModel& model, const KvPlanOptions& options);

// Device bytes of one LoRA adapter of rank r on all four modules (query_key_value, dense,
// dense_h_to_4h, dense_4h_to_h) of every layer, in the model's weight dtype, over its
// tensor-parallel ranks (A or B replicated where the base layer's sharding says so, padding
// rows aside): the unit of the adapter store's default memory reserve.
int64_t lora_adapter_bytes(const FalconModel& model, int64_t r);

}  // namespace kestrel
