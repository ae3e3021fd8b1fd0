#!/bin/sh
# One device call for the decode GEMV and the linear epilogues (docs/gpu.md, "GEMV and
# fusions"): all op tests, the linear timing harness (GEMV variants against cuBLASLt at
# falcon-7b's shapes), the fixture / graph tests, and kestrel bench decode (graphs off / on),
# then decode batch 1 with the GEMV off (KESTREL_GEMV=0) for the split. Carry BIN (kestrel,
# backend_cuda_test, model_cuda_test) and .gpulib/. Logs under $OUT.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BIN=${BIN:-build-h1carry}
export KESTREL_TEST_DATA=$PWD/tests/data  # the fixtures, wherever the test binaries were built
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
timeout 150 ./$BIN/backend_cuda_test >"$OUT/ops.log" 2>&1
echo "ops rc=$?"; grep -E "^\[  PASSED|^\[  FAILED|Failure|mode .*:" "$OUT/ops.log" | head -30
timeout 60 ./$BIN/backend_cuda_test --gtest_also_run_disabled_tests \
  --gtest_filter='CudaLinear.DISABLED_GemvTiming*' >"$OUT/timing.log" 2>&1
echo "timing rc=$?"; grep "^gemv" "$OUT/timing.log"
timeout 150 ./$BIN/model_cuda_test --gtest_filter='Fixtures*:CudaGraph*:DecodeGraph*' >"$OUT/model.log" 2>&1
echo "model rc=$?"; grep -E "^\[  PASSED|^\[  FAILED|Failure" "$OUT/model.log" | head -20
timeout 120 ./$BIN/kestrel bench --device cuda --preset falcon-7b --prefill '' \
  --decode 1x128x128,32x128x128,128x128x128 --first-token-prompt 128 --iters 3 --cuda-graphs both \
  >"$OUT/bench.log" 2>&1
echo "bench rc=$?"; tail -14 "$OUT/bench.log"
KESTREL_GEMV=0 timeout 60 ./$BIN/kestrel bench --device cuda --preset falcon-7b --prefill '' \
  --decode 1x128x128 --first-token-prompt 0 --iters 3 --cuda-graphs on >"$OUT/bench_nogemv.log" 2>&1
echo "bench KESTREL_GEMV=0 rc=$?"; tail -6 "$OUT/bench_nogemv.log"
