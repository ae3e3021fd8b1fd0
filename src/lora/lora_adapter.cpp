#include "lora/lora_adapter.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "core/error.h"

namespace kestrel {

const char* lora_module_name(LoraModule m) {
  switch (m) {
    case LoraModule::kQkv:
      return "query_key_value";
    case LoraModule::kDense:
      return "dense";
    case LoraModule::kFc1:
      return "dense_h_to_4h";
    case LoraModule::kFc2:
      return "dense_4h_to_h";
  }
  return "?";
}

const char* lora_module_path(LoraModule m) {
  switch (m) {
    case LoraModule::kQkv:
      return "self_attention.query_key_value";
    case LoraModule::kDense:
      return "self_attention.dense";
    case LoraModule::kFc1:
      return "mlp.dense_h_to_4h";
    case LoraModule::kFc2:
      return "mlp.dense_4h_to_h";
  }
  return "?";
}

LoraAdapter::LoraAdapter(std::string name, std::string source, int n_ranks, int64_t n_layers)
    : name_(std::move(name)), source_(std::move(source)), n_layers_(n_layers) {
  KESTREL_CHECK(n_ranks >= 1 && n_layers >= 0, "LoraAdapter: ", n_ranks, " ranks, ", n_layers,
                " layers");
  ranks_.assign(n_ranks, std::vector<std::array<LoraLinear, kLoraModules>>(n_layers));
  // FNV-1a over name, a separator, source and the number of this load in the process: a folder
  // loaded again (after an unload, its files perhaps changed) never reuses the KV of the last.
  static std::atomic<uint64_t> loads{0};
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  };
  mix(name_);
  h = (h ^ 0xff) * 1099511628211ull;
  mix(source_);
  mix(std::to_string(++loads));
  cache_key_ = h;
}

const LoraLinear& LoraAdapter::linear(int rank, int64_t layer, LoraModule m) const {
  KESTREL_CHECK(rank >= 0 && rank < n_ranks() && layer >= 0 && layer < n_layers_,
                "LoraAdapter::linear: rank ", rank, " layer ", layer, " outside ", n_ranks(),
                " ranks x ", n_layers_, " layers");
  return ranks_[rank][layer][static_cast<int>(m)];
}

LoraLinear& LoraAdapter::mutable_linear(int rank, int64_t layer, LoraModule m) {
  return const_cast<LoraLinear&>(std::as_const(*this).linear(rank, layer, m));
}

int64_t LoraAdapter::bytes() const {
  int64_t n = 0;
  for (const auto& rank : ranks_)
    for (const auto& layer : rank)
      for (const LoraLinear& l : layer)
        if (l.defined()) n += static_cast<int64_t>(l.a.nbytes() + l.b.nbytes());
  return n;
}

int64_t LoraAdapter::max_rank() const {
  int64_t r = 0;
  for (const auto& rank : ranks_)
    for (const auto& layer : rank)
      for (const LoraLinear& l : layer)
        if (l.defined()) r = std::max(r, l.a.dim(0));
  return r;
}

}  // namespace kestrel
