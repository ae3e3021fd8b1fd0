// FalconModel: the weights of a Falcon / RefinedWeb checkpoint on one device
// and its forward pass, written once against backend/ops.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/falcon_config.h"
#include "kv/kv_cache.h"
#include "lora/lora_adapter.h"
#include "lora/merge.h"
#include "model/forward_batch.h"

namespace kestrel {

class WeightStore;
class Communicator;
struct TpGroup;
class LoraPlan;
class DecodeGraphs;

// How the linears' weights are held (--quantize) and how their FP8 products round activations.
struct WeightQuant {
  // query_key_value, dense, dense_h_to_4h and dense_4h_to_h as FP8 E4M3 with one F32 scale per
  // output row (ops::quantize_fp8); embeddings, norms and the lm_head stay as they are.
  bool fp8 = false;
  // With fp8, activations rounded to FP8 per row before every product (ops::LinearEpilogue): what
  // the CUDA FP8 GEMM computes; without it the CPU never rounds them and CUDA only from 9 rows.
  bool fp8_activations = false;
};

struct FalconLayerWeights {
  Tensor ln_attn_w, ln_attn_b;  // input_layernorm, or ln_attn
  Tensor ln_mlp_w, ln_mlp_b;    // ln_mlp (two norms) or post_attention_layernorm (sequential)
  Tensor qkv_w, qkv_b;          // [(n_heads + 2 n_kv_heads) d, hidden]
  Tensor dense_w, dense_b;      // [hidden, n_heads d]
  Tensor fc1_w, fc1_b;          // dense_h_to_4h [ffn, hidden]
  Tensor fc2_w, fc2_b;          // dense_4h_to_h [hidden, ffn]
  // With WeightQuant::fp8 the four weights above are F8_E4M3 and these their F32 row scales.
  Tensor qkv_s, dense_s, fc1_s, fc2_s;
};

class FalconModel {
 public:
  // Loads DIR (config.json + safetensors), validating every tensor against
  // the config. Throws kestrel::Error naming the file and the reason.
  static FalconModel load(const std::string& dir, Device device = Device::kCpu,
                          int tensor_parallel = 1, const WeightQuant& quant = {});
  // Tensor parallelism over N ranks (falcon_model_tp.cpp): rank r reads only its slice of every
  // tensor (parallel/sharding.h); CPU ranks are threads with the in-process communicator, CUDA
  // ranks use NCCL. N is checked against the heads and the visible GPUs before any weight is
  // read. Unlike load(dir, device, 1), N = 1 here still sets up the communicator and calls the
  // collectives (the same code path as N > 1).
  // With --quantize fp8 each rank quantizes its slices: column-parallel rows keep their own
  // scales, a row-parallel slice takes the scales of its whole rows (the single-rank codes).
  static FalconModel load_parallel(const std::string& dir, Device device, int tensor_parallel,
                                   const WeightQuant& quant = {});
  static FalconModel from_store_parallel(const FalconConfig& config, const WeightStore& store,
                                         Device device, int tensor_parallel,
                                         const WeightQuant& quant = {});
  static FalconModel from_store(const FalconConfig& config, const WeightStore& store, Device device,
                                const WeightQuant& quant = {});
  // One rank of tensor parallelism across processes (--nnodes; parallel/process_group.h): rank
  // comm->rank() of comm->size(), its slice read from DIR. Every process runs the same forwards;
  // each gets the whole logits (the lm_head's vocabulary shards are all-gathered).
  static FalconModel load_process_rank(const std::string& dir, Device device,
                                       std::shared_ptr<Communicator> comm,
                                       const WeightQuant& quant = {});
  // Random weights at the config's shapes, drawn on the device (benchmarks:
  // no files written or read).
  static FalconModel random(const FalconConfig& config, Device device, uint64_t seed = 0,
                            const WeightQuant& quant = {});

  const FalconConfig& config() const { return config_; }
  Device device() const { return device_; }
  DType act_dtype() const { return act_dtype_; }
  const WeightQuant& quant() const { return quant_; }
  // The dtype of the linears' weights (F8_E4M3 with --quantize fp8, else act_dtype()) and the
  // device bytes every weight takes (scales included).
  DType linear_weight_dtype() const;
  int64_t weight_bytes() const;
  // Ranks of tensor parallelism (1 without it).
  int tensor_parallel() const { return tp_.size; }
  // Checkpoint bytes each rank read (its share of the weights); one entry without parallelism.
  std::vector<int64_t> rank_weight_bytes() const;
  // Wall seconds rank 0 spent in collectives so far (0 without parallelism), for benchmarks.
  double collective_seconds() const;
  // --kv-cache-dtype: the caches make_kv_cache() makes hold K and V as act_dtype() (the default)
  // or as FP8 E4M3 under a scale of 1 (docs/fp8.md). Throws for other dtypes.
  void set_kv_cache_dtype(DType dtype);
  DType kv_cache_dtype() const { return kv_fp8_ ? DType::kF8E4M3 : act_dtype_; }
  // KV cache bytes of one block over all layers and every rank's K/V heads.
  int64_t kv_bytes_per_block(int64_t block_size) const;

  // ALiBi models: the slopes of this model's query heads (alibi_slopes(n_heads,
  // 0, n_heads) from load; a tensor-parallel rank sets those of its own range,
  // and tests set wrong ones). Throws unless the config has alibi and there is
  // one slope per head.
  void set_alibi_slopes(const std::vector<float>& slopes);

