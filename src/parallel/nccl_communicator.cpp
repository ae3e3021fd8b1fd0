// NCCL communicator (see nccl_communicator.h). The one file of parallel/ that includes CUDA
// headers; it is compiled only with -DKESTREL_CUDA=ON.
#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <numeric>

#include "core/error.h"
#include "parallel/process_group.h"

#define NCCL_CHECK(call)                                                                   \
  do {                                                                                     \
    const ncclResult_t st_ = (call);                                                       \
    KESTREL_CHECK(st_ == ncclSuccess, #call, " failed: ", ncclGetErrorString(st_), " at ", \
                  __FILE__, ":", __LINE__);                                                \
  } while (0)
#define CUDA_OK(call)                                                                      \
  do {                                                                                     \
    const cudaError_t st_ = (call);                                                        \
    KESTREL_CHECK(st_ == cudaSuccess, #call, " failed: ", cudaGetErrorString(st_), " at ", \
                  __FILE__, ":", __LINE__);                                                \
  } while (0)

namespace kestrel {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
    case DType::kF8E4M3:  // moved as bytes (sums of FP8 are not taken)
    case DType::kF8E5M2:
      return ncclUint8;
  }
  KESTREL_FAIL("NCCL: unknown dtype");
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device, int rank, int size)
      : comm_(comm), device_(device), rank_(rank), size_(size) {
    CUDA_OK(cudaSetDevice(device_));
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(void* buf, size_t count, DType dtype) override {
    begin();
    NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), ncclSum, comm_, stream_));
    end();
  }
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    begin();
    NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, stream_));
    end();
  }
  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    KESTREL_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " outside [0, ", size_, ")");
    begin();
    NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm_, stream_));
    end();
  }
  void barrier() override {
    // A one-element all-reduce on a scratch word: NCCL has no barrier of its own.
    begin();
    if (!scratch_) CUDA_OK(cudaMalloc(&scratch_, sizeof(float)));
    NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
    end();
  }

 private:
  void begin() {
    CUDA_OK(cudaSetDevice(device_));
    CUDA_OK(cudaDeviceSynchronize());  // the ops' work on this device is done
  }
  void end() { CUDA_OK(cudaStreamSynchronize(stream_)); }

  ncclComm_t comm_;
  int device_, rank_, size_;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_nccl_group(int size) {
  int visible = 0;
  CUDA_OK(cudaGetDeviceCount(&visible));
  KESTREL_CHECK(size >= 1 && size <= visible, "NCCL: ", size, " ranks asked for, ", visible,
                " GPUs visible");
  std::vector<ncclComm_t> comms(size);
  std::vector<int> devices(size);
  std::iota(devices.begin(), devices.end(), 0);
  NCCL_CHECK(ncclCommInitAll(comms.data(), size, devices.data()));
  std::vector<std::shared_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r)
    out.push_back(std::make_shared<NcclCommunicator>(comms[r], devices[r], r, size));
  return out;
}

std::shared_ptr<Communicator> make_nccl_process_rank(const std::shared_ptr<ProcessGroup>& group) {
  KESTREL_CHECK(group != nullptr, "make_nccl_process_rank: no process group");
  int device = 0;
  CUDA_OK(cudaGetDevice(&device));
  ncclUniqueId id;
  std::vector<uint8_t> bytes(sizeof id);
  if (group->rank() == 0) {
    NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(bytes.data(), &id, sizeof id);
  }
  group->broadcast_bytes(bytes);
  std::memcpy(&id, bytes.data(), sizeof id);
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, group->size(), id, group->rank()));
  return std::make_shared<NcclCommunicator>(comm, device, group->rank(), group->size());
}

}  // namespace kestrel
