#!/bin/sh
# One device call for the CUDA backend, its steps chosen by STEPS (comma-separated; default
# ops,model,bench,hf). Run from the repository root on the GPU machine with $BIN
# (build-gpucarry: kestrel, backend_cuda_test, model_cuda_test, cuda_ops_bench) and .gpulib/
# carried (docs/gpu.md). Logs under $OUT (or ./gpu-out).
#   ops       every CUDA op against its CPU twin (backend_cuda_test; OPS_FILTER narrows it)
#   model     the fixtures, CUDA graphs and LoRA on CUDA (model_cuda_test; MODEL_FILTER)
#   bench     kestrel bench --preset falcon-7b (BENCH_ARGS), with the card's copy bandwidth
#   hf        the same shapes through transformers (bench/falcon_hf_bench.py)
#   timing    the kernels alone at falcon-7b's shapes (cuda_ops_bench; TIMING_FILTER)
#   ncu       per-kernel device times of a 2-layer falcon-7b step (ncu, clocks untouched)
#   memcheck  compute-sanitizer over the op tests and the graph tests
#   lora      the LoRA fixtures through `kestrel logits --device cuda` (bench/lora_cuda_check.py)
# Serving loads are bench/gpu_serve.sh, FP8 runs bench/fp8_gpu_run.sh, several GPUs
# bench/multi_gpu.sh.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BIN=${BIN:-build-gpucarry}
export KESTREL_TEST_DATA=$PWD/tests/data  # the fixtures, wherever the test binaries were built
export KESTREL_BINARY=$PWD/$BIN/kestrel   # for the tests that run it
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
STEPS=${STEPS:-ops,model,bench,hf}
case ,$STEPS, in *,ops,*)
  timeout 300 ./$BIN/backend_cuda_test --gtest_brief=1 --gtest_filter="${OPS_FILTER:-*}" >"$OUT/ops.log" 2>&1
  echo "ops rc=$?"; grep -E "FAILED|Failure|PASSED|Expected|Which is|kernel" "$OUT/ops.log" | head -40
esac
case ,$STEPS, in *,model,*)
  timeout 300 ./$BIN/model_cuda_test --gtest_brief=1 --gtest_filter="${MODEL_FILTER:-*}" >"$OUT/model.log" 2>&1
  echo "model rc=$?"; grep -E "FAILED|PASSED|decode rel|Failure|Expected|Which is" "$OUT/model.log" | head -60
esac
case ,$STEPS, in *,bench,*)
  timeout 300 ./$BIN/kestrel bench --device cuda --preset falcon-7b ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  echo "bench rc=$?"; tail -15 "$OUT/bench.log"
esac
case ,$STEPS, in *,hf,*)
  timeout 300 python3 bench/falcon_hf_bench.py --preset falcon-7b >"$OUT/hf.log" 2>&1
  echo "hf rc=$?"; tail -10 "$OUT/hf.log"
esac
case ,$STEPS, in *,timing,*)
  timeout 300 ./$BIN/cuda_ops_bench --benchmark_filter="${TIMING_FILTER:-.}" >"$OUT/timing.log" 2>&1
  echo "timing rc=$?"; grep -E "^BM_" "$OUT/timing.log" | head -150
esac
case ,$STEPS, in *,ncu,*)
  for shape in "--prefill 1x2048 --decode 1x1x1" "--prefill 1x1 --decode 1x128x3" "--prefill 1x1 --decode 128x128x3"; do
    name=$(echo "$shape" | tr -c 'a-z0-9\n' '_' | cut -c1-60)
    timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
      ./$BIN/kestrel bench --device cuda --preset falcon-7b --layers 2 --iters 1 --first-token-prompt 0 \
      $shape >"$OUT/ncu_$name.log" 2>&1
    echo "ncu $shape rc=$?"
  done
esac
case ,$STEPS, in *,memcheck,*)
  timeout ${MEMCHECK_S:-240} "$CS" --tool memcheck ./$BIN/backend_cuda_test --gtest_brief=1 \
    --gtest_filter="${MEMCHECK_FILTER:-*Attention*:CudaOps.*:CudaFp8*}" >"$OUT/memcheck-ops.log" 2>&1
  echo "memcheck ops rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck-ops.log" | head
  timeout ${MEMCHECK_S:-240} "$CS" --tool memcheck ./$BIN/model_cuda_test --gtest_brief=1 \
    --gtest_filter='CudaGraph*:DecodeGraph*' >"$OUT/memcheck-graphs.log" 2>&1
  echo "memcheck graphs rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck-graphs.log" | head
esac
case ,$STEPS, in *,lora,*)
  timeout 150 python3 bench/lora_cuda_check.py ./$BIN/kestrel >"$OUT/lora.log" 2>&1
  echo "lora rc=$?"; tail -12 "$OUT/lora.log"
esac