  // LoRA (docs/lora.md): reads the PEFT adapter folder DIR, validates it against this model
  // (every key, shape and config field; errors name the tensor and both shapes) and puts A and B
  // on the model's device, sharded per rank like the base layers. Thread-safe: may run off the
  // step loop's thread while forwards run.
  std::shared_ptr<const LoraAdapter> load_adapter(const std::string& dir,
                                                  const std::string& name) const;
  // The same folder read and validated as load_adapter does, its A and B kept on the host in F32
  // (unsharded) with each module's scale: the input of merge_adapters (merged_adapters).
  HostLoraAdapter read_host_adapter(const std::string& dir) const;
  // A merged adapter (merge_adapters' result, made from adapters of this model) on the model's
  // device, sharded per rank like a loaded one; source "" (it has no folder). Checks every
  // module's shapes against the model.
  std::shared_ptr<const LoraAdapter> adapter_from_merged(const MergedLora& merged,
                                                         const std::string& name) const;
  // Random adapter of rank r on `modules` (benchmarks), drawn on the device.
  std::shared_ptr<const LoraAdapter> random_adapter(const std::string& name, int64_t r,
                                                    const std::vector<LoraModule>& modules,
                                                    uint64_t seed) const;

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

  // CUDA graphs for decode steps (decode_graphs.h; on by default on CUDA): a step where every
  // sequence decodes one token and every row gets logits, without LoRA or tensor parallelism,
  // replays the graph of its batch-size bucket. Its logits then stay valid until the next
  // forward of this model (and of its copies, which share the graphs). Off: every step eager.
  void set_cuda_graphs(bool on);
  bool cuda_graphs() const { return cuda_graphs_ && graphs_ != nullptr; }
  struct GraphStats {
    int64_t captures = 0, replays = 0;
    int64_t pool_bytes = 0;  // device memory the graphs hold (all models of the process)
  };
  GraphStats graph_stats() const;

 private:
  // load_fp8 (optional): a linear's weight as the checkpoint's FP8 codes and their scales
  // (false: the checkpoint holds it at full width).
  using LoadFp8 = std::function<bool(const std::string& name, Tensor& q, Tensor& scale)>;
  static FalconModel build(const FalconConfig& config, Device device, bool has_lm_head,
                           const std::function<Tensor(const std::string&)>& load,
                           const WeightQuant& quant = {}, const LoadFp8& load_fp8 = nullptr);
  static FalconModel build_rank(const FalconConfig& config, const WeightStore& store, Device device,
                                bool has_lm_head, std::shared_ptr<Communicator> comm,
                                const WeightQuant& quant);
  void check_batch(const ForwardBatch& batch, const KvCache& cache) const;
  void rope_tables(const ForwardBatch& batch, std::vector<float>& cos,
                   std::vector<float>& sin) const;
  // One step's inputs on the device (cos / sin undefined for ALiBi, lm_rows undefined: every row).
  struct StepTensors {
    Tensor ids, slots, cu_q, kv_lens, tables, cos, sin, lm_rows;
    bool skip_lm_head = false;
  };
  Tensor forward_layers(const ForwardBatch& batch, const StepTensors& in, int32_t max_kv_len,
                        int32_t max_q_len, const LoraPlan& lora, KvCache& cache) const;
  friend class DecodeGraphs;

  // Tensor parallelism (falcon_model_tp.cpp).
  Tensor forward_group(const ForwardBatch& batch, KvCache& cache) const;
  KvCache make_group_kv_cache(int64_t num_blocks, int64_t block_size) const;
  void embed_sharded(const ForwardBatch& batch, Tensor& x) const;
  void all_reduce(Tensor& t) const;
  Tensor lm_head_sharded(const Tensor& h) const;
  struct TpRank {
    int rank = 0, size = 1;
    std::shared_ptr<Communicator> comm;      // set on a rank of a tensor-parallel model
    int64_t vocab_begin = 0, vocab_end = 0;  // rows of the vocabulary it holds
    int64_t weight_bytes = 0;                // checkpoint bytes it read
  };

  FalconConfig config_;  // a rank's own shares of heads and MLP width (see FalconConfig)
  Device device_ = Device::kCpu;
  DType act_dtype_ = DType::kF32;
  WeightQuant quant_;
  bool kv_fp8_ = false;
  Tensor word_embeddings_;  // [vocab, hidden]
  std::vector<FalconLayerWeights> layers_;
  Tensor ln_f_w_, ln_f_b_;
  Tensor lm_head_;       // [vocab, hidden]; shares word_embeddings_ when tied
  Tensor alibi_slopes_;  // [n_heads] F32 on the device (ALiBi models only)
  // Tensor parallelism: on a rank, word_embeddings_ holds its vocabulary rows plus one zero row
  // (out-of-range ids look it up) and lm_head_ its rows padded to the largest rank's count.
  TpRank tp_;
  std::shared_ptr<const TpGroup> group_;  // the N-rank model: its ranks (null on a rank)
  std::shared_ptr<DecodeGraphs> graphs_;  // CUDA models: the decode graphs (decode_graphs.h)
  bool cuda_graphs_ = true;
};

}  // namespace kestrel
