set -u
T0=$(date +%s)
mkdir -p build-gpucarry && tar -xJf build-gpupack/bin.tar.xz -C build-gpucarry
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KESTREL_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
./build-gpucarry/backend_cuda_test --gtest_filter='Ops.*:CudaOps.GreedyRows*:*Bitmask*:Cases/CudaAttention*:*Linear*' --gtest_brief=1 2>&1 | tail -3
timeout 60 ./build-gpucarry/grammar_bench tests/data/tokenizer/falcon-tokenizer.json bench/schemas/orders.json --benchmark_filter='rows:(16|64)|Compile' 2>&1 | grep -E "BM_"
echo "t=$(( $(date +%s) - T0 ))"
PRESET=falcon-7b STEPS=serve OUT=$OUT/structured SERVE_ARGS="--max-running-seqs 128 --http-threads 4" \
  LOAD_ARGS="--requests 128 --concurrency 128 --prompt-tokens 128 --new-tokens 128" \
  LOAD2_ARGS="--schema bench/schemas/orders.json --constrained 0.5 --new-schemas 8" \
  timeout 280 sh bench/gpu_serve.sh 2>&1 | grep -vE "^kestrel_" | tail -14
cat $OUT/structured/load*.json | tr -d '\n' | head -c 3000; echo
echo "t=$(( $(date +%s) - T0 ))"
STEPS=fairness PORT=8090 OUT=$OUT/fair SERVE_ARGS="--max-running-seqs 128 --http-threads 4" \
  timeout $(( 560 - ($(date +%s) - T0) )) sh bench/gpu_serve.sh 2>&1 | grep -vE "^kestrel_" | tail -12
grep -E "adapter store|error" $OUT/fair/fair_serve.log | tail -4
echo "t=$(( $(date +%s) - T0 ))"
LEFT=$(( 580 - ($(date +%s) - T0) ))
[ $LEFT -gt 60 ] && OUT=$OUT/fp8 STEPS=tests MODEL_FILTER='*Fp8*:*PromptLogits*:Fixtures*' timeout $LEFT sh bench/fp8_gpu_run.sh 2>&1 | tail -30
grep -h "no outer-vector" $OUT/fp8/*.log 2>/dev/null | head -3
echo "t=$(( $(date +%s) - T0 ))"
