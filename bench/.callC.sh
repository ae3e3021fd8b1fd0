set -u
T0=$(date +%s)
mkdir -p build-gpucarry && tar -xJf build-gpupack/bin.tar.xz -C build-gpucarry
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
STEPS=fairness PORT=8091 OUT=$OUT/fairburst SERVE_ARGS="--max-running-seqs 128 --http-threads 4" \
  FAIR_ARGS="--rate 1 --hot-factor 10 --duration 20 --procs 8 --hot-burst" \
  timeout 120 sh bench/gpu_serve.sh 2>&1 | grep -E "quiet|rc=" | cut -c1-400
grep -E "^kestrel_(preempt|engine_preempt)" $OUT/fairburst/*.txt 2>/dev/null | head -3
echo "t=$(( $(date +%s) - T0 ))"
STEPS=fairness PORT=8090 OUT=$OUT/fair SERVE_ARGS="--max-running-seqs 128 --http-threads 4" \
  FAIR_ARGS="--rate 1 --hot-factor 10 --duration 20 --procs 8" \
  timeout 120 sh bench/gpu_serve.sh 2>&1 | grep -E "quiet|rc=" | cut -c1-400
echo "t=$(( $(date +%s) - T0 ))"
timeout 150 ./build-gpucarry/kestrel bench --device cuda --preset falcon-7b --prefill 1x2048,32x512 \
  --decode 1x128x128,32x128x128,128x128x128 --first-token-prompt 128 --iters 3 2>&1 | grep -vE "^\[" | tail -12
echo "t=$(( $(date +%s) - T0 ))"
