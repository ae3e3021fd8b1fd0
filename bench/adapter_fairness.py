#!/usr/bin/env python3
"""Fairness across LoRA adapters on a running `kestrel serve --adapters-dir DIR` (whose folders
are PREFIX00 .. PREFIX{N-1}, e.g. from bench/make_adapters.py).

Open-loop load: each quiet adapter (1 .. N-1) sends requests as a Poisson process of --rate per
second, the hot adapter (0) --hot-factor times as many (as a Poisson stream, or with --hot-burst
all in the first half second), for --duration seconds; every request
streams --prompt-tokens + --new-tokens (distinct prompts: the prefix cache does not help).
Two runs on the same server: "unloaded" (the quiet adapters alone) and "loaded" (with the hot
one), each preceded by a request per adapter so that every adapter is loaded. Prints TTFT p50 /
p99 per group, errors, tokens/s, and the quiet adapters' loaded / unloaded p99 ratio. The
clients run in --procs processes, so that one Python event loop does not set the latency.

    python3 bench/adapter_fairness.py --url http://127.0.0.1:8080 --adapters 32 --rate 3 \
        --hot-factor 10 --duration 20 [--json OUT.json]
"""
import argparse
import asyncio
import json
import multiprocessing
import random
import sys
import time
import urllib.parse

from serve_load import make_prompt, pct, stream_one


def schedule(a, hot_factor):
    """[(arrival_s, adapter_index)] sorted by arrival; the quiet adapters' arrivals are the same
    in every run."""
    out = []
    for k in range(a.adapters):
        rng = random.Random(1000 + k)
        if k == 0 and a.hot_burst and hot_factor > 0:  # its requests all at once, at the start
            out += [(0.5 * i / (hot_factor * a.rate * a.duration), 0)
                    for i in range(int(hot_factor * a.rate * a.duration))]
            continue
        rate = a.rate * (hot_factor if k == 0 else 1.0)
        t = rng.expovariate(rate) if rate > 0 else a.duration
        while t < a.duration:
            out.append((t, k))
            t += rng.expovariate(rate)
    return sorted(out)


def worker(args):
    """One process: its share of the schedule, each request sent at its arrival time."""
    url, items, prompt_tokens, new_tokens, prefix, start_at, seed = args
    u = urllib.parse.urlparse(url)
    host, port = u.hostname, u.port or 80

    async def run():
        rng = random.Random(seed)
        prompts = [await make_prompt(host, port, rng, prompt_tokens) for _ in items]
        results = []

        async def one(i, t, k):
            await asyncio.sleep(max(0.0, start_at + t - time.time()))
            await stream_one(host, port, prompts[i], new_tokens, results,
                             group="hot" if k == 0 else "quiet", adapter=f"{prefix}{k:02d}")

        await asyncio.gather(*(one(i, t, k) for i, (t, k) in enumerate(items)))
        return results

    return asyncio.run(run())


def run_load(a, name, hot_factor, seed):
    items = schedule(a, hot_factor)
    shares = [items[p::a.procs] for p in range(a.procs)]
    # Prompts are made (through /tokenize) before the clock starts: start a while from now.
    start_at = time.time() + 5.0 + len(items) / (200.0 * a.procs)
    with multiprocessing.Pool(a.procs) as pool:
        parts = pool.map(worker, [(a.url, sh, a.prompt_tokens, a.new_tokens, a.prefix, start_at,
                                   seed * 1000 + p) for p, sh in enumerate(shares)])
    results = [r for part in parts for r in part]
    ok = [r for r in results if r["error"] is None]
    errors = [r["error"] for r in results if r["error"] is not None]
    end = max((r["times"][-1] for r in ok if r["times"]), default=start_at)
    tokens = sum(len(r["times"]) for r in ok)
    out = {"run": name, "requests": len(items), "completed": len(ok), "errors": len(errors),
           "first_errors": errors[:3]}
    for group in ("quiet", "hot"):
        g = [(r["times"][0] - r["t0"]) * 1e3 for r in ok if r["times"] and r["group"] == group]
        if g:
            out[f"ttft_ms_{group}"] = {"n": len(g), "p50": round(pct(g, 50), 1),
                                       "p99": round(pct(g, 99), 1)}
    wall = max(1e-9, end - min((r["t0"] for r in results), default=end))
    out["tokens_per_s"] = round(tokens / wall, 1)
    print(json.dumps(out), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--adapters", type=int, default=32)
    ap.add_argument("--prefix", default="a")
    ap.add_argument("--rate", type=float, default=3.0, help="requests/s of each quiet adapter")
    ap.add_argument("--hot-factor", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--hot-burst", action="store_true",
                    help="the hot adapter sends its requests in the first half second (a batch "
                         "job beside interactive tenants), not as a Poisson stream")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)

    async def warm():  # every adapter loaded, its first-use costs paid
        rng = random.Random(99)
        p = await make_prompt(u.hostname, u.port or 80, rng, a.prompt_tokens)
        res = []
        await asyncio.gather(*(stream_one(u.hostname, u.port or 80, p, 4, res,
                                          adapter=f"{a.prefix}{k:02d}")
                               for k in range(a.adapters)))
        bad = [r["error"] for r in res if r["error"]]
        if bad:
            raise SystemExit(f"warm-up failed: {bad[:3]}")

    asyncio.run(warm())
    unloaded = run_load(a, "unloaded", 0.0, 1)
    loaded = run_load(a, "loaded", a.hot_factor, 2)
    summary = {"adapters": a.adapters, "rate_per_quiet_adapter": a.rate,
               "hot_factor": a.hot_factor, "hot_burst": a.hot_burst, "duration_s": a.duration,
               "prompt_tokens": a.prompt_tokens, "new_tokens": a.new_tokens,
               "unloaded": unloaded, "loaded": loaded}
    q0, q1 = unloaded.get("ttft_ms_quiet"), loaded.get("ttft_ms_quiet")
    if q0 and q1:
        summary["quiet_p99_ratio"] = round(q1["p99"] / q0["p99"], 3)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps({k: summary[k] for k in summary if k not in ("unloaded", "loaded")}))
    return 0 if unloaded["errors"] == 0 and loaded["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
