// Decode steps as CUDA graphs: pads the step to its bucket, packs every input (with the LoRA
// segment tables of its adapters) into one host buffer, copies it to the graph's static device
// buffer in one transfer, and replays.
#include "model/decode_graphs.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "core/error.h"
#include "core/logging.h"
#include "model/falcon_lora.h"
#include "model/falcon_model.h"

namespace kestrel {
namespace {

size_t align_up(size_t n) {
  return (n + 255) / 256 * 256;
}

template <typename T>
T* at(std::vector<uint8_t>& buf, size_t off) {
  return reinterpret_cast<T*>(buf.data() + off);
}

}  // namespace

int64_t DecodeGraphs::batch_bucket(int64_t n) {
  for (int64_t b : {1, 2, 4, 8, 16, 24, 32, 48, 64})
    if (n <= b) return b;
  return (n + 31) / 32 * 32;
}

int64_t DecodeGraphs::width_bucket(int64_t max_blocks) {
  int64_t w = 16;
  while (w < max_blocks) w *= 2;
  return w;
}

bool DecodeGraphs::eligible(const FalconModel& m, const ForwardBatch& b) {
  const int64_t n = b.n_seqs();
  if (m.device_ != Device::kCuda || m.tp_.comm || m.group_ || b.skip_lm_head) return false;
  if (n == 0 || n > kMaxBatch || b.n_tokens() != n) return false;
  for (const LoraAdapter* a : b.adapters)
    if (a && (a->n_ranks() != 1 || a->max_rank() > kMaxLoraRank)) return false;
  for (int64_t s = 0; s <= n; ++s)
    if (b.cu_seqlens[s] != s) return false;
  if (!b.lm_head_indices.empty()) {
    if (static_cast<int64_t>(b.lm_head_indices.size()) != n) return false;
    for (int64_t i = 0; i < n; ++i)
      if (b.lm_head_indices[i] != i) return false;
  }
  return true;
}

int DecodeGraphs::lora_bound(const ForwardBatch& b) {
  int64_t r = 0;
  for (const LoraAdapter* a : b.adapters)
    if (a) r = std::max(r, a->max_rank());
  if (r == 0) return 0;
  int bound = 16;
  while (bound < r) bound *= 2;
  return bound;
}

void DecodeGraphs::layout(Graph& g, int64_t half, int64_t n_layers) const {
  const size_t n = static_cast<size_t>(g.n_seqs);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at_off = off;
    off += align_up(bytes);
    return at_off;
  };
  g.off_ids = take(n * 4);
  g.off_cu = take((n + 1) * 4);
  g.off_kv = take(n * 4);
  g.off_tables = take(n * static_cast<size_t>(g.width) * 4);
  g.off_slots = take(n * 8);
  g.off_cos = take(n * static_cast<size_t>(half) * 4);
  g.off_sin = take(n * static_cast<size_t>(half) * 4);
  if (g.lora_r > 0)
    g.off_lora =
        take(static_cast<size_t>(n_layers) * kLoraModules * n * sizeof(ops::LoraTableEntry));
  g.host.assign(off, 0);
}

// Real rows first; padding rows: id 0, kv_len 0 (no keys read), slot -1 (kv_write skips it),
// cos 1 / sin 0. b may have no sequences (the capture's dummy step).
void DecodeGraphs::pack(const FalconModel& m, const ForwardBatch& b, Graph& g) const {
  const int64_t n = b.n_seqs(), bn = g.n_seqs, w = g.width, half = m.config_.head_dim / 2;
  std::fill(g.host.begin(), g.host.end(), 0);
  auto* ids = at<int32_t>(g.host, g.off_ids);
  auto* cu = at<int32_t>(g.host, g.off_cu);
  auto* kv = at<int32_t>(g.host, g.off_kv);
  auto* tables = at<int32_t>(g.host, g.off_tables);
  auto* slots = at<int64_t>(g.host, g.off_slots);
  auto* cos = at<float>(g.host, g.off_cos);
  auto* sin = at<float>(g.host, g.off_sin);
  for (int64_t s = 0; s <= bn; ++s) cu[s] = static_cast<int32_t>(s);
  for (int64_t s = 0; s < bn; ++s) {
    const bool real = s < n;
    ids[s] = real ? b.input_ids[s] : 0;
    kv[s] = real ? b.kv_lens[s] : 0;
    slots[s] = real ? b.slots[s] : -1;
    if (real) std::copy_n(b.block_tables.begin() + s * b.max_blocks, b.max_blocks, tables + s * w);
  }
  if (!m.config_.alibi) {
    std::fill(cos, cos + bn * half, 1.0f);
    if (n > 0) {
      std::vector<float> cos_h, sin_h;
      m.rope_tables(b, cos_h, sin_h);
      std::copy(cos_h.begin(), cos_h.end(), cos);
      std::copy(sin_h.begin(), sin_h.end(), sin);
    }
  }
  if (g.lora_r > 0) {  // every entry rewritten: none left from an earlier step's adapters
    const FalconConfig& c = m.config_;
    const std::array<int64_t, kLoraModules> in_of = {c.hidden_size, c.n_heads * c.head_dim,
                                                     c.hidden_size, c.ffn_hidden_size};
    LoraPlan::pack_tables(b, c.n_layers, static_cast<int>(bn), in_of,
                          at<ops::LoraTableEntry>(g.host, g.off_lora));
  }
}

