#!/usr/bin/env python3
"""Writes hf-unicode-classes.txt: for every code point from U+0080 up, how HF
tokenizers' pre-tokenizers classify it, asked of the pre-tokenizers
themselves (pip install tokenizers):
  P  Punctuation pre-tokenizer (the unicode_categories crate: Unicode 8.0)
  L  \\p{L} in ByteLevel's regex (Oniguruma)
  N  \\p{N} in ByteLevel's regex
  W  \\s in ByteLevel's regex (White_Space)
  D  Digits pre-tokenizer (Rust char::is_numeric)
One line per class: the letter, then ranges of hex code points (A or A-B).
Run from the repository root: tests/data/tokenizer/gen_hf_unicode_classes.py"""
import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")
import tokenizers  # noqa: E402
from tokenizers import pre_tokenizers as pt  # noqa: E402


def ranges(cps):
    out = []
    for c in cps:
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return " ".join(f"{a:04X}" if a == b else f"{a:04X}-{b:04X}" for a, b in out)


def main():
    punct = pt.Punctuation("isolated")
    byte_level = pt.ByteLevel(add_prefix_space=False, use_regex=True)
    digits = pt.Digits(individual_digits=False)
    classes = {k: [] for k in "PLNWD"}
    for c in range(0x80, 0x110000):
        if 0xD800 <= c <= 0xDFFF:
            continue
        ch = chr(c)
        if len(punct.pre_tokenize_str("a" + ch + "a")) == 3:
            classes["P"].append(c)
        # One piece: the regex alternative of the first char takes this one too.
        for k, before in (("L", "a"), ("N", "1"), ("W", "\t")):
            if len(byte_level.pre_tokenize_str(before + ch)) == 1:
                classes[k].append(c)
        if len(digits.pre_tokenize_str("a" + ch + "a")) == 3:
            classes["D"].append(c)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf-unicode-classes.txt")
    with open(path, "w") as f:
        f.write(f"# HF tokenizers {tokenizers.__version__}: gen_hf_unicode_classes.py\n")
        for k, cps in classes.items():
            f.write(f"{k} {ranges(cps)}\n")
    print(path, {k: len(v) for k, v in classes.items()})


if __name__ == "__main__":
    main()
