// The LoRA side of FalconModel's forward pass (falcon_lora.cpp): the segments of one batch, built
// once per forward, and the check of ForwardBatch::adapters. See docs/lora.md.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "core/tensor.h"
#include "lora/lora_adapter.h"
#include "model/forward_batch.h"

namespace kestrel {

// Throws unless adapters is empty or holds one entry per sequence, each null or made for a model
// of n_ranks ranks and n_layers layers. Runs before any rank starts (a rank that threw inside
// the forward would leave the others waiting on a collective).
void check_lora_batch(const ForwardBatch& b, int n_ranks, int64_t n_layers);

// Per layer and module, the ops::lora_add segments of tensor-parallel rank `rank`: consecutive
// sequences with the same non-null adapter make one segment of their token rows; adapters that do
// not target the module or the layer are left out.
class LoraPlan {
 public:
  LoraPlan(const ForwardBatch& b, int rank, int64_t n_layers);
  // A decode graph's plan (decode_graphs.h): device-side tables at `tables`, n_layers x
  // kLoraModules tables of `entries` ops::LoraTableEntry each (layer-major), ranks <= max_r;
  // every add launches ops::lora_add_table on its table, whatever the table holds.
  LoraPlan(const void* tables, int64_t n_layers, int entries, int max_r);
  bool empty() const { return empty_; }
  // out += the deltas of module m of `layer` for x (a no-op without segments).
  void add(int64_t layer, LoraModule m, const Tensor& x, Tensor& out) const;

  // Fills the host tables of a decode graph (the layout above) for the one-token rows of b
  // (model rank 0): one entry per row whose adapter targets the module, then unused entries.
  static void pack_tables(const ForwardBatch& b, int64_t n_layers, int entries,
                          const std::array<int64_t, kLoraModules>& in_of,
                          ops::LoraTableEntry* tables);

 private:
  bool empty_ = true;
  std::vector<std::array<std::vector<ops::LoraSegment>, kLoraModules>> segments_;
  const uint8_t* tables_ = nullptr;  // graph plans: the device tables
  int entries_ = 0, max_r_ = 0;
};

}  // namespace kestrel
