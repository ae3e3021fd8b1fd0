#!/bin/sh
# One device call for the engine and server on CUDA: op tests, `generate
# --device cuda` against `--device cpu` on the e2e fixture, then `kestrel serve
# --device cuda` on a random falcon-7b folder written on the GPU machine's disk
# and bench/serve_load.py against it (256 streams of 128 + 128 tokens by
# default); STEPS=fairness: the adapters' fairness load (bench/adapter_fairness.py).
# Run from the repository root with build-gpucarry/ and .gpulib/ carried
# (docs/gpu.md). Logs under $OUT (or ./gpu-out).
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BIN=${BIN:-build-gpucarry}
MODEL=${MODEL:-/tmp/kestrel-falcon7b-random}
PORT=${PORT:-8080}
LOAD_ARGS=${LOAD_ARGS:---requests 256 --concurrency 256 --prompt-tokens 128 --new-tokens 128}
SERVE_ARGS=${SERVE_ARGS:---max-running-seqs 256 --http-threads 4}
export KESTREL_TEST_DATA=$PWD/tests/data  # the fixtures, wherever the test binaries were built
export KESTREL_BINARY=$PWD/$BIN/kestrel   # for the tests that run it
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
python3 -c "import aiohttp" 2>/dev/null && echo "aiohttp: yes" || echo "aiohttp: no"
STEPS=${STEPS:-ops,generate,serve}

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

case ,$STEPS, in *,ops,*)
  timeout 180 ./$BIN/backend_cuda_test --gtest_brief=1 >"$OUT/ops.log" 2>&1
  echo "ops rc=$?"; grep -E "FAILED|Failure|PASSED|Expected|Which is" "$OUT/ops.log" | head -20
  timeout 120 ./$BIN/engine_test --gtest_filter='SamplerCuda*' >"$OUT/sampler.log" 2>&1
  echo "sampler rc=$?"; grep -E "FAILED|Failure|PASSED|OK \]|Expected|Which is|mask of|row" "$OUT/sampler.log" | head -30
esac

case ,$STEPS, in *,generate,*)
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
esac

case ,$STEPS, in *,serve,*)
  t0=$(date +%s)
  # PRESET=falcon-40b: serve that preset's random weights drawn on the device (no folder);
  # else a random folder written first (RANDOM_ARGS="--preset falcon-40b --dtype fp8": 42 GB).
  if [ -n "${PRESET:-}" ]; then
    WHAT="--preset $PRESET --tokenizer tests/data/tokenizer/falcon-tokenizer.json"
  else
    [ -e "$MODEL/config.json" ] || timeout 400 ./$BIN/kestrel random-model ${RANDOM_ARGS:---preset falcon-7b} \
      --out "$MODEL" --tokenizer tests/data/tokenizer/falcon-tokenizer.json >"$OUT/random_model.log" 2>&1
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
    python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" \
      >"$OUT/metrics.txt" 2>&1
    grep -E "^kestrel_(steps|generated|preempt|step_seconds|schedule)" "$OUT/metrics.txt" | head
  fi
  kill -INT $SERVER 2>/dev/null; sleep 3; kill -9 $SERVER 2>/dev/null
  tail -3 "$OUT/serve.log"
esac

case ,$STEPS, in *,fairness,*)
  # Fairness across adapters: FAIR_ADAPTERS random rank-8 adapters (qkv, dense) at falcon-7b's
  # shapes, the quiet ones' TTFT alone and beside one adapter sending 10x (bench/adapter_fairness.py).
  ADIR=/tmp/kestrel-adapters
  N=${FAIR_ADAPTERS:-32}
  [ -e "$ADIR/a$(printf %02d $((N - 1)))" ] || python3 bench/make_adapters.py --out $ADIR --count $N --rank 8
  ./$BIN/kestrel serve --device cuda --preset ${PRESET:-falcon-7b} \
    --tokenizer tests/data/tokenizer/falcon-tokenizer.json --port $PORT --adapters-dir $ADIR \
    --max-loaded-adapters $N $SERVE_ARGS >"$OUT/fair_serve.log" 2>&1 &
  SERVER=$!
  wait_healthy "$OUT/fair_serve.log"
  if [ $ok = 1 ]; then
    FAIR_JSON=$(cd "$OUT" && pwd)/fair.json
    (cd bench && timeout ${FAIR_TIMEOUT:-300} python3 adapter_fairness.py --url http://127.0.0.1:$PORT \
      --adapters $N ${FAIR_ARGS:---rate 2 --hot-factor 10 --duration 20 --procs 8} --json "$FAIR_JSON")
    echo "fairness rc=$?"
    python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" \
      >"$OUT/metrics.txt" 2>&1
    grep -E "^kestrel_preemptions_total" "$OUT/metrics.txt"
  fi
  kill -INT $SERVER 2>/dev/null; sleep 3; kill -9 $SERVER 2>/dev/null
esac
