// The NCCL communicator on the GPU at N = 1 (the lent machine has one): collectives on device
// buffers, and a fixture through the tensor-parallel model (communicator set up, every all-reduce
// and the lm_head all-gather really called) against the plain CUDA model and the CPU. Skips
// without a GPU.
#include <gtest/gtest.h>

#include "../model/fixture_util.h"
#include "backend/ops.h"
#include "core/error.h"
#include "model/falcon_model.h"
#include "model/runner.h"
#include "parallel/nccl_communicator.h"

namespace kestrel {
namespace {

using test::fixture_dir;
using test::rel_error;

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (ops::cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device";
  }
};

Tensor on_gpu(const std::vector<float>& v) {
  return ops::to_device(
      Tensor::borrow(const_cast<float*>(v.data()), DType::kF32, {static_cast<int64_t>(v.size())}),
      Device::kCuda);
}

TEST_F(NcclTest, CollectivesAtOneRank) {
  auto comms = make_nccl_group(1);
  ASSERT_EQ(comms.size(), 1u);
  Communicator& c = *comms[0];
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * i - 3;
  Tensor x = on_gpu(v);
  c.all_reduce_sum(x.raw(), v.size(), DType::kF32);
  Tensor gathered = Tensor::empty(DType::kF32, {1000}, Device::kCuda);
  c.all_gather(x.raw(), gathered.raw(), v.size(), DType::kF32);
  c.broadcast(gathered.raw(), v.size(), DType::kF32, 0);
  c.barrier();
  const Tensor back = ops::to_host_f32(gathered);
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(back.data<float>()[i], v[i]) << i;
  EXPECT_THROW(make_nccl_group(ops::cuda_device_count() + 1), Error);
}

TEST_F(NcclTest, FixtureThroughTheTensorParallelModel) {
  const std::string dir = fixture_dir("falcon7b-mqa-parallel");
  const test::Expected exp("falcon7b-mqa-parallel");
  const FalconModel plain = FalconModel::load(dir, Device::kCuda);
  const FalconModel tp = FalconModel::load_parallel(dir, Device::kCuda, 1);
  ASSERT_EQ(tp.tensor_parallel(), 1);
  BatchRunner a(plain, exp.prompts, 0, {});
  BatchRunner b(tp, exp.prompts, 0, {});
  const Tensor want = a.prefill(true), got = b.prefill(true);
  ASSERT_EQ(got.shape(), want.shape());
  const double vs_plain = rel_error(got, want);
  const double vs_ref = rel_error(got.data<float>(), exp.f32("logits"), got.numel());
  std::printf("NCCL N=1 falcon7b-mqa-parallel: vs plain CUDA %.3g, vs transformers %.3g\n",
              vs_plain, vs_ref);
  EXPECT_LE(vs_plain, 1e-2);
  EXPECT_LE(vs_ref, 2e-2);
  EXPECT_EQ(greedy_generate(tp, exp.prompts, 12, {}, false),
            greedy_generate(plain, exp.prompts, 12, {}, false));
  // More ranks than GPUs: refused before the weights are read.
  EXPECT_THROW(FalconModel::load(dir, Device::kCuda, ops::cuda_device_count() + 1), Error);
}

}  // namespace
}  // namespace kestrel
