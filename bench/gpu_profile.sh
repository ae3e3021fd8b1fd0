#!/bin/sh
# Where a decode / prefill step's time goes: per-kernel GPU times from ncu
# (clocks left alone) over a 2-layer falcon-7b, and compute-sanitizer over the
# CUDA op tests. Same carried folders as gpu_run.sh; logs under $OUT.
set -u
OUT=${OUT:-gpu-out}
BIN=${BIN:-build-gpucarry}
mkdir -p "$OUT"
export KESTREL_TEST_DATA=$PWD/tests/data  # the fixtures, wherever the test binaries were built
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for shape in "--prefill 1x2048 --decode 1x1x1" "--prefill 1x1 --decode 1x128x3" "--prefill 1x1 --decode 128x128x3"; do
  name=$(echo "$shape" | tr -c 'a-z0-9\n' '_' | cut -c1-60)
  KESTREL_GEMM_AUTOTUNE=0 timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum \
    --print-summary per-kernel ./$BIN/kestrel bench --device cuda --preset falcon-7b --layers 2 \
    --iters 1 --first-token-prompt 0 $shape >"$OUT/ncu_$name.log" 2>&1
  echo "ncu $shape rc=$?"
  grep -E "^  [a-zA-Z_].*\(|gpu__time_duration.sum|Invocations" "$OUT/ncu_$name.log" | head -0
done
timeout 240 compute-sanitizer --tool memcheck ./$BIN/backend_cuda_test --gtest_brief=1 \
  --gtest_filter='*Attention*:CudaOps.*' >"$OUT/sanitizer.log" 2>&1
echo "sanitizer rc=$?"; tail -4 "$OUT/sanitizer.log"
