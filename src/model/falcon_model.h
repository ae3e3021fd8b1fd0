// FalconModel: the weights of a Falcon / RefinedWeb checkpoint on one device
// and its forward pass, written once against backend/ops.h.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/falcon_config.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"

namespace kestrel {

class WeightStore;

struct FalconLayerWeights {
  Tensor ln_attn_w, ln_attn_b;  // input_layernorm, or ln_attn
  Tensor ln_mlp_w, ln_mlp_b;    // ln_mlp (two norms) or post_attention_layernorm (sequential)
  Tensor qkv_w, qkv_b;          // [(n_heads + 2 n_kv_heads) d, hidden]
  Tensor dense_w, dense_b;      // [hidden, n_heads d]
  Tensor fc1_w, fc1_b;          // dense_h_to_4h [ffn, hidden]
  Tensor fc2_w, fc2_b;          // dense_4h_to_h [hidden, ffn]
};

class FalconModel {
 public:
  // Loads DIR (config.json + safetensors), validating every tensor against
  // the config. Throws kestrel::Error naming the file and the reason.
  static FalconModel load(const std::string& dir, Device device = Device::kCpu);
  static FalconModel from_store(const FalconConfig& config, const WeightStore& store,
                                Device device);
  // Random weights at the config's shapes, drawn on the device (benchmarks:
  // no files written or read).
  static FalconModel random(const FalconConfig& config, Device device, uint64_t seed = 0);

  const FalconConfig& config() const { return config_; }
  Device device() const { return device_; }
  DType act_dtype() const { return act_dtype_; }

  // A KV cache shaped for this model.
  KvCache make_kv_cache(int64_t num_blocks, int64_t block_size) const;

  // Runs the batch: new K/V go to their slots, attention reads the pages.
  // Returns logits [n_out, vocab] F32-on-CPU for the lm_head_indices rows
  // (every row when empty), or the final hidden states [n_out, hidden] with
  // skip_lm_head.
  Tensor forward(const ForwardBatch& batch, KvCache& cache) const;
  // The same, leaving the result on the model's device: logits F32, hidden
  // states in act_dtype() (for sampling on the GPU and benchmarks).
  Tensor forward_device(const ForwardBatch& batch, KvCache& cache) const;

 private:
  static FalconModel build(const FalconConfig& config, Device device, bool has_lm_head,
                           const std::function<Tensor(const std::string&)>& load);
  void check_batch(const ForwardBatch& batch, const KvCache& cache) const;
  void rope_tables(const ForwardBatch& batch, std::vector<float>& cos,
                   std::vector<float>& sin) const;

  FalconConfig config_;
  Device device_ = Device::kCpu;
  DType act_dtype_ = DType::kF32;
  Tensor word_embeddings_;  // [vocab, hidden]
  std::vector<FalconLayerWeights> layers_;
  Tensor ln_f_w_, ln_f_b_;
  Tensor lm_head_;  // [vocab, hidden]; shares word_embeddings_ when tied
};

}  // namespace kestrel
