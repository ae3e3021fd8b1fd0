// Host-side helpers shared by the CUDA backend's .cpp files: the one stream all
// of kestrel's device work runs on, and CUDA_CHECK / CUBLAS_CHECK, which throw
// kestrel::Error naming the call, file and line. Not for .cu files.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace kestrel::cuda {

// kestrel's stream (created at first use, non-blocking w.r.t. the legacy stream).
cudaStream_t stream();
// Throws when no device is usable; called before the first allocation or launch.
void ensure_device();

// Counters for kernels whose blocks count their arrivals (the last block of a tile does the
// tile's final step): kCountersPerSlot ints a slot for the calling thread's stream(), zero when
// made (at first use, which must come before any graph capture that uses them), and every kernel
// that uses them leaves them zero. One slot a kernel family: launches on one stream run one
// after another.
enum class CounterSlot { kAttention = 0, kDecodeGemm = 1 };
constexpr int kCounterSlots = 2;
constexpr int kCountersPerSlot = 16384;
int* stream_counters(CounterSlot slot);

}  // namespace kestrel::cuda

#define CUDA_CHECK(call)                                                                        \
  do {                                                                                          \
    const cudaError_t kestrel_err_ = (call);                                                    \
    if (kestrel_err_ != cudaSuccess) [[unlikely]]                                               \
      throw ::kestrel::Error(                                                                   \
          ::kestrel::detail::concat(#call, " failed: ", cudaGetErrorString(kestrel_err_), " (", \
                                    __FILE__, ":", __LINE__, ")"));                             \
  } while (0)

// After a launch: a bad configuration shows up here, a fault at the next sync.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
