#!/bin/sh
# One device call for the tensor-core attention (docs/gpu.md "Attention v3"):
# v2 vs v3 kernel timings, the op tests, graph / fixture model tests, kestrel
# bench with v3 and with v2 (KESTREL_ATTN_MMA=2), ncu of v3 at prefill 1x2048,
# memcheck of the attention op tests. Carry $BIN (binaries) and .gpulib; logs under $OUT.
set -u
OUT=${OUT:-gpu-out}
BIN=${BIN:-build-h2carry}
mkdir -p "$OUT"
export KESTREL_TEST_DATA=$PWD/tests/data  # the fixtures, wherever the test binaries were built
[ -z "${DATA_ROOT:-}" ] || [ -e "$DATA_ROOT" ] || { mkdir -p "$(dirname "$DATA_ROOT")" && ln -s "$PWD" "$DATA_ROOT"; }
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
STEPS=${STEPS:-timing,ops,bench,benchv2,model,ncu,memcheck}
SHAPES="--prefill 1x2048,8x512,32x512 --decode 1x128x128,32x128x128,128x128x128 --first-token-prompt 128 --iters 3"
case ,$STEPS, in *,timing,*)
  ./$BIN/backend_cuda_test --gtest_also_run_disabled_tests --gtest_filter='CudaAttention.DISABLED_Timing*' >"$OUT/timing.log" 2>&1
  echo "timing rc=$?"; grep -E "^attention|FAILED" "$OUT/timing.log"
esac
case ,$STEPS, in *,ops,*)
  ./$BIN/backend_cuda_test --gtest_brief=1 >"$OUT/ops.log" 2>&1
  echo "ops rc=$?"; grep -E "FAILED|Failure|PASSED|Expected|Which is|kernel" "$OUT/ops.log" | head -40
esac
case ,$STEPS, in *,bench,*)
  ./$BIN/kestrel bench --device cuda --preset falcon-7b $SHAPES >"$OUT/bench_v3.log" 2>&1
  echo "bench v3 rc=$?"; tail -12 "$OUT/bench_v3.log"
esac
case ,$STEPS, in *,benchv2,*)
  KESTREL_ATTN_MMA=2 ./$BIN/kestrel bench --device cuda --preset falcon-7b $SHAPES >"$OUT/bench_v2.log" 2>&1
  echo "bench v2 rc=$?"; tail -12 "$OUT/bench_v2.log"
esac
case ,$STEPS, in *,model,*)
  ./$BIN/model_cuda_test --gtest_brief=1 --gtest_filter='Fixtures*:CudaGraph*:DecodeGraph*' >"$OUT/model.log" 2>&1
  echo "model rc=$?"; grep -E "FAILED|PASSED|Failure|Expected|Which is" "$OUT/model.log" | head -30
esac
case ,$STEPS, in *,ncu,*)  # v3 (4 warps x 32 rows, double K) at falcon-7b prefill 1x2048
  timeout 120 ncu --clock-control none --kernel-name-base mangled -k 'regex:Li64ELi2ELi4ELb0ELb1E' \
    --launch-skip 3 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section ComputeWorkloadAnalysis ./$BIN/backend_cuda_test --gtest_also_run_disabled_tests \
    --gtest_filter='CudaAttention.DISABLED_Timing*' >"$OUT/ncu.log" 2>&1
  echo "ncu rc=$?"; grep -E "Duration|Throughput|Occupancy|Stall|Issue|Warp Cycles|Registers|Pipe|Executed Ipc" "$OUT/ncu.log" | head -40
esac
case ,$STEPS, in *,memcheck,*)
  timeout ${MEMCHECK_S:-120} compute-sanitizer --tool memcheck ./$BIN/backend_cuda_test --gtest_brief=1 \
    --gtest_filter="${MEMCHECK_FILTER:-*CudaAttention.MatchesCpu*}" >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.log" | head; tail -3 "$OUT/memcheck.log"
esac
