// LoRA on FalconModel: FalconModel::load_adapter (a PEFT folder validated against the model and
// sharded per tensor-parallel rank like the base layers), random_adapter (benchmarks) and the
// per-forward segment plan. See docs/lora.md.
#include "model/falcon_lora.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/falcon_model.h"
#include "parallel/sharding.h"

namespace kestrel {
namespace {

namespace fs = std::filesystem;

constexpr const char* kKeyPrefix = "base_model.model.transformer.h.";

std::string tensor_key(int64_t layer, LoraModule m, bool is_b) {
  return kKeyPrefix + std::to_string(layer) + "." + lora_module_path(m) +
         (is_b ? ".lora_B.weight" : ".lora_A.weight");
}

// Parses "base_model.model.transformer.h.N.<module>.lora_<A|B>.weight".
bool parse_key(const std::string& key, int64_t* layer, LoraModule* m, bool* is_b) {
  const std::string prefix = kKeyPrefix;
  if (key.compare(0, prefix.size(), prefix) != 0) return false;
  size_t pos = prefix.size(), end = pos;
  while (end < key.size() && std::isdigit(static_cast<unsigned char>(key[end]))) ++end;
  if (end == pos || end >= key.size() || key[end] != '.' || end - pos > 9) return false;
  *layer = std::stoll(key.substr(pos, end - pos));
  const std::string rest = key.substr(end + 1);
  for (int i = 0; i < kLoraModules; ++i) {
    const auto mod = static_cast<LoraModule>(i);
    for (bool b : {false, true}) {
      if (rest == std::string(lora_module_path(mod)) + (b ? ".lora_B.weight" : ".lora_A.weight")) {
        *m = mod;
        *is_b = b;
        return true;
      }
    }
  }
  return false;
}

// The full (unsharded) [out, in] of module m of the base model.
std::pair<int64_t, int64_t> module_dims(const FalconConfig& c, LoraModule m) {
  switch (m) {
    case LoraModule::kQkv:
      return {c.qkv_out_dim(), c.hidden_size};
    case LoraModule::kDense:
      return {c.hidden_size, c.n_heads * c.head_dim};
    case LoraModule::kFc1:
      return {c.ffn_hidden_size, c.hidden_size};
    case LoraModule::kFc2:
      return {c.hidden_size, c.ffn_hidden_size};
  }
  return {0, 0};
}

std::vector<int64_t> iota(IndexRange r) {
  std::vector<int64_t> v;
  for (int64_t i = r.begin; i < r.end; ++i) v.push_back(i);
  return v;
}

// Rows `rows` (empty: all; -1: zeros) and columns `cols` (likewise) of a host F32 matrix.
Tensor slice_f32(const Tensor& t, const std::vector<int64_t>& rows,
                 const std::vector<int64_t>& cols) {
  const int64_t n_rows = t.dim(0), n_cols = t.dim(1);
  const int64_t out_rows = rows.empty() ? n_rows : static_cast<int64_t>(rows.size());
  const int64_t out_cols = cols.empty() ? n_cols : static_cast<int64_t>(cols.size());
  Tensor out = Tensor::zeros(DType::kF32, {out_rows, out_cols});
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  for (int64_t i = 0; i < out_rows; ++i) {
    const int64_t sr = rows.empty() ? i : rows[i];
    if (sr < 0) continue;
    for (int64_t j = 0; j < out_cols; ++j) {
      const int64_t sc = cols.empty() ? j : cols[j];
      if (sc >= 0) dst[i * out_cols + j] = src[sr * n_cols + sc];
    }
  }
  return out;
}

}  // namespace

// A host F16 copy of a host F32 tensor (exact for values read from an F16 file).
static Tensor to_f16(const Tensor& t) {
  Tensor h = Tensor::empty(DType::kF16, t.shape());
  const float* src = t.data<float>();
  uint16_t* dst = h.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) dst[i] = f32_to_f16(src[i]);
  return h;
}

