#!/usr/bin/env python3
"""Times HF tokenizers' encode on one thread on the documents tokenizer_bench
wrote (--text), and checks its ids against kestrel's (--ids)."""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402  (pip install tokenizers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="tests/data/tokenizer/falcon-tokenizer.json")
    ap.add_argument("--text", required=True)
    ap.add_argument("--ids")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    docs = json.load(open(a.text, encoding="utf-8"))
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    tok = Tokenizer.from_file(a.tokenizer)
    times, ids = [], None
    for _ in range(a.runs):
        t0 = time.perf_counter()
        out = [tok.encode(d, add_special_tokens=False).ids for d in docs]
        times.append(time.perf_counter() - t0)
        ids = ids or out
    n_tokens = sum(len(x) for x in ids)
    print(f"hf tokenizers {__import__('tokenizers').__version__}: {len(docs)} docs, "
          f"{n_bytes / 1e6:.2f} MB, {n_tokens} tokens; first run {n_bytes / 1e6 / times[0]:.2f} MB/s, "
          f"best of {a.runs} {n_bytes / 1e6 / min(times):.2f} MB/s")
    print(f"hf_mb_s={n_bytes / 1e6 / min(times):.3f}")
    if a.ids:
        ours = json.load(open(a.ids))
        bad = [i for i, (x, y) in enumerate(zip(ids, ours)) if x != y]
        if bad or len(ours) != len(ids):
            print(f"ids differ in {len(bad)} of {len(ids)} documents (first: {bad[:5]})")
            sys.exit(1)
        print(f"ids identical for all {len(ids)} documents")


if __name__ == "__main__":
    main()
