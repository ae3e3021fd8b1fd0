#!/usr/bin/env python3
"""Differential test of kestrel's encoder against HF tokenizers on random,
adversarial text: runs of whitespace of every kind, contractions, digits,
punctuation, combining marks, scripts, emoji with joiners, the special tokens
and pieces of them. Usage:
  bench/tokenizer_hf_diff.py --bench BUILD/tokenizer_bench [--docs N] [--seed S]
Exits 1 and prints the first differing documents when any ids differ."""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402  (pip install tokenizers)

PIECES = [
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2009", "\u180e", "\u200b",
    "\u2028", "\x0b", "\x0c", "\x85", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'",
    "0", "7", "42", "1234567", "3.14", "1,000", "\u0663\u0664", "\u00bd", "\u2167", "\u00b2",
    "!", "?", "...", "--", "—", "«", "»", "(", ")", "[", "]", "{", "}", "#", "@", "$", "%", "^",
    "&", "*", "_", "~", "`", "|", "\\", "/", "<", ">", "=", "+", ";", ":", ",", ".", '"',
    "Hello", "world", "the", "Falcon", "attention", "naïve", "cafe\u0301", "e\u0301\u0301",
    "Привет", "日本語", "中文", "مرحبا", "שלום", "Ελληνικά", "한국어", "ẞtraße", "ǅ", "ﬁ",
    "🦅", "🚀", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "✅", "\U0001f600\ufe0f", "\U00010348", "\ufeff",
    "<|endoftext|>", ">>TITLE<<", ">>QUESTION<<", ">>ANSWER<<", ">>COMMENT<<", "<|endof",
    ">>", "<<", "<|", "|>", "\x00", "\x01", "\x1b[0m", "\x7f", "\u0085", "\u00ad", "\U0010fffd",
]


def random_doc(r):
    n = r.choice([1, 2, 3, 5, 10, 30, 100])
    out = []
    for _ in range(n):
        p = r.choice(PIECES)
        if r.random() < 0.1:
            p = p * r.randint(2, 40)
        if r.random() < 0.05:
            p = "".join(chr(r.randint(0x20, 0x2FFFF)) for _ in range(r.randint(1, 8)))
        out.append(p)
    doc = "".join(out)
    # Drop lone surrogates that the random code points may give.
    return doc.encode("utf-8", "ignore").decode("utf-8")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path of the tokenizer_bench binary")
    ap.add_argument("--tokenizer", default="tests/data/tokenizer/falcon-tokenizer.json")
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    r = random.Random(a.seed)
    docs = [random_doc(r) for _ in range(a.docs)]
    tok = Tokenizer.from_file(a.tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        text, ids_path = os.path.join(tmp, "docs.json"), os.path.join(tmp, "ids.json")
        with open(text, "w", encoding="utf-8") as f:
            json.dump(docs, f)
        subprocess.run([a.bench, "--tokenizer", a.tokenizer, "--text-in", text, "--runs", "1",
                        "--ids-out", ids_path], check=True, stdout=subprocess.DEVNULL)
        ours = json.load(open(ids_path))
    theirs = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    bad = [i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y]
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    print(f"{len(docs)} documents, {n_bytes / 1e6:.2f} MB, seed {a.seed}: "
          f"{len(docs) - len(bad)} identical, {len(bad)} differ")
    for i in bad[:5]:
        print(f"  {docs[i]!r}\n    kestrel {ours[i]}\n    hf      {theirs[i]}")
    sys.exit(1 if bad or len(ours) != len(theirs) else 0)


if __name__ == "__main__":
    main()