// Fills every rank's LoraLinear of module m of `layer` from the full host F32 a [r, in] and
// b [out, r]: column-parallel qkv / dense_h_to_4h split B's rows like the base rows (A
// replicated), row-parallel dense / dense_4h_to_h split A's columns like the base columns (B
// replicated), so the row-parallel partial deltas ride the layer's existing all-reduce.
static void put_sharded(LoraAdapter& ad, const FalconConfig& full, int n, int64_t layer,
                        LoraModule m, const Tensor& a, const Tensor& b, float scale, DType dtype,
                        Device device) {
  const ShardDims dims{full.n_heads, full.n_kv_heads, full.head_dim, full.ffn_hidden_size,
                       full.vocab_size};
  for (int r = 0; r < n; ++r) {
    std::vector<int64_t> a_cols, b_rows;
    if (n > 1) {
      const RankShard s = shard_rank(dims, n, r);
      switch (m) {
        case LoraModule::kQkv:
          b_rows = s.qkv_rows(dims);
          break;
        case LoraModule::kFc1:
          b_rows = iota(s.ffn);
          break;
        case LoraModule::kDense:
          a_cols = s.dense_cols(dims);
          break;
        case LoraModule::kFc2:
          a_cols = iota(s.ffn);
          break;
      }
    }
    const Tensor as = a_cols.empty() ? a : slice_f32(a, {}, a_cols);
    const Tensor bs = b_rows.empty() ? b : slice_f32(b, b_rows, {});
    LoraLinear& l = ad.mutable_linear(r, layer, m);
    if (dtype == DType::kF16) {
      l.a = ops::to_device(to_f16(as), device);
      l.b = ops::to_device(to_f16(bs), device);
    } else {
      l.a = ops::upload_weight(as.raw(), DType::kF32, as.shape(), dtype, device);
      l.b = ops::upload_weight(bs.raw(), DType::kF32, bs.shape(), dtype, device);
    }
    l.scale = scale;
  }
}

// Reads and validates the PEFT folder DIR against the whole model's config `c`, and calls
// put(layer, module, host F32 a, host F32 b, scale, both stored as F16) for every module it
// holds. Shared by load_adapter and read_host_adapter.
template <typename Put>
static LoraConfig read_adapter_folder(const std::string& dir, const FalconConfig& c, Put&& put) {
  KESTREL_CHECK(fs::is_directory(dir), "LoRA adapter folder ", dir, " does not exist");
  const LoraConfig cfg = LoraConfig::from_file((fs::path(dir) / "adapter_config.json").string());
  const fs::path st = fs::path(dir) / "adapter_model.safetensors";
  if (!fs::exists(st)) {
    KESTREL_CHECK(!fs::exists(fs::path(dir) / "adapter_model.bin"), "LoRA adapter ", dir,
                  " holds only adapter_model.bin (pickled PyTorch), not adapter_model.safetensors; "
                  "save it with safe_serialization=True or convert it");
    KESTREL_FAIL("LoRA adapter ", dir, " has no adapter_model.safetensors");
  }
  const std::shared_ptr<SafetensorsFile> file = SafetensorsFile::open(st.string());
  for (int64_t l : cfg.layers_to_transform)
    KESTREL_CHECK(l < c.n_layers, "LoRA adapter ", dir, ": layers_to_transform names layer ", l,
                  " of a ", c.n_layers, "-layer model");
  // Every key must be one kestrel reads, for a layer and module the config targets.
  for (const auto& [key, info] : file->tensors()) {
    int64_t layer = 0;
    LoraModule m{};
    bool is_b = false;
    KESTREL_CHECK(parse_key(key, &layer, &m, &is_b), "LoRA adapter ", st.string(),
                  ": unknown tensor ", key,
                  " (expected base_model.model.transformer.h.N.<module>.lora_A/B.weight)");
    KESTREL_CHECK(layer < c.n_layers, "LoRA adapter ", st.string(), ": tensor ", key,
                  " is for layer ", layer, " of a ", c.n_layers, "-layer model");
    KESTREL_CHECK(cfg.targets(layer, m), "LoRA adapter ", st.string(), ": tensor ", key,
                  " is for a module the adapter_config.json does not target");
    KESTREL_CHECK(
        info.dtype == DType::kF32 || info.dtype == DType::kF16 || info.dtype == DType::kBF16,
        "LoRA adapter ", st.string(), ": tensor ", key, " is ", dtype_name(info.dtype),
        "; F32, F16 or BF16 expected");
    KESTREL_CHECK(info.shape.size() == 2, "LoRA adapter ", st.string(), ": tensor ", key,
                  " has shape ", shape_str(info.shape), ", a matrix expected");
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int i = 0; i < kLoraModules; ++i) {
      const auto m = static_cast<LoraModule>(i);
      if (!cfg.targets(l, m)) continue;
      const std::string ka = tensor_key(l, m, false), kb = tensor_key(l, m, true);
      const TensorInfo* a = file->find(ka);
      const TensorInfo* b = file->find(kb);
      if (!a && !b) {
        // layers_to_transform unset but a layer left out (peft's exclude_modules): no delta.
        continue;
      }
      KESTREL_CHECK(a && b, "LoRA adapter ", st.string(), ": ", a ? kb : ka, " is missing (",
                    a ? ka : kb, " is there)");
      const auto [out, in] = module_dims(c, m);
      const int64_t r = cfg.rank_for(l, m);
      KESTREL_CHECK(a->shape[0] == b->shape[1], "LoRA adapter ", st.string(), ": ", ka,
                    " has rank ", a->shape[0], " (shape ", shape_str(a->shape), ") but ", kb,
                    " rank ", b->shape[1], " (shape ", shape_str(b->shape), ")");
      KESTREL_CHECK(a->shape[0] == r, "LoRA adapter ", dir, ": adapter_config.json gives ",
                    lora_module_key(l, m), " rank ", r, " (r or rank_pattern) but ", ka,
                    " has shape ", shape_str(a->shape), " (rank ", a->shape[0], ")");
      KESTREL_CHECK(a->shape[1] == in, "LoRA adapter ", st.string(), ": ", ka, " has shape ",
                    shape_str(a->shape), ", the base model needs ", shape_str(Shape{r, in}));
      KESTREL_CHECK(b->shape[0] == out, "LoRA adapter ", st.string(), ": ", kb, " has shape ",
                    shape_str(b->shape), ", the base model needs ", shape_str(Shape{out, r}));
      const Tensor ha = ops::upload_weight(a->data, a->dtype, a->shape, DType::kF32, Device::kCpu);
      const Tensor hb = ops::upload_weight(b->data, b->dtype, b->shape, DType::kF32, Device::kCpu);
      put(l, m, ha, hb, cfg.scale_for(l, m), a->dtype == DType::kF16 && b->dtype == DType::kF16);
    }
  }
  return cfg;
}

