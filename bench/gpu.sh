#!/bin/sh
# Every device call of kestrel's, its steps chosen by STEPS (comma-separated; default
# ops,model,bench,hf). Run from the repository root on the GPU machine with the binaries in $BIN
# (build-gpucarry: kestrel, cuda_ops_bench and the test binaries; unpacked from
# build-gpupack/bin.tar.xz when that was carried and $BIN is missing) and .gpulib/ carried
# (docs/gpu.md). Logs under $OUT (or ./gpu-out).
#
# The CUDA backend, one GPU:
#   ops          every CUDA op against its CPU twin (backend_cuda_test; OPS_FILTER narrows it)
#   sampler      the GPU sampler against the CPU's (engine_test SamplerCuda*)
#   model        the fixtures, CUDA graphs and LoRA on CUDA (model_cuda_test; MODEL_FILTER)
#   bench        kestrel bench --preset falcon-7b (BENCH_ARGS), with the card's copy bandwidth
#   hf           the same shapes through transformers (bench/falcon_hf_bench.py)
#   timing       the kernels alone at falcon-7b's shapes (cuda_ops_bench; TIMING_FILTER)
#   ncu          per-kernel device times of a 2-layer falcon-7b step (ncu, clocks untouched)
#   memcheck     compute-sanitizer over the op tests and the graph tests (MEMCHECK_FILTER)
#   lora         the LoRA fixtures through `kestrel logits --device cuda` (lora_cuda_check.py)
#   gemm         the wgmma decode GEMM (KESTREL_DECODE_GEMM): the linear op test, its timings
#                against cuBLASLt, then kestrel bench at decode batch 4-128 and a 128-token first
#                token with it and without (GEMM_TIMING_FILTER, GEMM_MODES, GEMM_BENCH_ARGS)
#   two          two products in one launch (KESTREL_TWO_PRODUCTS): the linear op tests, the
#                model tests with it on (and with KESTREL_DECODE_GEMM=4), BM_Residual / BM_Pair,
#                then kestrel bench at decode batch 1-128 with it off and on, by
#                KESTREL_DECODE_GEMM 0 and -1, twice (TWO_BENCH_ARGS)
#   norm         the LayerNorm folded into the pair's GEMV (KESTREL_NORM_IN_GEMV): the linear
#                op tests, the model tests, BM_Pair / BM_Residual at 1-2 rows by GEMV variant
#                (NORM_GEMV), then kestrel bench at decode batch 1-2 with it off and on, twice
#                (NORM_BENCH_ARGS)
#   gemm-ncu     ncu sections (throughput, memory, warp stalls) of one launch of each
#                GEMM_NCU case (cuda_ops_bench DecodeGemm arguments shape/rows/mode; mode 0 is
#                cuBLASLt)
# Engine and server:
#   generate     `generate --device cuda` against `--device cpu` on the e2e fixture, and logits
#   serve        `kestrel serve --device cuda` on a random falcon-7b folder written on the
#                machine's disk (MODEL, RANDOM_ARGS; PRESET=NAME: that preset's weights drawn on
#                the device instead), warmed up, then bench/serve_load.py (LOAD_ARGS; LOAD2_ARGS:
#                a second run, then the first again), SERVE_ARGS for the server
#   fairness     FAIR_ADAPTERS (32) random adapters, the quiet ones' time to first token alone
#                and beside one sending 10x (bench/adapter_fairness.py; FAIR_ARGS)
# FP8:
#   fp8-tests    the FP8 op, attention and fixture tests (FP8_OPS_FILTER, FP8_MODEL_FILTER)
#   fp8-bench7b  falcon-7b in BF16, --quantize fp8, the FP8 GEMM at every row count, FP8 K/V
#   fp8-bench40b falcon-40b with --quantize fp8
#   fp8-short    the FP8 GEMV's rows, FP8 K/V at long contexts (B7_FP8_ONLY=1: FP8 weights
#                alone), LoRA over FP8 base linears
#   fp8-serve40b falcon-40b FP8 served on one card (SERVE_KV: auto fp8), 64 streams
# Several GPUs:
#   multi        tensor parallelism, one process per GPU (N GPUs, PRESETS; docs/parallel.md):
#                logits of N processes against 1, then bench at 1 and N (DECODE, PREFILL)
set -u
OUT=${OUT:-gpu-out}
BIN=${BIN:-build-gpucarry}
STEPS=${STEPS:-ops,model,bench,hf}
T0=$(date +%s)
mkdir -p "$OUT"
if [ ! -e "$BIN/kestrel" ] && [ -e build-gpupack/bin.tar.xz ]; then
  mkdir -p "$BIN" && tar -xJf build-gpupack/bin.tar.xz -C "$BIN"
