#!/bin/sh
# Issue 9, ready for a multi-GPU device call (nvidia-h200-x2 / -x4): tensor parallelism with one
# process per GPU (--nnodes N, NCCL joined by the unique id rank 0 sends over TCP; see
# docs/parallel.md). For each preset: writes a random model folder on the machine's disk, checks
# logits of N processes against 1 (bf16 bound), then times decode batch 1 / 32 / 128 (128 + 128)
# and prefill 1x2048 at 1 and N, with the collective time per step. Run from the repository root
# with build-gpucarry/ and .gpulib/ carried (docs/gpu.md); logs under $OUT.
#   N=2 PRESETS="falcon-7b falcon-40b" OUT=$OUT sh bench/multi_gpu.sh
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BIN=${BIN:-build-gpucarry}
N=${N:-2}
PRESETS=${PRESETS:-falcon-7b}
PORT=${PORT:-29511}
DECODE=${DECODE:-1x128x128,32x128x128,128x128x128}
PREFILL=${PREFILL:-1x2048}
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (device documentation)
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader

# run_ranks N ARGS...: N processes of `kestrel ARGS --nnodes N`, process r on GPU r; rank 0 in front.
run_ranks() {
  n=$1; shift
  r=$((n - 1))
  while [ $r -gt 0 ]; do
    CUDA_VISIBLE_DEVICES=$r ./$BIN/kestrel "$@" --nnodes $n --node-rank $r --master-port $PORT \
      >"$OUT/rank$r.log" 2>&1 &
    r=$((r - 1))
  done
  CUDA_VISIBLE_DEVICES=0 ./$BIN/kestrel "$@" --nnodes $n --node-rank 0 --master-port $PORT
  rc=$?
  wait
  PORT=$((PORT + 1))
  return $rc
}

python3 -c 'import json, random; random.seed(3); json.dump([[random.randrange(65024) for _ in range(n)] for n in (5, 37, 128)], open("/tmp/mg_prompts.json", "w"))'
for preset in $PRESETS; do
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