std::shared_ptr<const LoraAdapter> FalconModel::load_adapter(const std::string& dir,
                                                             const std::string& name) const {
  KESTREL_CHECK(!(tp_.comm && !group_),
                "LoRA adapters on one process of a multi-process (--nnodes) model are not "
                "supported yet");
  const FalconConfig& c = config_;  // the whole model's (a tensor-parallel group's top)
  const int n = tp_.size;
  auto ad = std::make_shared<LoraAdapter>(name, dir, n, c.n_layers);
  const DType dtype = ops::weight_dtype(device_);
  // Beside the forward passes that other requests keep running meanwhile, not between them.
  const ops::BackgroundDeviceWork background(device_);
  read_adapter_folder(
      dir, c,
      [&](int64_t l, LoraModule m, const Tensor& ha, const Tensor& hb, float scale, bool f16) {
        // F16 adapters stay F16 on CUDA (the kernels read either; bf16 would drop
        // 3 bits).
        const bool keep_f16 = device_ == Device::kCuda && f16;
        put_sharded(*ad, c, n, l, m, ha, hb, scale, keep_f16 ? DType::kF16 : dtype, device_);
      });
  ops::synchronize(device_);
  return ad;
}

HostLoraAdapter FalconModel::read_host_adapter(const std::string& dir) const {
  const FalconConfig& c = config_;
  HostLoraAdapter host;
  host.layers.resize(c.n_layers);
  host.config = read_adapter_folder(
      dir, c, [&](int64_t l, LoraModule m, const Tensor& ha, const Tensor& hb, float scale, bool) {
        LoraFactors& f = host.layers[l][static_cast<int>(m)];
        f.a = ha;
        f.b = hb;
        f.scale = scale;
      });
  return host;
}