fi
export KESTREL_TEST_DATA=$PWD/tests/data  # the fixtures, wherever the test binaries were built
export KESTREL_BINARY=$PWD/$BIN/kestrel   # for the tests that run it
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0                 # NVLink multicast stays off (device documentation)
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
nvidia-smi --query-gpu=index,name,memory.used,memory.total,clocks.sm --format=csv,noheader
has() { case ,$STEPS, in *,$1,*) return 0 ;; esac; return 1; }

# --- the CUDA backend -----------------------------------------------------------------------
if has ops; then
  timeout 300 ./$BIN/backend_cuda_test --gtest_brief=1 --gtest_filter="${OPS_FILTER:-*}" >"$OUT/ops.log" 2>&1
  echo "ops rc=$?"; grep -E "FAILED|Failure|PASSED|Expected|Which is|kernel" "$OUT/ops.log" | head -40
fi
if has sampler; then
  timeout 120 ./$BIN/engine_test --gtest_filter='SamplerCuda*' >"$OUT/sampler.log" 2>&1
  echo "sampler rc=$?"; grep -E "FAILED|Failure|PASSED|OK \]|Expected|Which is|mask of|row" "$OUT/sampler.log" | head -30
fi
if has model; then
  timeout 300 ./$BIN/model_cuda_test --gtest_brief=1 --gtest_filter="${MODEL_FILTER:-*}" >"$OUT/model.log" 2>&1
  echo "model rc=$?"; grep -E "FAILED|PASSED|decode rel|Failure|Expected|Which is" "$OUT/model.log" | head -60
fi
if has bench; then
  timeout 300 ./$BIN/kestrel bench --device cuda --preset falcon-7b ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  echo "bench rc=$?"; tail -15 "$OUT/bench.log"
fi
if has hf; then
  timeout 300 python3 bench/falcon_hf_bench.py --preset falcon-7b >"$OUT/hf.log" 2>&1
  echo "hf rc=$?"; tail -10 "$OUT/hf.log"
fi
if has timing; then
  timeout 300 ./$BIN/cuda_ops_bench --benchmark_filter="${TIMING_FILTER:-.}" >"$OUT/timing.log" 2>&1
  echo "timing rc=$?"; grep -E "^BM_" "$OUT/timing.log" | head -150
fi
if has gemm; then
  timeout 120 ./$BIN/backend_cuda_test --gtest_brief=1 --gtest_filter='CudaLinear*' >"$OUT/gemm-test.log" 2>&1
  rc=$?; echo "linear rc=$rc"; grep -E "PASSED|FAILED|Failure|decode gemm" "$OUT/gemm-test.log" | head -20
  [ $rc -eq 0 ] || [ -n "${GEMM_ANYWAY:-}" ] || STEPS=none
fi
if has gemm; then
  timeout 150 ./$BIN/cuda_ops_bench --benchmark_filter="${GEMM_TIMING_FILTER:-DecodeGemm}" >"$OUT/gemm-timing.log" 2>&1
  echo "timing rc=$?"; grep -E "^BM_" "$OUT/gemm-timing.log" | sed 's/min_time:0.050.manual_time//' | head -60
  for e in ${GEMM_MODES:-0 1 2 0 1 2}; do
    echo "== KESTREL_DECODE_GEMM=$e"
    KESTREL_DECODE_GEMM=$e timeout 90 ./$BIN/kestrel bench --device cuda --preset falcon-7b \
      ${GEMM_BENCH_ARGS:---prefill 1x16 --decode 4x32x32,16x32x32,32x64x64,64x32x32,128x64x64 --first-token-prompt 128 --iters 2 --no-roofline} \
      2>&1 | grep -E "^decode|^first|^prefill|rror"
  done
