// Programmatic dependent launch (Hopper): a kernel launched through `launch` may start while
// the kernel before it in the stream is still finishing (its blocks become resident and run
// what precedes pdl_wait), which hides the launch gap between the short kernels of a decode
// step, in CUDA graphs too. The contract every kernel launched this way keeps:
//   - pdl_wait() before its first read of anything an earlier kernel wrote and before its
//     first write (an earlier kernel may still read what it overwrites); only reads of
//     data no kernel writes during a forward (weights) may come before it;
//   - pdl_trigger() once it no longer needs to hold its dependents back (here: right after
//     pdl_wait, since the dependents wait for this grid's completion in any case).
// griddepcontrol.wait waits for the prerequisite grid to complete and its writes to be
// visible, so correctness never rests on where the trigger sits; and since every kernel
// triggers only after its own wait, the kernel two back has completed when one launches.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <utility>

#include "backend/cuda/tuning.h"

namespace kestrel::cuda::kernels {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Both, in the order the contract wants at the top of a kernel.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

// Asks L2 to fetch [p, p + bytes) (p 16-byte aligned, bytes a multiple of 16); no result.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// Whether a launch on s now takes the attribute (pdl_mode above).
inline bool pdl_for(cudaStream_t s) {
  const int mode = tuning().pdl;
  if (mode != 1) return mode == 2;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusActive;
}

// kernel<<<grid, block, smem, s>>>(args...), as a programmatic dependent of the kernel before
// it where pdl_for(s) says so. The kernel must keep the contract above.
template <typename... Params, typename... Args>
void pdl_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                Args&&... args) {
  if (!pdl_for(s)) {
    kernel<<<grid, block, smem, s>>>(std::forward<Args>(args)...);
    return;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  // Errors surface through cudaGetLastError in the caller's CUDA_CHECK_LAUNCH, as with <<<>>>.
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace kestrel::cuda::kernels
