#!/bin/sh
# One device call for the fused one-row LoRA kernel (docs/lora.md, "One kernel per one-row LoRA
# add"): op tests (both forms, tables with GELU), the model tests, memcheck of the new paths, the
# op timing with the pair and the fused form, and `kestrel bench` LoRA decode rows with the fused
# form (default) and with the pair (KESTREL_LORA_FUSED=0, the form before: the baseline in the
# same call), then ncu of the LoRA kernels of one batch-32 step with 32 adapters.
# Run from the repository root on the GPU machine with $BIN (default build-gpucarry/: kestrel,
# backend_cuda_test, model_cuda_test) and .gpulib/. STEPS picks among
# ops,model,sanitize,timing,bench,eager,ncu (eager: bench with --cuda-graphs off over
# EAGER_MODES); OPS_FILTER the op tests; FUSED_MODES / NCU_MODES the
# KESTREL_LORA_FUSED values timed / profiled (2: fused without the bulk stage). Logs under $OUT.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BIN=${BIN:-build-gpucarry}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
STEPS=${STEPS:-ops,model,sanitize,timing,bench,ncu}
t0=$(date +%s)
lap() { echo "  [$(($(date +%s) - t0)) s]"; }
case ,$STEPS, in *,ops,*)
  timeout 300 ./$BIN/backend_cuda_test --gtest_brief=1 --gtest_filter="${OPS_FILTER:-*}" >"$OUT/ops.log" 2>&1
  echo "ops rc=$?"; grep -E "FAILED|Failure|PASSED|Expected|Which is|error" "$OUT/ops.log" | head -30; lap
esac
case ,$STEPS, in *,model,*)
  timeout 300 ./$BIN/model_cuda_test --gtest_brief=1 >"$OUT/model.log" 2>&1
  echo "model rc=$?"; grep -E "FAILED|PASSED|Failure|Expected|Which is" "$OUT/model.log" | head -30; lap
esac
case ,$STEPS, in *,sanitize,*)
  timeout 240 compute-sanitizer --tool memcheck ./$BIN/backend_cuda_test \
    --gtest_filter='CudaOps.LoraAddTable*' >"$OUT/memcheck-ops.log" 2>&1
  echo "memcheck ops rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck-ops.log" | head
  timeout 200 compute-sanitizer --tool memcheck ./$BIN/model_cuda_test \
    --gtest_filter='CudaLoraGraphTest.Falcon7bMqa*:CudaLoraGraphTest.Falcon40b*' \
    >"$OUT/memcheck-model.log" 2>&1
  echo "memcheck model rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck-model.log" | head
  lap
esac
case ,$STEPS, in *,timing,*)
  for f in ${FUSED_MODES:-0 1}; do
    KESTREL_LORA_FUSED=$f timeout 120 ./$BIN/backend_cuda_test --gtest_also_run_disabled_tests \
      --gtest_filter='CudaOps.DISABLED_LoraDecodeTimingFalcon7b' >"$OUT/timing-fused$f.log" 2>&1
    echo "timing KESTREL_LORA_FUSED=$f rc=$?"; grep "lora decode" "$OUT/timing-fused$f.log"
  done
  lap
esac
B="./$BIN/kestrel bench --device cuda --preset falcon-7b --prefill '' --first-token-prompt 0"
case ,$STEPS, in *,bench,*)
  for f in ${FUSED_MODES:-1 0}; do
    eval KESTREL_LORA_FUSED=$f timeout 200 $B --decode 1x128x128,32x128x128 --iters 3 \
      --lora-adapters 1,8,32 --lora-rank 16 --cuda-graphs on >"$OUT/lora-fused$f.log" 2>&1
    echo "bench lora KESTREL_LORA_FUSED=$f rc=$?"; grep -iE "^decode|lora|adapters" "$OUT/lora-fused$f.log" | tail -12
    lap
  done
esac
case ,$STEPS, in *,eager,*)
  for f in ${EAGER_MODES:--1 0}; do
    eval KESTREL_LORA_FUSED=$f timeout 200 $B --decode 1x128x128,32x128x128 --iters 3 \
      --lora-adapters 1,8,32 --lora-rank 16 --cuda-graphs off >"$OUT/lora-eager-fused$f.log" 2>&1
    echo "bench lora, graphs off, KESTREL_LORA_FUSED=$f rc=$?"
    grep -iE "^decode|lora|adapters" "$OUT/lora-eager-fused$f.log" | tail -12
    lap
  done
esac
case ,$STEPS, in *,ncu,*)
  for f in ${NCU_MODES:-1 0}; do
    KESTREL_LORA_FUSED=$f timeout 150 ncu --clock-control none -k regex:lora --metrics \
      gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread \
      ./$BIN/kestrel bench --device cuda --preset falcon-7b --layers 2 --iters 1 \
      --first-token-prompt 0 --prefill 1x1 --decode 32x128x3 --cuda-graphs on \
      --lora-adapters 32 --lora-rank 16 >"$OUT/ncu_lora32_fused$f.log" 2>&1
    echo "ncu lora 32x32 KESTREL_LORA_FUSED=$f rc=$?"
  done
  lap
esac
