#!/bin/sh
# One device call for the CUDA LoRA kernels (docs/lora.md, "CUDA"): the LoRA op tests, the op's
# decode timing at falcon-7b shapes with the expand as a programmatic dependent launch and
# without, the lora fixtures through `kestrel logits --device cuda` (bench/lora_cuda_check.py),
# `kestrel bench` with random adapters (graphs off, then on), and LoRA decode steps in CUDA graphs
# against eager and the CPU (model_cuda_test, `graphs`; `graphsan`: the same under memcheck).
# Run from the repository root on the GPU machine with $BIN (default build-lora-gpucarry/:
# kestrel, backend_cuda_test, model_cuda_test) and .gpulib/ carried.
# STEPS picks among graphs,ops,sanitize,timing,fixtures,bench,graphsan. Logs under $OUT.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BIN=${BIN:-build-lora-gpucarry}
export KESTREL_TEST_DATA=$PWD/tests/data  # the fixtures, wherever the test binaries were built
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
STEPS=${STEPS:-ops,timing,fixtures,bench}
T="--gtest_filter=CudaOps.DISABLED_LoraDecodeTimingFalcon7b --gtest_also_run_disabled_tests"
case ,$STEPS, in *,graphs,*)
  timeout 200 ./$BIN/model_cuda_test --gtest_filter='CudaLoraGraph*:CudaGraph*' \
    >"$OUT/graphs.log" 2>&1
  echo "graphs rc=$?"; grep -E "FAILED|Failure|PASSED|Expected|Which is|error|lora graphs|OK \]" \
    "$OUT/graphs.log" | head -40
esac
case ,$STEPS, in *,ops,*)
  timeout 120 ./$BIN/backend_cuda_test --gtest_filter='CudaOps.Lora*' >"$OUT/ops.log" 2>&1
  echo "ops rc=$?"; grep -E "FAILED|Failure|PASSED|Expected|Which is|error|lora_add delta|OK \]" "$OUT/ops.log" | head -40
esac
case ,$STEPS, in *,sanitize,*)
  timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool memcheck ./$BIN/backend_cuda_test \
    --gtest_filter='CudaOps.Lora*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.log" | head
esac
case ,$STEPS, in *,timing,*)
  for pdl in 1 0; do
    KESTREL_LORA_PDL=$pdl timeout 120 ./$BIN/backend_cuda_test $T >"$OUT/timing-pdl$pdl.log" 2>&1
    echo "timing KESTREL_LORA_PDL=$pdl rc=$?"; grep "lora decode" "$OUT/timing-pdl$pdl.log"
  done
esac
case ,$STEPS, in *,fixtures,*)
  timeout 150 python3 bench/lora_cuda_check.py ./$BIN/kestrel >"$OUT/fixtures.log" 2>&1
  echo "fixtures rc=$?"; cat "$OUT/fixtures.log"
esac
case ,$STEPS, in *,bench,*)
  timeout 200 ./$BIN/kestrel bench --device cuda --preset falcon-7b --prefill '' \
    --decode 1x128x128,32x128x128 --first-token-prompt 0 --iters 3 --lora-adapters 1,8,32 \
    --lora-rank 16 --cuda-graphs both ${BENCH_EXTRA:-} >"$OUT/bench.log" 2>&1
  echo "bench rc=$?"; tail -24 "$OUT/bench.log"
esac
case ,$STEPS, in *,graphsan,*)
  timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool memcheck ./$BIN/model_cuda_test \
    --gtest_filter='CudaLoraGraphTest.Falcon40b*:CudaLoraGraphTest.Falcon7bMqa*' \
    >"$OUT/graphsan.log" 2>&1
  echo "graphsan rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/graphsan.log" | head
esac
