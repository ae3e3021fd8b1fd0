#!/usr/bin/env python3
"""Prints the code points that HF tokenizers (Oniguruma, newer Unicode) classes
as letters (L) or numbers (N) in its regexes (Oniguruma), or as numeric (D) in
its Digits pre-tokenizer (Rust's char::is_numeric), but that are unassigned in Unicode 14.0, the
version of PCRE2 10.42's tables (Debian 12) and of this Python's unicodedata.
src/text/unicode.cpp holds the lists: regex.cpp adds L and N to \\p{L} and \\p{N},
is_numeric() takes D. Input: hf-unicode-classes.txt.
  python3 gen_pcre2_newer_letters.py hf-unicode-classes.txt"""
import sys
import unicodedata

assert unicodedata.unidata_version == "14.0.0", "needs Python 3.11 (Unicode 14.0, as PCRE2 10.42)"


def ranges(line):
    for r in line.split()[1:]:
        a, _, b = r.partition("-")
        yield int(a, 16), int(b or a, 16)


def newer(rs):
    cps = [cp for a, b in rs for cp in range(a, b + 1) if unicodedata.category(chr(cp)) == "Cn"]
    out = []
    for cp in cps:
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return out


classes = {}
for line in open(sys.argv[1], encoding="utf-8"):
    if line[:1] in ("L", "N", "D"):
        classes[line[0]] = list(ranges(line))
for name in ("L", "N", "D"):
    rs = newer(classes[name])
    print(f"// {name}: {sum(b - a + 1 for a, b in rs)} code points in {len(rs)} ranges")
    print(f"constexpr CodePointRange kNewer{name}[] = {{")
    print("".join(f"    {{0x{a:X}, 0x{b:X}}},\n" for a, b in rs), end="")
    print("};")