void DecodeGraphs::capture(const FalconModel& m, KvCache& cache, Graph& g) {
  const FalconConfig& c = m.config_;
  const int64_t bn = g.n_seqs, half = c.head_dim / 2;
  layout(g, half, c.n_layers);
  g.dev = Tensor::empty(DType::kU8, {static_cast<int64_t>(g.host.size())}, Device::kCuda);
  pack(m, ForwardBatch{}, g);  // every row padding: the eager warm-up run touches no cache slot
  Tensor host = Tensor::borrow(g.host.data(), DType::kU8, {static_cast<int64_t>(g.host.size())});
  ops::copy_to_device(host, g.dev);

  uint8_t* base = g.dev.data<uint8_t>();
  auto view = [&](size_t off, DType dt, Shape shape) {
    return Tensor::borrow(base + off, dt, std::move(shape), Device::kCuda);
  };
  FalconModel::StepTensors in;
  in.ids = view(g.off_ids, DType::kI32, {bn});
  in.cu_q = view(g.off_cu, DType::kI32, {bn + 1});
  in.kv_lens = view(g.off_kv, DType::kI32, {bn});
  in.tables = view(g.off_tables, DType::kI32, {bn, g.width});
  in.slots = view(g.off_slots, DType::kI64, {bn});
  if (!c.alibi) {
    in.cos = view(g.off_cos, DType::kF32, {bn, half});
    in.sin = view(g.off_sin, DType::kF32, {bn, half});
  }
  const ForwardBatch none;
  // The capture's tables are all unused entries (the dummy step has no rows): it reads no adapter.
  const LoraPlan lora =
      g.lora_r > 0 ? LoraPlan(base + g.off_lora, c.n_layers, static_cast<int>(bn), g.lora_r)
                   : LoraPlan(none, 0, c.n_layers);
  // The attention grid and its split count follow this bound; the kernels read each
  // sequence's kv_len on the device.
  const int32_t max_kv_len = static_cast<int32_t>(g.width * cache.block_size());
  Tensor out;
  g.graph = ops::capture_graph(
      Device::kCuda,
      [&] { return m.forward_layers(none, in, max_kv_len, /*max_q_len=*/1, lora, cache); }, &out);
  // The pool keeps the block; graphs replay one at a time, so the next capture may share it.
  g.logits = Tensor::borrow(out.raw(), DType::kF32, out.shape(), Device::kCuda);
  ++captures_;
  spdlog::debug(
      "captured the decode graph of {} sequences, {} blocks wide, LoRA rank bound {} ({:.1f} MiB "
      "in the graph pool)",
      bn, g.width, g.lora_r, ops::graph_pool_bytes(Device::kCuda) / 1048576.0);
}

Tensor DecodeGraphs::run(const FalconModel& m, const ForwardBatch& b, KvCache& cache) {
  std::lock_guard<std::mutex> lock(mu_);
  const void* id = cache.k(0).raw();
  if (id != cache_id_) {  // another cache: the graphs address the old one's layers
    graphs_.clear();
    cache_id_ = id;
  }
  const int64_t n = b.n_seqs();
  const std::tuple<int64_t, int64_t, int> key{batch_bucket(n), width_bucket(b.max_blocks),
                                              lora_bound(b)};
  Graph& g = graphs_[key];
  if (!g.graph) {
    g.n_seqs = std::get<0>(key);
    g.width = std::get<1>(key);
    g.lora_r = std::get<2>(key);
    capture(m, cache, g);
  }
  pack(m, b, g);
  Tensor host = Tensor::borrow(g.host.data(), DType::kU8, {static_cast<int64_t>(g.host.size())});
  ops::copy_to_device(host, g.dev);
  g.graph->replay();
  ++replays_;
  if (g.lora_r > 0) ++lora_replays_;
  return g.logits.rows(0, n);
}

}  // namespace kestrel
