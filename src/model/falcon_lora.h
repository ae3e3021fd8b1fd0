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
  bool empty() const { return empty_; }
  // out += the deltas of module m of `layer` for x (a no-op without segments).
  void add(int64_t layer, LoraModule m, const Tensor& x, Tensor& out) const;

 private:
  bool empty_ = true;
  std::vector<std::array<std::vector<ops::LoraSegment>, kLoraModules>> segments_;
};

}  // namespace kestrel