fi
if has two; then
  timeout 150 ./$BIN/backend_cuda_test --gtest_brief=1 --gtest_filter='CudaLinear*' >"$OUT/two-linear.log" 2>&1
  echo "linear rc=$?"; grep -E "PASSED|FAILED|Failure|decode gemm|gemv" "$OUT/two-linear.log" | head -20
  for dg in 0 4; do
    KESTREL_TWO_PRODUCTS=1 KESTREL_DECODE_GEMM=$dg timeout 200 ./$BIN/model_cuda_test --gtest_brief=1 \
      >"$OUT/two-model-$dg.log" 2>&1
    echo "model (decode gemm $dg) rc=$?"; grep -E "PASSED|FAILED|Failure|Expected|Which" "$OUT/two-model-$dg.log" | head -12
  done
  timeout 120 ./$BIN/cuda_ops_bench --benchmark_filter='Residual|Pair' >"$OUT/two-timing.log" 2>&1
  echo "timing rc=$?"; grep -E "^BM_" "$OUT/two-timing.log" | sed 's/min_time:0.050.manual_time//' | head -90
  for r in 1 2; do
    for cfg in "0 0" "1 0" "1 -1" "0 -1"; do
      set -- $cfg
      echo "== KESTREL_TWO_PRODUCTS=$1 KESTREL_DECODE_GEMM=$2"
      KESTREL_TWO_PRODUCTS=$1 KESTREL_DECODE_GEMM=$2 timeout 100 ./$BIN/kestrel bench --device cuda \
        --preset falcon-7b ${TWO_BENCH_ARGS:---prefill 1x16 --decode 1x128x128,2x128x128,4x64x64,16x64x64,32x64x64,128x32x32 --first-token-prompt 128 --iters 2 --no-roofline} \
        2>&1 | grep -E "^decode|^first|rror" | cut -c1-110
    done
  done
fi
if has norm; then
  timeout 150 ./$BIN/backend_cuda_test --gtest_brief=1 --gtest_filter='CudaLinear*' >"$OUT/norm-linear.log" 2>&1
  echo "linear rc=$?"; grep -E "PASSED|FAILED|Failure|fold|Expected|Which" "$OUT/norm-linear.log" | head -20
  KESTREL_NORM_IN_GEMV=1 timeout 200 ./$BIN/model_cuda_test --gtest_brief=1 >"$OUT/norm-model.log" 2>&1
  echo "model rc=$?"; grep -E "PASSED|FAILED|Failure|Expected|Which" "$OUT/norm-model.log" | head -12
  for g in ${NORM_GEMV:--1 5 6}; do
    KESTREL_GEMV=$g timeout 100 ./$BIN/cuda_ops_bench \
      --benchmark_filter='BM_(Pair/[12]/[012]|Residual/[12]/[01])/-1/' 2>&1 \
      | grep -E "^BM_" | sed "s/^/gemv $g: /;s/min_time:0.050.manual_time//"
  done
  for r in 1 2; do
    for n in 0 1; do
      echo "== KESTREL_NORM_IN_GEMV=$n"
      KESTREL_NORM_IN_GEMV=$n timeout 100 ./$BIN/kestrel bench --device cuda --preset falcon-7b \
        ${NORM_BENCH_ARGS:---prefill 1x16 --decode 1x128x128,2x128x128 --first-token-prompt 0 --iters 2 --no-roofline} \
        2>&1 | grep -E "^decode|^first|rror" | cut -c1-110
    done
  done
fi
if has gemm-ncu; then
  for c in ${GEMM_NCU:-0/128/0 0/128/3 2/32/0 2/32/3}; do
    timeout 120 ncu --launch-skip 12 --launch-count 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      ./$BIN/cuda_ops_bench --benchmark_filter="BM_DecodeGemm/$c/" \
      >"$OUT/gemm-ncu-$(echo "$c" | tr / -).log" 2>&1
    echo "gemm-ncu $c rc=$?"
    grep -E "^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|L2 Cache Throughput|Memory Throughput|Compute \(SM\)|Stall|Warp Cycles Per Issued|No Eligible" \
      "$OUT/gemm-ncu-$(echo "$c" | tr / -).log" | head -16
  done
fi
if has ncu; then
  for shape in "--prefill 1x2048 --decode 1x1x1" "--prefill 1x1 --decode 1x128x3" "--prefill 1x1 --decode 128x128x3"; do
    name=$(echo "$shape" | tr -c 'a-z0-9\n' '_' | cut -c1-60)
    timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
      ./$BIN/kestrel bench --device cuda --preset falcon-7b --layers 2 --iters 1 --first-token-prompt 0 \
      $shape >"$OUT/ncu_$name.log" 2>&1
    echo "ncu $shape rc=$?"
  done
