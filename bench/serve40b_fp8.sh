#!/bin/sh
# falcon-40b with --quantize fp8 served from one card: random weights drawn on the device
# (`serve --preset`), the KV cache it sizes (the serve log's "engine ready" line, in tokens),
# then 64 concurrent streams of 128 + 128 tokens (bench/serve_load.py). On a card larger than an
# H100 80GB the memory fraction is cut to what an H100 would give. Carry build-gpupack/bin.tar.xz
# and .gpulib (docs/gpu.md); KV=fp8 for --kv-cache-dtype fp8. Logs under $OUT.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT" build-gpucarry
tar -xJf build-gpupack/bin.tar.xz -C build-gpucarry kestrel
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
FRACTION=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 |
  awk '{f = 0.9 * 81559 / $1; print (f > 0.9 ? 0.9 : f)}')
t0=$(date +%s)
./build-gpucarry/kestrel serve --device cuda --preset falcon-40b \
  --tokenizer tests/data/tokenizer/falcon-tokenizer.json --quantize fp8 \
  --kv-cache-dtype ${KV:-auto} --gpu-memory-fraction "$FRACTION" --max-running-seqs 64 \
  --http-threads 4 --port 8090 >"$OUT/serve.log" 2>&1 &
SERVER=$!
ok=0
for i in $(seq 1 240); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8090/health', timeout=1)" 2>/dev/null; then ok=1; break; fi
  kill -0 $SERVER 2>/dev/null || break
  sleep 1
done
echo "server up=$ok after $(( $(date +%s) - t0 )) s"
grep -E "loaded|device memory|engine ready|error" "$OUT/serve.log" | cut -c1-260
if [ $ok = 1 ]; then
  python3 bench/serve_load.py --url http://127.0.0.1:8090 --requests 64 --concurrency 64 \
    --prompt-tokens 128 --new-tokens 128 --json "$OUT/load.json"
  echo "load rc=$?"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
fi
kill -INT $SERVER 2>/dev/null; sleep 2; kill -9 $SERVER 2>/dev/null
tail -2 "$OUT/serve.log" | cut -c1-200
