#!/bin/sh
# One device call for FP8 on CUDA (STEPS picks: tests, bench7b, bench40b): the FP8 op, attention
# and fixture tests; `kestrel bench` on falcon-7b in BF16, with --quantize fp8, with the FP8
# tensor-core GEMM at every row count (KESTREL_GEMV=0: where the GEMV's row limit pays) and with
# --kv-cache-dtype fp8 (same call, same card); falcon-40b with --quantize fp8 (its BF16 weights
# do not leave room on an H100). Carry build-gpupack/bin.tar.xz and .gpulib (docs/gpu.md).
# Logs under $OUT.
set -u
OUT=${OUT:-gpu-out}
STEPS=${STEPS:-tests,bench7b,bench40b}
T0=$(date +%s)
mkdir -p "$OUT" build-gpucarry
tar -xJf build-gpupack/bin.tar.xz -C build-gpucarry
BIN=build-gpucarry
export KESTREL_TEST_DATA=$PWD/tests/data  # the fixtures, wherever the test binaries were built
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

case ,$STEPS, in *,tests,*)
  ./$BIN/backend_cuda_test --gtest_filter="${OPS_FILTER:-CudaFp8*:*Linear*:Cases/CudaAttention*:CudaOps.KvWrite*:CudaOps.QkvRotary*}" \
    --gtest_brief=1 >"$OUT/ops.log" 2>&1
  echo "ops rc=$?"; grep -E "FAILED|Failure|PASSED|Expected|Which is|actual" "$OUT/ops.log" | head -30
  ./$BIN/model_cuda_test --gtest_filter="${MODEL_FILTER:-*Fp8*:*PromptLogits*}" --gtest_brief=1 >"$OUT/model.log" 2>&1
  echo "model rc=$?"; grep -E "FAILED|PASSED|Failure|Expected|Which is|actual|prompt|graphs" "$OUT/model.log" | head -40
esac

case ,$STEPS, in *,bench7b,*)
  SHAPES="--prefill 1x2048,32x512 --decode 1x128x128,4x128x128,8x128x128,16x128x128,32x128x128,128x128x128 --first-token-prompt 128 --iters 3"
  run7b() {  # name, env, args
    env $2 ./$BIN/kestrel bench --device cuda --preset falcon-7b $SHAPES $3 >"$OUT/bench7b-$1.log" 2>&1
    echo "bench falcon-7b $1 rc=$?"; grep -vE "^\[" "$OUT/bench7b-$1.log" | tail -11
  }
  run7b bf16 "" ""
  run7b fp8 "" "--quantize fp8"
  run7b fp8-gemm-all KESTREL_GEMV=0 "--quantize fp8"
  run7b fp8-kvfp8 "" "--quantize fp8 --kv-cache-dtype fp8"
  run7b bf16-kvfp8 "" "--kv-cache-dtype fp8"
esac

case ,$STEPS, in *,bench40b,*)
  ./$BIN/kestrel bench --device cuda --preset falcon-40b --quantize fp8 --prefill 1x2048,32x512 \
    --decode 1x128x128,32x128x128,128x128x128 --first-token-prompt 128 --iters 2 >"$OUT/bench40b-fp8.log" 2>&1
  echo "bench falcon-40b fp8 rc=$?"; grep -vE "^\[" "$OUT/bench40b-fp8.log" | tail -9
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
esac

case ,$STEPS, in *,bench7b-short,*)  # the GEMV's rows, and K/V in FP8 at long contexts
  # B7_FP8_ONLY=1: the two FP8-weight runs alone (a short call)
  set -- "--quantize fp8" "--quantize fp8 --kv-cache-dtype fp8"
  [ "${B7_FP8_ONLY:-0}" = 1 ] || set -- "$@" "" "--kv-cache-dtype fp8"
  for q in "$@"; do
    ./$BIN/kestrel bench --device cuda --preset falcon-7b --prefill 1x2048 \
      --decode 1x128x128,2x128x128,4x128x128,32x2048x64,128x1024x32 --iters 3 $q >"$OUT/b7.log" 2>&1
    echo "bench falcon-7b '$q' rc=$?"; grep -E "^(prefill|decode)|peak|linears" "$OUT/b7.log" | cut -c1-150
  done
  # BF16 LoRA adapters over FP8 base linears, in CUDA graphs
  ./$BIN/kestrel bench --device cuda --preset falcon-7b --quantize fp8 --prefill '' \
    --decode 1x128x128,32x128x128 --first-token-prompt 0 --iters 3 --lora-adapters 1,8 >"$OUT/b7lora.log" 2>&1
  echo "bench falcon-7b fp8 + lora rc=$?"; grep -E "^(decode)|lora" "$OUT/b7lora.log" | cut -c1-150
esac

case ,$STEPS, in *,serve40b,*)  # falcon-40b FP8 on one card: KV tokens and 64 streams
  # On a larger card, the memory an H100 80GB would give (0.9 of its 79.2 GiB).
  FRACTION=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 |
    awk '{f = 0.9 * 81559 / $1; print (f > 0.9 ? 0.9 : f)}')
  for kv in ${SERVE_KV:-auto fp8}; do
    [ $(( $(date +%s) - T0 )) -lt ${SERVE_BY:-100000} ] || { echo "serve40b kv $kv: no time left"; break; }
    STEPS=serve PRESET=falcon-40b PORT=$((8100 + ${#kv})) OUT=$OUT/serve40b-$kv \
      SERVE_ARGS="--quantize fp8 --kv-cache-dtype $kv --max-running-seqs 64 --http-threads 4 --gpu-memory-fraction $FRACTION" \
      LOAD_ARGS="--requests 128 --concurrency 64 --prompt-tokens 128 --new-tokens 128" \
      timeout ${SERVE_TIMEOUT:-280} sh bench/gpu_serve.sh 2>&1 | grep -vE "^kestrel_" | tail -25
  done
esac