fi
if has memcheck; then
  timeout ${MEMCHECK_S:-240} "$CS" --tool memcheck ./$BIN/backend_cuda_test --gtest_brief=1 \
    --gtest_filter="${MEMCHECK_FILTER:-*Attention*:CudaOps.*:CudaFp8*}" >"$OUT/memcheck-ops.log" 2>&1
  echo "memcheck ops rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck-ops.log" | head
  timeout ${MEMCHECK_S:-240} "$CS" --tool memcheck ./$BIN/model_cuda_test --gtest_brief=1 \
    --gtest_filter='CudaGraph*:DecodeGraph*' >"$OUT/memcheck-graphs.log" 2>&1
  echo "memcheck graphs rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck-graphs.log" | head
fi
if has lora; then
  timeout 150 python3 bench/lora_cuda_check.py ./$BIN/kestrel >"$OUT/lora.log" 2>&1
  echo "lora rc=$?"; tail -12 "$OUT/lora.log"
fi

# --- engine and server ----------------------------------------------------------------------
MODEL=${MODEL:-/tmp/kestrel-falcon7b-random}
PORT=${PORT:-8080}
LOAD_ARGS=${LOAD_ARGS:---requests 256 --concurrency 256 --prompt-tokens 128 --new-tokens 128}
SERVE_ARGS=${SERVE_ARGS:---max-running-seqs 256 --http-threads 4}
TOKENIZER=tests/data/tokenizer/falcon-tokenizer.json

# Waits up to 180 s for $SERVER to answer /health on $PORT; sets ok=1 when it does.
wait_healthy() {
  ok=0
  for i in $(seq 1 180); do
    if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" 2>/dev/null; then ok=1; break; fi
    kill -0 $SERVER 2>/dev/null || break
    sleep 1
  done
  echo "server up=$ok after ${i}s"; grep -E "load |loaded|memory|KV|profile|engine ready|error" "$1" | head -30
}
# The server's /metrics into $OUT/metrics.txt.
save_metrics() {
  python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" \
    >"$OUT/metrics.txt" 2>&1
}
stop_server() {
  kill -INT $SERVER 2>/dev/null; sleep 3; kill -9 $SERVER 2>/dev/null
}

if has generate; then
  M=tests/data/e2e-falcon7b-fullvocab
  echo '[[1, 2, 3, 4, 5], [300, 301, 302], [7, 8, 9, 10, 11, 12, 13]]' >/tmp/prompts.json
  for dev in cpu cuda; do
    ./$BIN/kestrel generate --device $dev --model $M --token-ids /tmp/prompts.json \
      --max-new-tokens 12 --greedy --ignore-eos --json >"$OUT/gen_$dev.json" 2>"$OUT/gen_$dev.log"
    echo "generate $dev rc=$? $(cut -c1-200 "$OUT/gen_$dev.json")"
  done
  ./$BIN/kestrel logits --device cuda --model $M --token-ids /tmp/prompts.json \
    --out /tmp/logits_cuda.safetensors >"$OUT/logits_cuda.log" 2>&1
  echo "logits cuda rc=$?"
