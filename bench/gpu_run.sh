#!/bin/sh
# One device call: CUDA op tests, model fixtures on CUDA, `kestrel bench` on
# falcon-7b and the same shapes through transformers. Run from the repository
# root on the GPU machine, with build-gpucarry/ (binaries) and .gpulib/ (fmt, spdlog, utf8proc) carried (docs/gpu.md).
# Writes logs under $OUT (or ./gpu-out).
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BIN=${BIN:-build-gpucarry}

export KESTREL_TEST_DATA=$PWD/tests/data  # the fixtures, wherever the test binaries were built
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
STEPS=${STEPS:-ops,model,bench,hf}
case ,$STEPS, in *,ops,*)
  ./$BIN/backend_cuda_test --gtest_brief=1 >"$OUT/ops.log" 2>&1
  echo "ops rc=$?"; grep -E "FAILED|Failure|PASSED|Expected|Which is|kernel" "$OUT/ops.log" | head -40
esac
case ,$STEPS, in *,model,*)
  ./$BIN/model_cuda_test --gtest_brief=1 >"$OUT/model.log" 2>&1
  echo "model rc=$?"; grep -E "FAILED|PASSED|decode rel|Failure|Expected|Which is" "$OUT/model.log" | head -60
esac
case ,$STEPS, in *,bench,*)
  ./$BIN/kestrel bench --device cuda --preset falcon-7b ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  echo "bench rc=$?"; cat "$OUT/bench.log" | tail -15
esac
case ,$STEPS, in *,hf,*)
  timeout 300 python3 bench/falcon_hf_bench.py --preset falcon-7b >"$OUT/hf.log" 2>&1
  echo "hf rc=$?"; tail -10 "$OUT/hf.log"
esac
