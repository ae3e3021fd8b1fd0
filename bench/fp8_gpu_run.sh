#!/bin/sh
# One device call for FP8 on CUDA: the FP8 op and fixture tests, then `kestrel bench` on
# falcon-7b in BF16 and with --quantize fp8 (same call, same card), and falcon-40b with
# --quantize fp8 (its BF16 weights do not leave room on an H100). Carry build-gpupack/bin.tar.xz
# and .gpulib (docs/gpu.md). Logs under $OUT.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT" build-gpucarry
tar -xJf build-gpupack/bin.tar.xz -C build-gpucarry
BIN=build-gpucarry
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
./$BIN/backend_cuda_test --gtest_filter="${OPS_FILTER:-CudaFp8*:*Linear*}" --gtest_brief=1 >"$OUT/ops.log" 2>&1
echo "ops rc=$?"; grep -E "FAILED|Failure|PASSED|Expected|Which is|actual" "$OUT/ops.log" | head -30
./$BIN/model_cuda_test --gtest_filter="${MODEL_FILTER:-*Fp8*}" --gtest_brief=1 >"$OUT/model.log" 2>&1
echo "model rc=$?"; grep -E "FAILED|PASSED|Failure|Expected|Which is|actual" "$OUT/model.log" | head -30
SHAPES="--prefill 1x2048,32x512 --decode 1x128x128,32x128x128,128x128x128 --first-token-prompt 128 --iters 3"
for q in "" "--quantize fp8"; do
  ./$BIN/kestrel bench --device cuda --preset falcon-7b $SHAPES $q >"$OUT/bench7b${q:+-fp8}.log" 2>&1
  echo "bench falcon-7b ${q:-bf16} rc=$?"; grep -vE "^\[" "$OUT/bench7b${q:+-fp8}.log" | tail -9
done
if [ "${BIG:-1}" = 1 ]; then
  ./$BIN/kestrel bench --device cuda --preset falcon-40b --quantize fp8 --prefill 1x2048 \
    --decode 1x128x128,32x128x128 --first-token-prompt 128 --iters 2 >"$OUT/bench40b-fp8.log" 2>&1
  echo "bench falcon-40b fp8 rc=$?"; grep -vE "^\[" "$OUT/bench40b-fp8.log" | tail -8
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
fi
