#!/bin/sh
# One device call for programmatic dependent launch (docs/gpu.md, "PDL"): the op tests with
# every kernel launched as a programmatic dependent (KESTREL_PDL=2, eager), the model tests
# (graphs use PDL by default) and the same with KESTREL_PDL=0, memcheck of the graph tests,
# then `kestrel bench` decode with PDL off / on / on with the GEMV's L2 prefetch, LoRA rows,
# and prefill with PDL in eager launches. Run from the repository root on the GPU machine with
# $BIN (default build-gpucarry/: kestrel, backend_cuda_test, model_cuda_test) and .gpulib/.
# STEPS picks among ops,model,sanitize,decode,lora,prefill,ncu. Logs under $OUT.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BIN=${BIN:-build-gpucarry}
export KESTREL_TEST_DATA=$PWD/tests/data  # the fixtures, wherever the test binaries were built
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
STEPS=${STEPS:-ops,model,sanitize,decode,lora,prefill,ncu}
B="./$BIN/kestrel bench --device cuda --preset falcon-7b"
case ,$STEPS, in *,ops,*)
  KESTREL_PDL=2 timeout 240 ./$BIN/backend_cuda_test --gtest_brief=1 >"$OUT/ops-pdl2.log" 2>&1
  echo "ops KESTREL_PDL=2 rc=$?"; grep -E "FAILED|Failure|PASSED|Expected|Which is" "$OUT/ops-pdl2.log" | head -30
esac
case ,$STEPS, in *,model,*)
  timeout 300 ./$BIN/model_cuda_test --gtest_brief=1 >"$OUT/model.log" 2>&1
  echo "model (PDL in graphs) rc=$?"; grep -E "FAILED|PASSED|Failure|Expected|Which is" "$OUT/model.log" | head -30
  KESTREL_PDL=2 timeout 200 ./$BIN/model_cuda_test --gtest_brief=1 \
    --gtest_filter='Fixtures*:CudaLoraGraph*' >"$OUT/model-pdl2.log" 2>&1
  echo "model KESTREL_PDL=2 rc=$?"; grep -E "FAILED|PASSED|Failure" "$OUT/model-pdl2.log" | head -20
esac
case ,$STEPS, in *,sanitize,*)
  timeout 200 compute-sanitizer --tool memcheck ./$BIN/model_cuda_test \
    --gtest_filter='DecodeGraph*:CudaLoraGraphTest.Falcon7bMqa*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.log" | head
  KESTREL_PDL=2 timeout 200 compute-sanitizer --tool memcheck ./$BIN/backend_cuda_test \
    --gtest_filter='CudaLinear.*:CudaOps.Lora*' >"$OUT/memcheck-ops.log" 2>&1
  echo "memcheck ops KESTREL_PDL=2 rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck-ops.log" | head
esac
D="--prefill '' --decode 1x128x128,32x128x128,128x128x128 --first-token-prompt 0 --iters 3"
case ,$STEPS, in *,decode,*)
  for cfg in "0 1" "1 0" "1 1"; do
    set -- $cfg
    export KESTREL_PDL=$1 KESTREL_GEMV_PREFETCH=$2
    eval timeout 150 $B $D >"$OUT/decode-pdl$1-pf$2.log" 2>&1
    echo "decode KESTREL_PDL=$1 KESTREL_GEMV_PREFETCH=$2 rc=$?"
    unset KESTREL_PDL KESTREL_GEMV_PREFETCH
    grep -E "^decode|queued" "$OUT/decode-pdl$1-pf$2.log"
  done
esac
case ,$STEPS, in *,lora,*)
  eval timeout 200 $B --prefill "''" --decode 1x128x128,32x128x128 --first-token-prompt 0 \
    --iters 3 --lora-adapters 1,8,32 --lora-rank 16 --cuda-graphs on >"$OUT/lora.log" 2>&1
  echo "lora rc=$?"; tail -14 "$OUT/lora.log"
esac
case ,$STEPS, in *,prefill,*)
  for pdl in 1 2; do
    KESTREL_PDL=$pdl timeout 150 $B --prefill 1x2048,8x512,32x512 --decode '' \
      --first-token-prompt 128 >"$OUT/prefill-pdl$pdl.log" 2>&1
    echo "prefill KESTREL_PDL=$pdl rc=$?"; grep -E "^prefill|first" "$OUT/prefill-pdl$pdl.log"
  done
esac
case ,$STEPS, in *,ncu,*)
  # Per-kernel device times of decode steps at batch 128 and 1 (2 layers; graphs off, so each
  # kernel is its own launch under ncu).
  for shape in ${NCU_SHAPES:-128x128x3 1x128x3}; do
    timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary \
      per-kernel ./$BIN/kestrel bench --device cuda --preset falcon-7b --layers 2 --iters 1 \
      --first-token-prompt 0 --prefill 1x1 --decode $shape --cuda-graphs off \
      >"$OUT/ncu_$shape.log" 2>&1
    echo "ncu decode $shape rc=$?"
  done
  # The LoRA kernels of a batch-32 step with 32 adapters: time, DRAM throughput, occupancy.
  timeout 200 ncu --clock-control none -k regex:lora --metrics \
    gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread \
    ./$BIN/kestrel bench --device cuda --preset falcon-7b --layers 2 --iters 1 \
    --first-token-prompt 0 --prefill 1x1 --decode 32x128x3 --cuda-graphs on \
    --lora-adapters 32 --lora-rank 16 >"$OUT/ncu_lora32.log" 2>&1
  echo "ncu lora 32x32 rc=$?"
esac
