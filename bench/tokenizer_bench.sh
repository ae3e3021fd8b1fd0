#!/usr/bin/env bash
# Encode throughput, kestrel vs HF tokenizers, on the same generated text in
# the same run: bench/tokenizer_bench.sh [BUILD_DIR] [MB]. Needs the
# tokenizer_bench target built and `pip install tokenizers`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
mb="${2:-4}"
tok="$root/tests/data/tokenizer/falcon-tokenizer.json"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

ours="$("$build/tokenizer_bench" --tokenizer "$tok" --mb "$mb" --text-out "$tmp/docs.json" --ids-out "$tmp/ids.json")"
echo "$ours" | grep -v '_mb_s='
theirs="$(python3 "$root/bench/tokenizer_hf.py" --tokenizer "$tok" --text "$tmp/docs.json" --ids "$tmp/ids.json")"
echo "$theirs" | grep -v '_mb_s='
k="$(echo "$ours" | sed -n 's/^kestrel_mb_s=//p')"
h="$(echo "$theirs" | sed -n 's/^hf_mb_s=//p')"
python3 -c "print(f'kestrel {float($k):.2f} MB/s, HF {float($h):.2f} MB/s: kestrel/HF = {float($k)/float($h):.2f}x')"
