// Block-wide reductions from CUB whose result every thread of the block receives.
// kBlock is the launch's block size (blockDim = (kBlock, 1, 1)). Each call keeps its
// own CUB storage and broadcast slot in static shared memory per (kBlock, T) and ends
// with a barrier, so a kernel may call the same reduction again straight after.
#pragma once

#include <cub/block/block_reduce.cuh>
#include <cub/thread/thread_operators.cuh>
#include <cuda/functional>

#include <cfloat>
#include <cstdint>

namespace kestrel::cuda::kernels {

template <int kBlock, typename T>
__device__ __forceinline__ T block_sum(T v) {
  using Reduce = cub::BlockReduce<T, kBlock>;
  __shared__ typename Reduce::TempStorage storage;
  __shared__ T total;
  const T s = Reduce(storage).Sum(v);
  if (threadIdx.x == 0) total = s;
  __syncthreads();
  const T out = total;
  __syncthreads();  // the next call may overwrite storage and total
  return out;
}

template <int kBlock>
__device__ __forceinline__ float block_max(float v) {
  using Reduce = cub::BlockReduce<float, kBlock>;
  __shared__ typename Reduce::TempStorage storage;
  __shared__ float total;
  const float m = Reduce(storage).Reduce(v, ::cuda::maximum<float>{});
  if (threadIdx.x == 0) total = m;
  __syncthreads();
  const float out = total;
  __syncthreads();
  return out;
}

// The largest value and the smallest index holding it (ties go to the lower index). A
// thread with nothing to offer passes (-FLT_MAX, kNoIndex); a block where nobody offered
// anything larger returns kNoIndex.
constexpr int32_t kNoIndex = 0x7fffffff;
using ArgMaxPair = cub::KeyValuePair<int32_t, float>;

template <int kBlock>
__device__ __forceinline__ ArgMaxPair block_argmax(float v, int32_t i) {
  using Reduce = cub::BlockReduce<ArgMaxPair, kBlock>;
  __shared__ typename Reduce::TempStorage storage;
  __shared__ ArgMaxPair total;
  const ArgMaxPair best = Reduce(storage).Reduce(ArgMaxPair(i, v), cub::ArgMax());
  if (threadIdx.x == 0) total = best;
  __syncthreads();
  const ArgMaxPair out = total;
  __syncthreads();
  return out;
}

}  // namespace kestrel::cuda::kernels