fi
if has serve; then
  python3 -c "import aiohttp" 2>/dev/null && echo "aiohttp: yes" || echo "aiohttp: no"
  t0=$(date +%s)
  # PRESET=falcon-40b: serve that preset's random weights drawn on the device (no folder);
  # else a random folder written first (RANDOM_ARGS="--preset falcon-40b --dtype fp8": 42 GB).
  if [ -n "${PRESET:-}" ]; then
    WHAT="--preset $PRESET --tokenizer $TOKENIZER"
  else
    [ -e "$MODEL/config.json" ] || timeout 400 ./$BIN/kestrel random-model ${RANDOM_ARGS:---preset falcon-7b} \
      --out "$MODEL" --tokenizer $TOKENIZER >"$OUT/random_model.log" 2>&1
    echo "random-model rc=$? $(( $(date +%s) - t0 )) s; $(du -sh "$MODEL" | cut -f1)"
    WHAT="--model $MODEL"
  fi
  ./$BIN/kestrel serve --device cuda $WHAT --port $PORT $SERVE_ARGS >"$OUT/serve.log" 2>&1 &
  SERVER=$!
  wait_healthy "$OUT/serve.log"
  if [ $ok = 1 ]; then
    # Warm-up (first-use GEMM plans, allocator growth), then the measured run.
    timeout 120 python3 bench/serve_load.py --url http://127.0.0.1:$PORT --requests 32 \
      --concurrency 32 --prompt-tokens 128 --new-tokens 16 --seed 1 >"$OUT/warmup.json" 2>&1
    echo "warm-up rc=$? $(cut -c1-300 "$OUT/warmup.json")"
    timeout 240 python3 bench/serve_load.py --url http://127.0.0.1:$PORT $LOAD_ARGS --json "$OUT/load.json"
    echo "load rc=$?"
    # LOAD2_ARGS: a second run on the same warm server (e.g. half the streams under a JSON schema:
    # "--schema bench/schemas/orders.json --constrained 0.5 --new-schemas 8"), then the first again.
    if [ -n "${LOAD2_ARGS:-}" ]; then
      timeout 240 python3 bench/serve_load.py --url http://127.0.0.1:$PORT $LOAD_ARGS $LOAD2_ARGS \
        --json "$OUT/load2.json"
      echo "load2 rc=$?"
      timeout 240 python3 bench/serve_load.py --url http://127.0.0.1:$PORT $LOAD_ARGS --seed 7 \
        --json "$OUT/load3.json"
      echo "load (again) rc=$?"
    fi
    save_metrics
    grep -E "^kestrel_(steps|generated|preempt|step_seconds|schedule)" "$OUT/metrics.txt" | head
  fi
  stop_server
  tail -3 "$OUT/serve.log"
fi
if has fairness; then
  # FAIR_ADAPTERS random rank-8 adapters (qkv, dense) at falcon-7b's shapes.
  ADIR=/tmp/kestrel-adapters
  NA=${FAIR_ADAPTERS:-32}
  [ -e "$ADIR/a$(printf %02d $((NA - 1)))" ] || python3 bench/make_adapters.py --out $ADIR --count $NA --rank 8
  ./$BIN/kestrel serve --device cuda --preset ${PRESET:-falcon-7b} --tokenizer $TOKENIZER \
    --port $PORT --adapters-dir $ADIR --max-loaded-adapters $NA $SERVE_ARGS >"$OUT/fair_serve.log" 2>&1 &
  SERVER=$!
  wait_healthy "$OUT/fair_serve.log"
  if [ $ok = 1 ]; then
    FAIR_JSON=$(cd "$OUT" && pwd)/fair.json
    (cd bench && timeout ${FAIR_TIMEOUT:-300} python3 adapter_fairness.py --url http://127.0.0.1:$PORT \
      --adapters $NA ${FAIR_ARGS:---rate 2 --hot-factor 10 --duration 20 --procs 8} --json "$FAIR_JSON")
    echo "fairness rc=$?"
    save_metrics
    grep -E "^kestrel_preemptions_total" "$OUT/metrics.txt"
  fi
  stop_server
fi

# --- FP8 ------------------------------------------------------------------------------------
if has fp8-tests; then
  ./$BIN/backend_cuda_test --gtest_filter="${FP8_OPS_FILTER:-CudaFp8*:*Linear*:Cases/CudaAttention*:CudaOps.KvWrite*:CudaOps.QkvRotary*}" \
    --gtest_brief=1 >"$OUT/fp8-ops.log" 2>&1
  echo "fp8 ops rc=$?"; grep -E "FAILED|Failure|PASSED|Expected|Which is|actual" "$OUT/fp8-ops.log" | head -30
  ./$BIN/model_cuda_test --gtest_filter="${FP8_MODEL_FILTER:-*Fp8*:*PromptLogits*}" --gtest_brief=1 >"$OUT/fp8-model.log" 2>&1
  echo "fp8 model rc=$?"; grep -E "FAILED|PASSED|Failure|Expected|Which is|actual|prompt|graphs" "$OUT/fp8-model.log" | head -40
