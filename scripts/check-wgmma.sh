#!/usr/bin/env bash
# Fails when ptxas serializes the wgmma of a CUDA source (its C7515 / C7518 notes: accumulator
# registers touched, or a barrier the compiler inserted, on a divergent path between wgmma
# instructions): the kernel still computes the right result, several times slower. Recompiles
# each wgmma source of a configured CUDA build (default build-cuda) with `-Xptxas -v`.
set -euo pipefail
dir=${1:-build-cuda}
status=0
for src in decode_gemm.cu; do
  obj=src/backend/cuda/CMakeFiles/kestrel_backend_cuda.dir/$src.o
  cmd=$(ninja -C "$dir" -t commands "$obj" | tail -1)
  log=$(cd "$dir" && eval "$cmd -Xptxas -v" 2>&1)
  if grep -E "C751[58]" <<<"$log"; then
    echo "check-wgmma: ptxas serialized the wgmma of $src (above)"
    status=1
  else
    echo "check-wgmma: $src: no wgmma serialized"
  fi
done
exit $status