std::shared_ptr<const LoraAdapter> FalconModel::adapter_from_merged(const MergedLora& merged,
                                                                    const std::string& name) const {
  KESTREL_CHECK(!(tp_.comm && !group_),
                "LoRA adapters on one process of a multi-process (--nnodes) model are not "
                "supported yet");
  const FalconConfig& c = config_;
  KESTREL_CHECK(static_cast<int64_t>(merged.layers.size()) == c.n_layers, "merged adapter ", name,
                " has ", merged.layers.size(), " layers, the model ", c.n_layers);
  const int n = tp_.size;
  auto ad = std::make_shared<LoraAdapter>(name, "", n, c.n_layers);
  const DType dtype = ops::weight_dtype(device_);
  const ops::BackgroundDeviceWork background(device_);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int i = 0; i < kLoraModules; ++i) {
      const auto m = static_cast<LoraModule>(i);
      const LoraFactors& f = merged.layers[l][i];
      if (!f.defined()) continue;
      const auto [out, in] = module_dims(c, m);
      KESTREL_CHECK(f.a.ndim() == 2 && f.b.ndim() == 2 && f.a.dim(0) == f.b.dim(1) &&
                        f.a.dim(1) == in && f.b.dim(0) == out && f.a.dtype() == DType::kF32 &&
                        f.b.dtype() == DType::kF32,
                    "merged adapter ", name, ": ", lora_module_key(l, m), " has A ",
                    shape_str(f.a.shape()), " and B ", shape_str(f.b.shape()),
                    ", the base model needs [r, ", in, "] and [", out, ", r] in F32");
      put_sharded(*ad, c, n, l, m, f.a, f.b, static_cast<float>(f.scale), dtype, device_);
    }
  }
  ops::synchronize(device_);
  return ad;
}

std::shared_ptr<const LoraAdapter> FalconModel::random_adapter(
    const std::string& name, int64_t r, const std::vector<LoraModule>& modules,
    uint64_t seed) const {
  KESTREL_CHECK(!(tp_.comm && !group_),
                "LoRA adapters on one process of a multi-process (--nnodes) model are not "
                "supported yet");
  KESTREL_CHECK(r > 0, "random_adapter: rank ", r);
  const FalconConfig& c = config_;
  const int n = tp_.size;
  auto ad = std::make_shared<LoraAdapter>(name, "", n, c.n_layers);
  const DType dtype = ops::weight_dtype(device_);
  const float amp = 0.02f;
  uint64_t k = seed * 0x9e3779b97f4a7c15ull + 0x51ed270b;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (LoraModule m : modules) {
      const auto [out, in] = module_dims(c, m);
      const uint64_t sa = ++k, sb = ++k;
      if (n == 1) {  // drawn on the device
        LoraLinear& lin = ad->mutable_linear(0, l, m);
        lin.a = ops::random_uniform({r, in}, dtype, device_, sa, amp, 0.0f);
        lin.b = ops::random_uniform({out, r}, dtype, device_, sb, amp, 0.0f);
        lin.scale = 1.0f;
      } else {  // the same values drawn on the host, sharded like a loaded adapter
        const Tensor a = ops::random_uniform({r, in}, DType::kF32, Device::kCpu, sa, amp, 0.0f);
        const Tensor b = ops::random_uniform({out, r}, DType::kF32, Device::kCpu, sb, amp, 0.0f);
        put_sharded(*ad, c, n, l, m, a, b, 1.0f, dtype, device_);
      }
    }
  }
  ops::synchronize(device_);
  return ad;
}

void check_lora_batch(const ForwardBatch& b, int n_ranks, int64_t n_layers) {
  if (b.adapters.empty()) return;
  KESTREL_CHECK(static_cast<int64_t>(b.adapters.size()) == b.n_seqs(),
                "forward: ", b.adapters.size(), " adapters for ", b.n_seqs(),
                " sequences (one per sequence, or none at all)");
  for (size_t s = 0; s < b.adapters.size(); ++s) {
    const LoraAdapter* a = b.adapters[s];
    if (!a) continue;
    KESTREL_CHECK(a->n_ranks() == n_ranks && a->n_layers() == n_layers, "forward: adapter ",
                  a->name(), " of sequence ", s, " was made for ", a->n_ranks(), " ranks x ",
                  a->n_layers(), " layers, this model has ", n_ranks, " x ", n_layers);
  }
}

