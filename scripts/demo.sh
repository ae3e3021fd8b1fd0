#!/usr/bin/env bash
# The main job on the bundled demo model: installs, builds, and generates text
# with `kestrel generate` (random-weight Falcon-7b layout with the real Falcon
# tokenizer, so the words are real tokens but the continuation is noise).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build kestrel
./build/kestrel generate --model tests/data/e2e-falcon7b-fullvocab \
  --prompt "The capital of France is" --prompt "def fibonacci(n):" \
  --max-new-tokens 24 --greedy --ignore-eos
