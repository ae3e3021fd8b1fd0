set -u
T0=$(date +%s)
mkdir -p build-gpucarry && tar -xJf build-gpupack/bin.tar.xz -C build-gpucarry
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KESTREL_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
./build-gpucarry/backend_cuda_test --gtest_filter='CudaFp8*:Cases/CudaAttention*' --gtest_brief=1 2>&1 | grep -E "Failure|actual|FAILED|PASSED" | head -8
PRESET=falcon-7b STEPS=serve OUT=$OUT/structured SERVE_ARGS="--max-running-seqs 128 --http-threads 4" \
  LOAD_ARGS="--requests 128 --concurrency 128 --prompt-tokens 128 --new-tokens 128" \
  LOAD2_ARGS="--schema bench/schemas/orders.json --constrained 0.5 --new-schemas 8" \
  timeout 150 sh bench/gpu_serve.sh 2>&1 | grep -E "^load|rc=" | head
for f in load load2 load3; do tr -d '\n ' < $OUT/structured/$f.json | head -c 900; echo; done
echo "t=$(( $(date +%s) - T0 ))"
STEPS=fairness PORT=8090 OUT=$OUT/fair SERVE_ARGS="--max-running-seqs 128 --http-threads 4" \
  FAIR_ARGS="--rate 1 --hot-factor 10 --duration 20 --procs 8" \
  timeout 120 sh bench/gpu_serve.sh 2>&1 | grep -E "quiet|rc=" | cut -c1-400
echo "t=$(( $(date +%s) - T0 ))"
STEPS=fairness PORT=8091 OUT=$OUT/fairburst SERVE_ARGS="--max-running-seqs 128 --http-threads 4" \
  FAIR_ARGS="--rate 1 --hot-factor 10 --duration 20 --procs 8 --hot-burst" \
  timeout 120 sh bench/gpu_serve.sh 2>&1 | grep -E "quiet|rc=" | cut -c1-400
echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 585 - ($(date +%s) - T0) ))
OUT=$OUT/fp8 STEPS=serve40b SERVE_KV="auto fp8" SERVE_BY=$(( LEFT - 200 )) SERVE_TIMEOUT=200 timeout $LEFT sh bench/fp8_gpu_run.sh 2>&1 | tail -40
echo "t=$(( $(date +%s) - T0 ))"
