#!/bin/sh
# One device call for the CUDA graphs of decode (docs/gpu.md, "CUDA graphs"): the graph tests,
# the CUDA fixture tests (their decode steps replay graphs), compute-sanitizer memcheck on one
# graph decode run and on the GPU sampler, generate with graphs on / off / on the CPU, and
# `kestrel bench --cuda-graphs both` on falcon-7b. Carry build-gpucarry/ (kestrel,
# model_cuda_test, engine_test) and .gpulib/. Logs under $OUT.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BIN=${BIN:-build-gpucarry}
export KESTREL_TEST_DATA=$PWD/tests/data  # the fixtures, wherever the test binaries were built
export LD_LIBRARY_PATH=$PWD/.gpulib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
STEPS=${STEPS:-graphs,bench,memcheck,generate,fixtures}
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
case ,$STEPS, in *,graphs,*)
  timeout 60 ./$BIN/model_cuda_test --gtest_filter='CudaGraph*:DecodeGraph*' >"$OUT/graphs.log" 2>&1
  echo "graphs rc=$?"; grep -E "^\[ graphs|FAILED|PASSED|Failure|Expected|Which is|error" "$OUT/graphs.log" | head -30
esac
case ,$STEPS, in *,bench,*)
  timeout 120 ./$BIN/kestrel bench --device cuda --preset falcon-7b --prefill 1x2048,8x512,32x512 \
    --decode 1x128x128,32x128x128,128x128x128 --first-token-prompt 128 --iters 3 --cuda-graphs both \
    >"$OUT/bench.log" 2>&1
  echo "bench rc=$?"; tail -20 "$OUT/bench.log"
esac
case ,$STEPS, in *,memcheck,*)
  timeout 60 $CS --tool memcheck ./$BIN/model_cuda_test --gtest_filter='CudaGraphTest.Hd128*' >"$OUT/memcheck_graph.log" 2>&1
  echo "memcheck graph rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck_graph.log"
  timeout 60 $CS --tool memcheck ./$BIN/engine_test --gtest_filter='SamplerCuda*' >"$OUT/memcheck_sampler.log" 2>&1
  echo "memcheck sampler rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED|tests ran" "$OUT/memcheck_sampler.log"
esac
case ,$STEPS, in *,generate,*)
  P=$OUT/prompts.json; echo '[[11, 204, 3301, 17], [5, 6, 7, 8, 9, 10, 11], [42]]' >"$P"
  for g in on off; do
    ./$BIN/kestrel generate --model tests/data/e2e-falcon7b-fullvocab --token-ids "$P" --max-new-tokens 40 \
      --greedy --ignore-eos --json --device cuda --cuda-graphs $g >"$OUT/gen_$g.json" 2>"$OUT/gen_$g.err"
    echo "generate graphs $g rc=$?"
  done
  ./$BIN/kestrel generate --model tests/data/e2e-falcon7b-fullvocab --token-ids "$P" --max-new-tokens 40 \
    --greedy --ignore-eos --json --device cpu >"$OUT/gen_cpu.json" 2>/dev/null
  python3 -c "
import json,sys
ids=lambda f:[o['token_ids'] for o in json.load(open(f))['outputs']]
on,off,cpu=(ids('$OUT/gen_%s.json'%k) for k in ('on','off','cpu'))
same=lambda x,y:sum(a==b for p,q in zip(x,y) for a,b in zip(p,q))
n=sum(len(p) for p in on)
print('generate ids: graphs on = off %d/%d, on = cpu %d/%d'%(same(on,off),n,same(on,cpu),n))"
esac
case ,$STEPS, in *,fixtures,*)
  timeout 60 ./$BIN/model_cuda_test --gtest_brief=1 --gtest_filter='Fixtures/*' >"$OUT/fixtures.log" 2>&1
  echo "fixtures rc=$?"; grep -E "FAILED|PASSED|Failure" "$OUT/fixtures.log" | head -20
esac
