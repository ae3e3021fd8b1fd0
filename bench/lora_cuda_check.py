"""LoRA fixtures through `kestrel logits --device cuda --adapters` (run on the GPU machine, where
torch and safetensors are installed): every adapter alone, then one mixed batch of every adapter
and the base model interleaved, against transformers + peft (max abs / max |ref|, bf16 bound 2e-2)
and argmax agreement: at every position whose reference top-2 margin exceeds twice our absolute
error in that row the argmax must equal the reference's (as docs/gpu.md checks the base fixtures);
closer positions are near ties for bf16 and are counted apart. Usage: python3 bench/lora_cuda_check.py KESTREL_BINARY"""
import json
import os
import subprocess
import sys
import tempfile

from safetensors.torch import load_file

BIN = sys.argv[1]
DATA = "tests/data"
worst = 0.0
mismatches = 0
tmp = tempfile.mkdtemp()
for fx in ("lora-falcon40b-gqa", "lora-falcon7b-mqa", "lora-e2e-falcon7b-fullvocab"):
    meta = json.load(open(f"{DATA}/{fx}/fixture.json"))
    base = os.path.normpath(os.path.join(DATA, fx, meta["base"]))  # "../NAME" in fixture.json
    exp = load_file(f"{DATA}/{fx}/expected.safetensors")
    bexp = load_file(f"{base}/expected.safetensors")
    ids, cu = bexp["prompt_ids"].tolist(), bexp["cu_seqlens"].tolist()
    prompts = [ids[cu[i]:cu[i + 1]] for i in range(len(cu) - 1)]
    names = sorted(os.listdir(f"{DATA}/{fx}/adapters"))
    full = f"{names[0]}.logits" not in exp

    def ref(name, p):  # the reference rows of prompt p under adapter name (None: base)
        src, key = (bexp, "logits") if name is None else (exp, f"{name}.logits")
        if full:
            key = "last_logits" if name is None else f"{name}.last_logits"
            return src[key][p:p + 1].double()
        return src[key][cu[p]:cu[p + 1]].double()

    def run(label, entries):  # entries: [(prompt index, adapter name or None)]
        global worst, mismatches
        pj, aj, oj = (os.path.join(tmp, x) for x in ("p.json", "a.json", "o.safetensors"))
        json.dump([prompts[p] for p, _ in entries], open(pj, "w"))
        json.dump([None if a is None else f"{DATA}/{fx}/adapters/{a}" for _, a in entries], open(aj, "w"))
        r = subprocess.run([BIN, "logits", "--device", "cuda", "--model", base, "--token-ids", pj,
                            "--adapters", aj, "--out", oj], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{fx} {label}: rc {r.returncode} {r.stderr[-400:]}")
            worst = float("inf")
            return
        out = load_file(oj)
        logits, ocu = out["logits"].double(), out["cu_seqlens"].tolist()
        err, agree, total, checked, ties, bad = 0.0, 0, 0, 0, 0, 0
        for i, (p, a) in enumerate(entries):
            got = logits[ocu[i]:ocu[i + 1]]
            if full:
                got = got[-1:]
            want = ref(a, p)
            err = max(err, ((got - want).abs().max() / want.abs().max()).item())
            same = got.argmax(-1) == want.argmax(-1)
            agree += same.sum().item()
            total += got.shape[0]
            top2 = want.topk(2, dim=-1).values
            margin = top2[:, 0] - top2[:, 1]
            clear = margin > 2 * (got - want).abs().max(dim=-1).values
            checked += clear.sum().item()
            ties += (~clear).sum().item()
            bad += (clear & ~same).sum().item()
        worst = max(worst, err)
        mismatches += bad
        print(f"{fx} {label}: max abs / max |ref| {err:.2e}, argmax {agree}/{total}; "
              f"at clear margins {checked - bad}/{checked} equal ({ties} near ties)")

    for a in names:
        run(a, [(p, a) for p in range(len(prompts))])
    mixed = [(p, a) for p in range(len(prompts)) for a in [None] + names]
    run("mixed batch", mixed)
ok = worst <= 2e-2 and mismatches == 0
print(f"worst {worst:.2e} (bound 2e-2), {mismatches} argmax mismatches at clear margins: "
      f"{'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
