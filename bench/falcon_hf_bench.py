#!/usr/bin/env python3
"""The shapes of `kestrel bench` through transformers + PyTorch (the peer we
compare with on the GPU machine): a Falcon model of a preset's shape with
random bf16 weights on the GPU, sdpa attention, a KV cache.

Prefill BxL: one forward of B prompts of L tokens (median of --iters).
Decode BxPxG: prefill, then G-1 single-token steps; tok/s = B * (G-1) / time
of those steps (kestrel bench counts the same way). First token: one P-token
prompt's forward plus the argmax of its last logits.

    python3 bench/falcon_hf_bench.py --preset falcon-7b --json
"""
import argparse
import json
import sys
import time

import torch
from transformers import FalconConfig, FalconForCausalLM

PRESETS = {
    "falcon-7b": dict(hidden_size=4544, num_hidden_layers=32, num_attention_heads=71,
                      multi_query=True, new_decoder_architecture=False, parallel_attn=True,
                      bias=False, vocab_size=65024),
    "tiny": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
                 new_decoder_architecture=False, parallel_attn=True, bias=False,
                 vocab_size=1024),
}


def shapes(s, n):
    out = []
    for item in filter(None, s.split(",")):
        v = [int(x) for x in item.split("x")]
        assert len(v) == n, item
        out.append(v)
    return out


def sync_time():
    torch.cuda.synchronize()
    return time.perf_counter()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="falcon-7b", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--prefill", default="1x2048,8x512,32x512")
    ap.add_argument("--decode", default="1x128x128,32x128x128,128x128x128")
    ap.add_argument("--first-token-prompt", type=int, default=128)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    cfg = dict(PRESETS[a.preset])
    if a.layers:
        cfg["num_hidden_layers"] = a.layers
    config = FalconConfig(**cfg, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = FalconForCausalLM(config).to(torch.bfloat16).eval()
    vocab = config.vocab_size
    log = (lambda *x: print(*x, file=sys.stderr)) if a.json else print
    log(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
        f"{torch.cuda.get_device_name()}, {a.preset} ({cfg['num_hidden_layers']} layers)")
    res = {"prefill": [], "decode": []}
    with torch.inference_mode():
        for b, l in shapes(a.prefill, 2):
            ids = torch.randint(0, vocab, (b, l), device="cuda")
            times = []
            for it in range(a.iters + 1):
                t0 = sync_time()
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
                t = sync_time() - t0
                if it:
                    times.append(t)
            t = sorted(times)[len(times) // 2]
            res["prefill"].append({"batch": b, "prompt": l, "tok_s": b * l / t, "ms": t * 1e3})
            log(f"prefill {b}x{l}: {b * l / t:.0f} tok/s, {t * 1e3:.2f} ms")
            del ids
            torch.cuda.empty_cache()
        for b, p, g in shapes(a.decode, 3):
            ids = torch.randint(0, vocab, (b, p), device="cuda")
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            past = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            t0 = sync_time()
            for _ in range(g - 1):
                out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            t = sync_time() - t0
            res["decode"].append({"batch": b, "prompt": p, "new": g, "tok_s": b * (g - 1) / t,
                                  "ms_per_step": t / (g - 1) * 1e3})
            log(f"decode {b}x{p}x{g}: {b * (g - 1) / t:.0f} tok/s, {t / (g - 1) * 1e3:.2f} ms/step")
            del past, out
            torch.cuda.empty_cache()
        if a.first_token_prompt:
            ids = torch.randint(0, vocab, (1, a.first_token_prompt), device="cuda")
            times = []
            for it in range(a.iters + 1):
                t0 = sync_time()
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                out.logits[:, -1].argmax(-1).item()
                t = sync_time() - t0
                if it:
                    times.append(t)
            res["first_token_ms"] = sorted(times)[len(times) // 2] * 1e3
            log(f"first token ({a.first_token_prompt}-token prompt): {res['first_token_ms']:.2f} ms")
    if a.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