fi
if has fp8-bench7b; then
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
fi
if has fp8-bench40b; then
  ./$BIN/kestrel bench --device cuda --preset falcon-40b --quantize fp8 --prefill 1x2048,32x512 \
    --decode 1x128x128,32x128x128,128x128x128 --first-token-prompt 128 --iters 2 >"$OUT/bench40b-fp8.log" 2>&1
  echo "bench falcon-40b fp8 rc=$?"; grep -vE "^\[" "$OUT/bench40b-fp8.log" | tail -9
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
fi
if has fp8-short; then
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
fi
if has fp8-serve40b; then
  # On a larger card, the memory an H100 80GB would give (0.9 of its 79.2 GiB).
  FRACTION=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 |
    awk '{f = 0.9 * 81559 / $1; print (f > 0.9 ? 0.9 : f)}')
  for kv in ${SERVE_KV:-auto fp8}; do
    [ $(( $(date +%s) - T0 )) -lt ${SERVE_BY:-100000} ] || { echo "fp8-serve40b kv $kv: no time left"; break; }
    STEPS=serve PRESET=falcon-40b PORT=$((8100 + ${#kv})) OUT=$OUT/serve40b-$kv BIN=$BIN \
      SERVE_ARGS="--quantize fp8 --kv-cache-dtype $kv --max-running-seqs 64 --http-threads 4 --gpu-memory-fraction $FRACTION" \
      LOAD_ARGS="--requests 128 --concurrency 64 --prompt-tokens 128 --new-tokens 128" \
      timeout ${SERVE_TIMEOUT:-280} sh bench/gpu.sh 2>&1 | grep -vE "^kestrel_" | tail -25
  done
fi

# --- several GPUs ---------------------------------------------------------------------------
# run_ranks N ARGS...: N processes of `kestrel ARGS --nnodes N`, process r on GPU r; rank 0 in front.
MPORT=${MPORT:-29511}
run_ranks() {
  n=$1; shift
  r=$((n - 1))
  while [ $r -gt 0 ]; do
    CUDA_VISIBLE_DEVICES=$r ./$BIN/kestrel "$@" --nnodes $n --node-rank $r --master-port $MPORT \
      >"$OUT/rank$r.log" 2>&1 &
    r=$((r - 1))
  done
  CUDA_VISIBLE_DEVICES=0 ./$BIN/kestrel "$@" --nnodes $n --node-rank 0 --master-port $MPORT
  rc=$?
  wait
  MPORT=$((MPORT + 1))
  return $rc
}
if has multi; then
  N=${N:-2}
  DECODE=${DECODE:-1x128x128,32x128x128,128x128x128}
  PREFILL=${PREFILL:-1x2048}
  python3 -c 'import json, random; random.seed(3); json.dump([[random.randrange(65024) for _ in range(n)] for n in (5, 37, 128)], open("/tmp/mg_prompts.json", "w"))'
  for preset in ${PRESETS:-falcon-7b}; do
    M=/tmp/kestrel-$preset
    [ -e "$M/config.json" ] || ./$BIN/kestrel random-model --preset $preset --out $M >"$OUT/write_$preset.log" 2>&1
    echo "== $preset: folder $(du -sh $M | cut -f1)"
    CUDA_VISIBLE_DEVICES=0 ./$BIN/kestrel logits --device cuda --model $M --token-ids /tmp/mg_prompts.json \
      --out /tmp/mg_1.safetensors >"$OUT/logits1_$preset.log" 2>&1
    echo "logits N=1 rc=$?"
    run_ranks $N logits --device cuda --model $M --token-ids /tmp/mg_prompts.json \
      --out /tmp/mg_n.safetensors >"$OUT/logitsN_$preset.log" 2>&1
    echo "logits N=$N rc=$?"
    python3 - <<'PY'
from safetensors.torch import load_file
a = load_file("/tmp/mg_1.safetensors")["logits"].double()
b = load_file("/tmp/mg_n.safetensors")["logits"].double()
err = ((a - b).abs().max() / a.abs().max()).item()
same = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
print(f"logits N vs 1: max abs / max |ref| = {err:.2e} (bf16 bound 2e-2), argmax agree {same:.3f}")
PY
    for n in 1 $N; do
      if [ $n = 1 ]; then
        CUDA_VISIBLE_DEVICES=0 timeout 500 ./$BIN/kestrel bench --device cuda --model $M --prefill $PREFILL \
          --decode $DECODE --first-token-prompt 128 --iters 3 >"$OUT/bench1_$preset.txt" 2>"$OUT/bench1_$preset.log"
      else
        run_ranks $n bench --device cuda --model $M --prefill $PREFILL --decode $DECODE \
          --first-token-prompt 128 --iters 3 >"$OUT/bench${n}_$preset.txt" 2>"$OUT/bench${n}_$preset.log"
      fi
      echo "bench N=$n rc=$?"; cat "$OUT/bench${n}_$preset.txt"
    done
  done
fi