LoraPlan::LoraPlan(const ForwardBatch& b, int rank, int64_t n_layers) {
  if (b.adapters.empty()) return;
  // Runs of consecutive sequences sharing one non-null adapter.
  struct Run {
    const LoraAdapter* adapter;
    int32_t begin, end;
  };
  std::vector<Run> runs;
  for (int64_t s = 0; s < b.n_seqs(); ++s) {
    const LoraAdapter* a = b.adapters[s];
    const int32_t begin = b.cu_seqlens[s], end = b.cu_seqlens[s + 1];
    if (!a || begin == end) continue;
    if (!runs.empty() && runs.back().adapter == a && runs.back().end == begin) {
      runs.back().end = end;
    } else {
      runs.push_back({a, begin, end});
    }
  }
  if (runs.empty()) return;
  segments_.resize(n_layers);
  for (int64_t l = 0; l < n_layers; ++l) {
    for (int i = 0; i < kLoraModules; ++i) {
      for (const Run& run : runs) {
        const LoraLinear& lin = run.adapter->linear(rank, l, static_cast<LoraModule>(i));
        if (!lin.defined()) continue;
        segments_[l][i].push_back({run.begin, run.end, &lin.a, &lin.b, lin.scale});
        empty_ = false;
      }
    }
  }
}

LoraPlan::LoraPlan(const void* tables, int64_t n_layers, int entries, int max_r)
    : empty_(n_layers == 0 || entries == 0),
      tables_(static_cast<const uint8_t*>(tables)),
      entries_(entries),
      max_r_(max_r) {}

void LoraPlan::pack_tables(const ForwardBatch& b, int64_t n_layers, int entries,
                           const std::array<int64_t, kLoraModules>& in_of,
                           ops::LoraTableEntry* tables) {
  std::fill(tables, tables + n_layers * kLoraModules * entries, ops::LoraTableEntry{});
  if (b.adapters.empty()) return;
  // Each distinct adapter's entries for every (layer, module), made once (rows are filled in).
  std::map<const LoraAdapter*, std::vector<ops::LoraTableEntry>> made;
  std::vector<int> used(n_layers * kLoraModules, 0);
  for (int64_t s = 0; s < b.n_seqs(); ++s) {
    const LoraAdapter* a = b.adapters[s];
    if (!a) continue;
    auto [it, fresh] = made.try_emplace(a);
    std::vector<ops::LoraTableEntry>& per = it->second;
    if (fresh) {
      per.resize(n_layers * kLoraModules);
      for (int64_t l = 0; l < n_layers; ++l) {
        for (int i = 0; i < kLoraModules; ++i) {
          const LoraLinear& lin = a->linear(0, l, static_cast<LoraModule>(i));
          if (!lin.defined()) continue;  // r stays 0: not targeted
          per[l * kLoraModules + i] =
              ops::lora_table_entry({0, 0, &lin.a, &lin.b, lin.scale}, in_of[i]);
        }
      }
    }
    const int32_t row = b.cu_seqlens[s];
    for (int64_t t = 0; t < n_layers * kLoraModules; ++t) {
      if (per[t].r == 0) continue;
      KESTREL_CHECK(used[t] < entries, "LoraPlan::pack_tables: more than ", entries, " rows");
      ops::LoraTableEntry& e = tables[t * entries + used[t]++];
      e = per[t];
      e.begin = row;
      e.end = row + 1;
    }
  }
}

void LoraPlan::add(int64_t layer, LoraModule m, const Tensor& x, Tensor& out) const {
  if (empty_) return;
  if (tables_) {
    const size_t t = static_cast<size_t>(layer * kLoraModules + static_cast<int>(m));
    ops::lora_add_table(x, tables_ + t * entries_ * sizeof(ops::LoraTableEntry), entries_, max_r_,
                        out);
    return;
  }
  const std::vector<ops::LoraSegment>& segs = segments_[layer][static_cast<int>(m)];
  if (!segs.empty()) ops::lora_add(x, segs, out);
}

}  // namespace kestrel
