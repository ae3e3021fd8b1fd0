// CUDA graphs for decode steps (docs/gpu.md, "CUDA graphs"): one graph per (batch-size bucket,
// block-table width, LoRA rank bound) of a model over one KV cache, captured at the first step of
// that shape and replayed for every later one, its inputs copied into the graph's static buffer
// first. LoRA steps carry their adapters' segment tables in that buffer (docs/lora.md).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "core/tensor.h"
#include "kv/kv_cache.h"
#include "model/forward_batch.h"

namespace kestrel {

class FalconModel;

class DecodeGraphs {
 public:
  // Batch sizes up to this replay graphs; larger steps run eagerly.
  static constexpr int64_t kMaxBatch = 256;
  // The bucket a step of n sequences pads to: 1, 2, 4, 8, 16, 24, 32, 48, 64, then steps of 32.
  static int64_t batch_bucket(int64_t n_seqs);
  // The block-table width a step of max_blocks pads to: a power of two, at least 16.
  static int64_t width_bucket(int64_t max_blocks);
  // LoRA ranks up to this replay graphs (the CUDA kernels' bound).
  static constexpr int kMaxLoraRank = 128;
  // Whether the step can replay a graph: every sequence decodes one token and gets logits
  // (lm_head_indices empty or 0..n-1), no tensor parallelism, at most kMaxBatch sequences,
  // adapters (if any) of rank <= kMaxLoraRank.
  static bool eligible(const FalconModel& model, const ForwardBatch& b);
  // The LoRA rank bound of a step's graph: 0 without adapters, else 16, 32, 64 or 128 (the
  // smallest at least the largest rank of the step's adapters).
  static int lora_bound(const ForwardBatch& b);

  // Runs an eligible step through its bucket's graph (capturing it first). Returns logits
  // [n_seqs, vocab] F32 on the device, valid until the next forward of the model.
  Tensor run(const FalconModel& model, const ForwardBatch& b, KvCache& cache);

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  int64_t lora_replays() const { return lora_replays_; }  // replays of steps with adapters

 private:
  // One captured step: n_seqs rows (the real ones first, then padding that writes no cache
  // slot and attends to nothing), block tables `width` wide; lora_r > 0: LoRA deltas from
  // n_layers x 4 tables of n_seqs ops::LoraTableEntry at off_lora, ranks <= lora_r.
  struct Graph {
    int64_t n_seqs = 0, width = 0;
    int lora_r = 0;
    std::vector<uint8_t> host;  // the packed inputs, laid out as `dev`
    Tensor dev;                 // U8 on the device: the static input buffer
    size_t off_ids = 0, off_cu = 0, off_kv = 0, off_tables = 0, off_slots = 0, off_cos = 0,
           off_sin = 0, off_lora = 0;
    std::unique_ptr<ops::DeviceGraph> graph;
    Tensor logits;  // [n_seqs, vocab] F32, borrowed from the graph pool
  };
  void layout(Graph& g, int64_t half, int64_t n_layers) const;
  void pack(const FalconModel& model, const ForwardBatch& b, Graph& g) const;
  void capture(const FalconModel& model, KvCache& cache, Graph& g);

  std::mutex mu_;
  std::map<std::tuple<int64_t, int64_t, int>, Graph> graphs_;
  const void* cache_id_ = nullptr;  // the K cache of layer 0 the graphs write to
  int64_t captures_ = 0, replays_ = 0, lora_replays_ = 0;
};

}  // namespace kestrel
