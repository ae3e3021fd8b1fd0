#!/usr/bin/env bash
# Installs what the build needs, builds kestrel and runs every test: the
# release build, the same suite under ASan+UBSan, the Python suites where they
# exist, and a compile-only CUDA build when nvcc is present (so it cannot rot; ptxas must not
# serialize a kernel's wgmma: scripts/check-wgmma.sh).
# Stages print their wall time. KESTREL_SKIP_ASAN=1 / KESTREL_SKIP_CUDA=1 skip those.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${KESTREL_JOBS:-$(nproc)}

stage() {
  local name=$1
  shift
  local t0=$SECONDS
  echo "=== $name"
  "$@"
  echo "=== $name: $((SECONDS - t0)) s"
}

build_and_test() {  # dir, cmake args...
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DKESTREL_TESTS=ON "$@" >/dev/null
  ninja -C "$dir" -j "$jobs"
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" -LE cuda
}

stage deps bash scripts/install-deps.sh
stage release build_and_test build -DCMAKE_BUILD_TYPE=Release
if [ "${KESTREL_SKIP_ASAN:-0}" != 1 ]; then
  # ASan's leak checker cannot run under ptrace-less sandboxes; leaks are not what this run checks.
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  stage asan+ubsan build_and_test build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKESTREL_SANITIZE=ON \
    -DKESTREL_BENCH=OFF
  unset ASAN_OPTIONS UBSAN_OPTIONS
fi
if [ -x scripts/test-python.sh ]; then
  stage python bash scripts/test-python.sh
fi
nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ "${KESTREL_SKIP_CUDA:-0}" != 1 ] && [ -x "$nvcc_bin" ]; then
  stage cuda-compile bash -c "cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKESTREL_CUDA=ON -DKESTREL_TESTS=ON -DKESTREL_BENCH=ON -DCMAKE_CUDA_COMPILER=$nvcc_bin >/dev/null \
    && ninja -C build-cuda -j $jobs && bash scripts/check-wgmma.sh build-cuda"
fi
echo "all tests passed"
