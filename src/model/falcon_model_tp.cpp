// Tensor parallelism of FalconModel: loading each rank's slice of the checkpoint by the rules of
// parallel/sharding.h, the rank-side collectives of the forward pass (vocabulary-sharded
// embedding and lm_head, all-reduce of row-parallel partial sums), and the N-rank model that runs
// one thread per rank per forward behind FalconModel's usual contract.
#include <cstring>
#include <exception>
#include <thread>

#include "backend/ops.h"
#include "core/error.h"
#include "core/logging.h"
#include "io/safetensors.h"
#include "model/falcon_model.h"
#include "model/falcon_weights.h"
#include "parallel/communicator.h"
#include "parallel/sharding.h"
#ifdef KESTREL_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif

namespace kestrel {

struct TpGroup {
  std::vector<FalconModel> ranks;
};

namespace {

ShardDims shard_dims(const FalconConfig& c) {
  return {c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_hidden_size, c.vocab_size};
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

std::vector<int64_t> iota_range(IndexRange r, int64_t pad_to = 0) {
  std::vector<int64_t> v;
  for (int64_t i = r.begin; i < r.end; ++i) v.push_back(i);
  while (static_cast<int64_t>(v.size()) < pad_to) v.push_back(-1);
  return v;
}

// Copies rows `rows` (empty: all; -1: a zero row) and columns `cols` (empty: all; -1: zero) of a
// checkpoint tensor ([n] is read as [n, 1]) into a host buffer of its dtype, adding the bytes
// read from the mapping to `read_bytes`. Contiguous column runs are copied with one memcpy.
std::vector<std::byte> gather_slice(const TensorInfo& t, const std::vector<int64_t>& rows,
                                    const std::vector<int64_t>& cols, Shape* out_shape,
                                    int64_t* read_bytes) {
  const int64_t n_rows = t.shape.at(0), n_cols = t.shape.size() > 1 ? t.shape[1] : 1;
  const size_t es = dtype_size(t.dtype);
  const int64_t out_rows = rows.empty() ? n_rows : static_cast<int64_t>(rows.size());
  const int64_t out_cols = cols.empty() ? n_cols : static_cast<int64_t>(cols.size());
  struct Run {
    int64_t src, dst, len;  // src -1: zeros
  };
  std::vector<Run> runs;
  for (int64_t j = 0; j < out_cols; ++j) {
    const int64_t src = cols.empty() ? j : cols[j];
    KESTREL_CHECK(src < n_cols, "column ", src, " outside ", t.name);
    Run& last = runs.empty() ? runs.emplace_back(Run{src, j, 0}) : runs.back();
    const bool extends = (last.src < 0 && src < 0) || (last.src >= 0 && src == last.src + last.len);
    if (last.len > 0 && !extends) {
      runs.push_back({src, j, 1});
    } else {
      ++last.len;
    }
  }
  std::vector<std::byte> out(static_cast<size_t>(out_rows * out_cols) * es);
  int64_t taken = 0;
  for (int64_t i = 0; i < out_rows; ++i) {
    const int64_t sr = rows.empty() ? i : rows[i];
    KESTREL_CHECK(sr < n_rows, "row ", sr, " outside ", t.name);
    std::byte* dst = out.data() + static_cast<size_t>(i * out_cols) * es;
    for (const Run& r : runs) {
      if (sr < 0 || r.src < 0) {
        std::memset(dst + r.dst * es, 0, r.len * es);
      } else {
        std::memcpy(dst + r.dst * es, t.data + static_cast<size_t>(sr * n_cols + r.src) * es,
                    r.len * es);
        taken += r.len;
      }
    }
  }
  *read_bytes += taken * static_cast<int64_t>(es);
  *out_shape = t.shape.size() > 1 ? Shape{out_rows, out_cols} : Shape{out_rows};
  return out;
}

// The FP8 scale of each row of `t` over all its columns (amax / 448, 1 for zeros), the values
// first rounded to `dtype` as the device holds them: what quantize_fp8 computes for the whole
// tensor, for a row-parallel slice that holds only some of the columns.
Tensor whole_row_scales(const TensorInfo& t, DType dtype) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  Tensor out = Tensor::empty(DType::kF32, {rows});
  std::vector<float> row(static_cast<size_t>(cols));
  const size_t es = dtype_size(t.dtype);
  for (int64_t r = 0; r < rows; ++r) {
    convert_to_f32(t.data + static_cast<size_t>(r * cols) * es, t.dtype, row.size(), row.data());
    float amax = 0.0f;
    for (float v : row)
      amax = std::max(amax, std::fabs(dtype == DType::kBF16 ? bf16_to_f32(f32_to_bf16(v)) : v));
    out.data<float>()[r] = fp8_scale(amax);
  }
  return out;
}

FalconConfig rank_config(const FalconConfig& c, const RankShard& s) {
  FalconConfig rc = c;
  rc.n_heads = s.n_local_heads();
  rc.n_kv_heads = s.n_local_kv_heads();
  rc.ffn_hidden_size = s.ffn.size();
  rc.tp_first_head = s.heads.begin;
  rc.tp_total_heads = c.n_heads;
  return rc;
}

std::vector<std::shared_ptr<Communicator>> make_group(Device device, int n) {
  if (device == Device::kCpu) return make_in_process_group(n);
#ifdef KESTREL_HAVE_NCCL
  return make_nccl_group(n);
#else
  KESTREL_FAIL("tensor parallelism on CUDA needs NCCL, and this build has none");
#endif
}

}  // namespace

// Rank comm->rank() of comm->size(): only its slice of every tensor is read.
FalconModel FalconModel::build_rank(const FalconConfig& config, const WeightStore& store,
                                    Device device, bool has_lm_head,
                                    std::shared_ptr<Communicator> comm, const WeightQuant& quant) {
  const ShardDims dims = shard_dims(config);
  const int n = comm->size(), r = comm->rank();
  const DType dtype = ops::weight_dtype(device);
  const int64_t vmax = even_range(config.vocab_size, n, 0).size();
  const RankShard s = shard_rank(dims, n, r);
  const std::vector<int64_t> qkv_rows = s.qkv_rows(dims), dense_cols = s.dense_cols(dims);
  const std::vector<int64_t> ffn = iota_range(s.ffn);
  int64_t read = 0;
  auto load = [&](const std::string& name) -> Tensor {
    const TensorInfo& info = store.get(name);
    if (is_fp8(info.dtype))
      KESTREL_FAIL("tensor ", name, " is ", dtype_name(info.dtype),
                   ": only the linears (query_key_value, dense, dense_h_to_4h, dense_4h_to_h) "
                   "may be FP8");
    std::vector<int64_t> rows, cols;
    if (name == "transformer.word_embeddings.weight") {
      rows = iota_range(s.vocab, s.vocab.size() + 1);  // + the zero row of masked ids
    } else if (name == "lm_head.weight") {
      rows = iota_range(s.vocab, vmax);
    } else if (ends_with(name, ".query_key_value.weight") ||
               ends_with(name, ".query_key_value.bias")) {
      rows = qkv_rows;
    } else if (ends_with(name, ".self_attention.dense.weight")) {
      cols = dense_cols;
    } else if (ends_with(name, ".dense_h_to_4h.weight") || ends_with(name, ".dense_h_to_4h.bias")) {
      rows = ffn;
    } else if (ends_with(name, ".dense_4h_to_h.weight")) {
      cols = ffn;
    } else if ((ends_with(name, ".self_attention.dense.bias") ||
                ends_with(name, ".dense_4h_to_h.bias")) &&
               r != 0) {
      return Tensor();  // row-parallel bias: added once, by rank 0
    }
    Shape shape;
    const std::vector<std::byte> host = gather_slice(info, rows, cols, &shape, &read);
    return ops::upload_weight(host.data(), info.dtype, shape, dtype, device);
  };
  // A pre-quantized FP8 linear: the slice of its codes, and of its scales where they are per
  // row of a column-parallel slice (a row-parallel slice keeps whole rows: every scale; a
  // padding row of zeros takes 1). --quantize fp8: the slice quantized as the single-rank model
  // quantizes the whole tensor.
  LoadFp8 load_fp8 = [&](const std::string& name, Tensor& q, Tensor& scale) {
    const TensorInfo& info = store.get(name);
    if (!is_fp8(info.dtype) && !quant.fp8) return false;
    std::vector<int64_t> rows, cols;
    if (ends_with(name, ".query_key_value.weight")) rows = qkv_rows;
    if (ends_with(name, ".self_attention.dense.weight")) cols = dense_cols;
    if (ends_with(name, ".dense_h_to_4h.weight")) rows = ffn;
    if (ends_with(name, ".dense_4h_to_h.weight")) cols = ffn;
    Shape shape;
    if (is_fp8(info.dtype)) {
      const Tensor all = fp8_weight_scales(store, name);  // [1] or [out], checked
      Tensor mine = all;
      if (all.numel() > 1 && !rows.empty()) {
        mine = Tensor::empty(DType::kF32, {static_cast<int64_t>(rows.size())});
        for (size_t i = 0; i < rows.size(); ++i)
          mine.data<float>()[i] = rows[i] < 0 ? 1.0f : all.data<float>()[rows[i]];
      }
      const std::vector<std::byte> host = gather_slice(info, rows, cols, &shape, &read);
      q = ops::upload_weight(host.data(), info.dtype, shape, info.dtype, device);
      scale = ops::to_device(mine, device);
      return true;
    }
    // From the checkpoint's own values, as the single-rank load (F32 / F16 not through BF16).
    const DType wide = info.dtype == DType::kBF16 ? dtype : DType::kF32;
    if (!cols.empty()) scale = ops::to_device(whole_row_scales(info, wide), device);
    const std::vector<std::byte> host = gather_slice(info, rows, cols, &shape, &read);
    ops::quantize_fp8(ops::upload_weight(host.data(), info.dtype, shape, wide, device), q, scale);
    return true;
  };
  FalconModel m = build(rank_config(config, s), device, has_lm_head, load, quant, load_fp8);
  if (!has_lm_head) m.lm_head_ = m.word_embeddings_.rows(0, vmax);
  std::shared_ptr<Communicator> timed = std::make_shared<TimedCommunicator>(std::move(comm));
  m.tp_ = {r, n, std::move(timed), s.vocab.begin, s.vocab.end, read};
  spdlog::info("tensor parallel {}: {:.1f} MiB of weights", describe(s), read / 1048576.0);
  return m;
}

FalconModel FalconModel::load_process_rank(const std::string& dir, Device device,
                                           std::shared_ptr<Communicator> comm,
                                           const WeightQuant& quant) {
  KESTREL_CHECK(comm != nullptr, "load_process_rank: no communicator");
  FalconConfig config = FalconConfig::from_model_dir(dir);
  check_tensor_parallel(shard_dims(config), comm->size());  // before any weight is read
  WeightStore store = WeightStore::open_folder(dir);
  const bool has_lm_head = store.contains("lm_head.weight");
  KESTREL_CHECK(has_lm_head || config.tie_word_embeddings,
                "config says tie_word_embeddings: false but the checkpoint has no lm_head.weight");
  for (const WeightSpec& s : falcon_weight_specs(config, has_lm_head)) store.get(s.name, s.shape);
  return build_rank(config, store, device, has_lm_head, std::move(comm), quant);
}

FalconModel FalconModel::load_parallel(const std::string& dir, Device device, int tensor_parallel,
                                       const WeightQuant& quant) {
  FalconConfig config = FalconConfig::from_model_dir(dir);
  check_tensor_parallel(shard_dims(config), tensor_parallel);  // before any weight is read
  if (device == Device::kCuda) {
    const int visible = ops::cuda_device_count();
    KESTREL_CHECK(tensor_parallel <= visible, "--tensor-parallel ", tensor_parallel, " needs ",
                  tensor_parallel, " GPUs, ", visible, " visible");
  }
  WeightStore store = WeightStore::open_folder(dir);
  return from_store_parallel(config, store, device, tensor_parallel, quant);
}

FalconModel FalconModel::from_store_parallel(const FalconConfig& config, const WeightStore& store,
                                             Device device, int n, const WeightQuant& quant) {
  const ShardDims dims = shard_dims(config);
  check_tensor_parallel(dims, n);
  KESTREL_CHECK(device == Device::kCpu || n == 1, "--tensor-parallel ", n,
                " on CUDA in one process needs one CUDA stream per device in the CUDA backend, "
                "which it does not have yet; run one process per GPU (--nnodes ",
                n, ", docs/parallel.md) or --device cpu");
  const bool has_lm_head = store.contains("lm_head.weight");
  KESTREL_CHECK(has_lm_head || config.tie_word_embeddings,
                "config says tie_word_embeddings: false but the checkpoint has no lm_head.weight");
  for (const WeightSpec& s : falcon_weight_specs(config, has_lm_head)) store.get(s.name, s.shape);

  auto comms = make_group(device, n);
  auto group = std::make_shared<TpGroup>();
  for (int r = 0; r < n; ++r)
    group->ranks.push_back(build_rank(config, store, device, has_lm_head, comms[r], quant));
  FalconModel top;
  top.config_ = config;
  top.device_ = device;
  top.act_dtype_ = ops::weight_dtype(device);
  top.quant_ = quant;
  top.tp_.size = n;
  top.group_ = std::move(group);
  return top;
}

int64_t FalconModel::weight_bytes() const {
  int64_t n = 0;
  if (group_) {
    for (const FalconModel& m : group_->ranks) n += m.weight_bytes();
    return n;
  }
  auto add = [&](const Tensor& t) { n += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; };
  add(word_embeddings_);
  if (lm_head_.raw() != word_embeddings_.raw()) add(lm_head_);
  add(ln_f_w_), add(ln_f_b_);
  for (const FalconLayerWeights& w : layers_)
    for (const Tensor* t : {&w.ln_attn_w, &w.ln_attn_b, &w.ln_mlp_w, &w.ln_mlp_b, &w.qkv_w,
                            &w.qkv_b, &w.dense_w, &w.dense_b, &w.fc1_w, &w.fc1_b, &w.fc2_w,
                            &w.fc2_b, &w.qkv_s, &w.dense_s, &w.fc1_s, &w.fc2_s})
      add(*t);
  return n;
}

double FalconModel::collective_seconds() const {
  if (group_) return group_->ranks.front().collective_seconds();
  const auto* timed = dynamic_cast<const TimedCommunicator*>(tp_.comm.get());
  return timed ? timed->seconds() : 0.0;
}

std::vector<int64_t> FalconModel::rank_weight_bytes() const {
  std::vector<int64_t> out;
  if (group_) {
    for (const FalconModel& m : group_->ranks) out.push_back(m.tp_.weight_bytes);
    return out;
  }
  if (tp_.comm) return {tp_.weight_bytes};  // one rank of a process group
  int64_t total = 0;
  for (const WeightSpec& s : falcon_weight_specs(config_, !config_.tie_word_embeddings)) {
    total += shape_numel(s.shape) * static_cast<int64_t>(dtype_size(config_.dtype));
  }
  return {total};
}

int64_t FalconModel::kv_bytes_per_block(int64_t block_size) const {
  if (group_) {
    int64_t total = 0;
    for (const FalconModel& m : group_->ranks)
      total +=
          KvCacheShape{m.config_.n_layers, 1, block_size, m.config_.n_kv_heads, m.config_.head_dim}
              .bytes_per_block(kv_cache_dtype());
    return total;
  }
  return KvCacheShape{config_.n_layers, 1, block_size, config_.n_kv_heads, config_.head_dim}
      .bytes_per_block(kv_cache_dtype());
}

KvCache FalconModel::make_group_kv_cache(int64_t num_blocks, int64_t block_size) const {
  std::vector<KvCache> shards;
  for (const FalconModel& m : group_->ranks)
    shards.push_back(KvCache(KvCacheShape{m.config_.n_layers, num_blocks, block_size,
                                          m.config_.n_kv_heads, m.config_.head_dim},
                             kv_cache_dtype(), m.device_));
  return KvCache(std::move(shards));
}

// Every rank runs the whole forward on its shard, the collectives keeping them in step; rank 0
// runs on the calling thread. Each rank ends with the same logits (or hidden states).
Tensor FalconModel::forward_group(const ForwardBatch& b, KvCache& cache) const {
  const int n = static_cast<int>(group_->ranks.size());
  KESTREL_CHECK(cache.n_shards() == n, "forward: a model of ", n,
                " tensor-parallel ranks needs a KV cache from its make_kv_cache (this one has ",
                cache.n_shards(), " rank caches)");
  check_batch(b, cache);  // bad input fails here, before any rank waits on a collective
  std::vector<Tensor> out(n);
  std::vector<std::exception_ptr> errors(n);
  auto run = [&](int r) {
    try {
      out[r] = group_->ranks[r].forward_device(b, cache.shard(r));
    } catch (...) {
      errors[r] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < n; ++r) threads.emplace_back(run, r);
  run(0);
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return out[0];
}

void FalconModel::all_reduce(Tensor& t) const {
  tp_.comm->all_reduce_sum(t.raw(), static_cast<size_t>(t.numel()), t.dtype());
}

// ids outside the rank's vocabulary rows look up its zero row, so the all-reduce of the ranks'
// lookups is the full embedding.
void FalconModel::embed_sharded(const ForwardBatch& b, Tensor& x) const {
  const int64_t n_tokens = b.n_tokens(), local = tp_.vocab_end - tp_.vocab_begin;
  std::vector<int32_t> ids(n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int32_t id = b.input_ids[t];
    ids[t] = id >= tp_.vocab_begin && id < tp_.vocab_end
                 ? static_cast<int32_t>(id - tp_.vocab_begin)
                 : static_cast<int32_t>(local);
  }
  const Tensor host = Tensor::borrow(ids.data(), DType::kI32, {n_tokens});
  ops::embedding(ops::to_device(host, device_), word_embeddings_, x);
  all_reduce(x);
}

// logits of the rank's vocabulary rows [n_out, vmax] (padding rows zero), all-gathered into
// [N, n_out, vmax] and laid out as [n_out, vocab].
Tensor FalconModel::lm_head_sharded(const Tensor& h) const {
  const int64_t n_out = h.dim(0), vmax = lm_head_.dim(0), vocab = config_.vocab_size;
  const int n = tp_.size;
  Tensor local = Tensor::empty(DType::kF32, {n_out, vmax}, device_);
  ops::linear(h, lm_head_, Tensor(), local);
  Tensor gathered = Tensor::empty(DType::kF32, {n * n_out, vmax}, device_);
  tp_.comm->all_gather(local.raw(), gathered.raw(), static_cast<size_t>(n_out * vmax), DType::kF32);
  if (n == 1) return gathered;  // vmax == vocab
  Tensor logits = Tensor::empty(DType::kF32, {n_out, vocab}, device_);
  for (int r = 0; r < n; ++r) {
    const IndexRange v = even_range(vocab, n, r);
    ops::copy_2d(gathered, r * n_out * vmax, vmax, logits, v.begin, vocab, n_out, v.size());
  }
  return logits;
}

}  // namespace kestrel
