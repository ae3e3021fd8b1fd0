// The card's own limits, measured in the same process as the benchmark they judge: device
// copy bandwidth (bytes read plus bytes written per second) and the rate of a large BF16
// GEMM through cuBLASLt on random data. `kestrel bench` reports each figure as a fraction of
// these rather than of a datasheet number, so that a row reads the same on an H100 and an
// H200 and a throttled card is visible as such.
#pragma once

#include "core/tensor.h"

namespace kestrel::cli {

struct Roofline {
  double copy_bytes_s = 0;  // 0: not measured (the CPU)
  double gemm_flops_s = 0;
  int64_t gemm_n = 0;  // the GEMM was gemm_n x gemm_n x gemm_n
};

// Measures both on `device` (CUDA only; the CPU gets zeros), then frees what it used and
// resets the device's peak-memory figure.
Roofline measure_roofline(Device device);

}  // namespace kestrel::cli
