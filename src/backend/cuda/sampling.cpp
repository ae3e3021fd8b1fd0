// ops::sample_on_device on CUDA: packs the rows' parameters and penalty lists
// (CSR) into one upload, runs kernels::sample_rows over a workspace from the
// caching allocator, and brings back ids, logprobs and alternatives only.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/kernels.h"

namespace kestrel::cuda {
namespace {

Tensor upload_i32(const std::vector<int32_t>& v) {
  std::vector<int32_t> host = v.empty() ? std::vector<int32_t>{0} : v;
  Tensor h = Tensor::borrow(host.data(), DType::kI32, {static_cast<int64_t>(host.size())});
  Tensor d = Tensor::empty(DType::kI32, h.shape(), Device::kCuda);
  copy(h, d);
  return d;
}

}  // namespace

size_t sampling_workspace_bytes(int64_t n_rows, int64_t vocab) {
  return kernels::sample_workspace_bytes(n_rows, vocab, /*typical=*/true);
}

std::vector<ops::SampleResult> sample_on_device(const Tensor& logits,
                                                const std::vector<ops::SampleSpec>& rows,
                                                std::vector<uint8_t>* masks) {
  KESTREL_CHECK(logits.device() == Device::kCuda && logits.dtype() == DType::kF32,
                "sample_on_device (cuda): logits must be F32 on CUDA");
  const int64_t n = static_cast<int64_t>(rows.size()), vocab = logits.dim(1);
  std::vector<ops::SampleResult> out(rows.size());
  if (n == 0) return out;
  std::vector<kernels::SampleRowParams> params(rows.size());
  std::vector<int32_t> seen_off{0}, seen_ids, gen_off{0}, gen_ids, gen_counts;
  bool typical = false;
  int32_t max_top_n = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const ops::SampleSpec& s = rows[r];
    kernels::SampleRowParams& p = params[r];
    p.do_sample = s.do_sample ? 1 : 0;
    p.temperature = s.temperature;
    p.top_k = s.top_k;
    p.top_p = s.top_p;
    p.typical_p = s.typical_p;
    p.repetition_penalty = s.repetition_penalty;
    p.frequency_penalty = s.frequency_penalty;
    p.presence_penalty = s.presence_penalty;
    p.top_n = static_cast<int32_t>(std::min<int64_t>(s.top_n, vocab));
    p.u = s.u;
    typical = typical || (s.do_sample && s.typical_p < 1.0f);
    max_top_n = std::max(max_top_n, p.top_n);
    seen_ids.insert(seen_ids.end(), s.seen.begin(), s.seen.end());
    seen_off.push_back(static_cast<int32_t>(seen_ids.size()));
    for (const auto& [id, count] : s.generated) {
      gen_ids.push_back(id);
      gen_counts.push_back(count);
    }
    gen_off.push_back(static_cast<int32_t>(gen_ids.size()));
  }
  // The parameters travel as bytes (I32 words) in one tensor.
  static_assert(sizeof(kernels::SampleRowParams) % 4 == 0);
  std::vector<int32_t> param_words(params.size() * sizeof(kernels::SampleRowParams) / 4);
  std::memcpy(param_words.data(), params.data(), params.size() * sizeof(kernels::SampleRowParams));
  const Tensor params_d = upload_i32(param_words);
  const Tensor seen_off_d = upload_i32(seen_off), seen_ids_d = upload_i32(seen_ids);
  const Tensor gen_off_d = upload_i32(gen_off), gen_ids_d = upload_i32(gen_ids);
  const Tensor gen_counts_d = upload_i32(gen_counts);

  const int64_t alt_cols = std::max<int32_t>(max_top_n, 1);
  Tensor ids = Tensor::empty(DType::kI32, {n}, Device::kCuda);
  Tensor lps = Tensor::empty(DType::kF32, {n}, Device::kCuda);
  Tensor alt_ids = Tensor::empty(DType::kI32, {n, alt_cols}, Device::kCuda);
  Tensor alt_lps = Tensor::empty(DType::kF32, {n, alt_cols}, Device::kCuda);
  Tensor keep;
  if (masks != nullptr) keep = Tensor::empty(DType::kU8, {n, vocab}, Device::kCuda);
  const size_t ws_bytes = kernels::sample_workspace_bytes(n, vocab, typical);
  Tensor ws = Tensor::empty(DType::kU8, {static_cast<int64_t>(ws_bytes)}, Device::kCuda);

  kernels::SampleRowsArgs a;
  a.logits = logits.data<float>();
  a.params = reinterpret_cast<const kernels::SampleRowParams*>(params_d.data<int32_t>());
  a.seen_off = seen_off_d.data<int32_t>();
  a.seen_ids = seen_ids_d.data<int32_t>();
  a.gen_off = gen_off_d.data<int32_t>();
  a.gen_ids = gen_ids_d.data<int32_t>();
  a.gen_counts = gen_counts_d.data<int32_t>();
  a.out_ids = ids.data<int32_t>();
  a.out_logprobs = lps.data<float>();
  a.alt_ids = alt_ids.data<int32_t>();
  a.alt_logprobs = alt_lps.data<float>();
  a.keep_out = masks != nullptr ? keep.data<uint8_t>() : nullptr;
  a.n_rows = n;
  a.vocab = vocab;
  a.max_top_n = max_top_n;
  a.typical = typical;
  kernels::sample_rows(a, ws.raw(), stream());
  CUDA_CHECK_LAUNCH();

  Tensor ids_h = Tensor::empty(DType::kI32, {n});
  Tensor lps_h = Tensor::empty(DType::kF32, {n});
  copy(ids, ids_h);
  copy(lps, lps_h);
  Tensor alt_ids_h, alt_lps_h;
  if (max_top_n > 0) {
    alt_ids_h = Tensor::empty(DType::kI32, alt_ids.shape());
    alt_lps_h = Tensor::empty(DType::kF32, alt_lps.shape());
    copy(alt_ids, alt_ids_h);
    copy(alt_lps, alt_lps_h);
  }
  if (masks != nullptr) {
    Tensor keep_h = Tensor::empty(DType::kU8, keep.shape());
    copy(keep, keep_h);
    masks->assign(keep_h.data<uint8_t>(), keep_h.data<uint8_t>() + n * vocab);
  }
  synchronize();
  for (int64_t r = 0; r < n; ++r) {
    out[r].id = ids_h.data<int32_t>()[r];
    out[r].logprob = lps_h.data<float>()[r];
    for (int32_t j = 0; j < params[r].top_n; ++j) {
      out[r].alternatives.emplace_back(alt_ids_h.data<int32_t>()[r * alt_cols + j],
                                       alt_lps_h.data<float>()[r * alt_cols + j]);
    }
  }
  return out;
}

}  // namespace kestrel::cuda
