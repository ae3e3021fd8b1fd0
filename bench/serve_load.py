#!/usr/bin/env python3
"""Bounded load test of a running `kestrel serve` (Python stdlib only).

N concurrent streaming requests (POST /generate_stream) of exactly P prompt
tokens (distinct random words, checked through /tokenize, so the prefix cache
does not help) and G new tokens (ignore_eos_token). Reports completed tokens/s
over the whole run, time to first token and inter-token latency p50 / p99, and
errors (a non-200 reply, an `event:error`, or fewer than G tokens).

Structured output: --schema FILE --constrained 0.5 sends every other request with
`response_format` = that JSON schema (pick one no G-token output can complete, so that every
request makes G tokens); --new-schemas K gives the first K constrained requests a schema of their
own (a property renamed), each a fresh compile. TTFT is then reported per group, with the server's
compile-time quantiles and bitmask time from /metrics.

    python3 bench/serve_load.py --url http://127.0.0.1:8080 --requests 256 \
        --concurrency 256 --prompt-tokens 128 --new-tokens 128 [--json OUT.json]
"""
import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import urllib.parse

WORDS = ("falcon river stone light quiet market garden signal harbor copper winter meadow "
         "lantern orbit canyon velvet ember thunder cedar prism basalt willow comet marble "
         "tundra saffron glacier echo ridge nectar cobalt harvest beacon dune fern quartz").split()


async def http(host, port, method, path, body=None):
    """One HTTP/1.0 exchange: (status, body bytes). HTTP/1.0 means no chunking."""
    reader, writer = await asyncio.open_connection(host, port)
    data = json.dumps(body).encode() if body is not None else b""
    writer.write(f"{method} {path} HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest


async def make_prompt(host, port, rng, n_tokens):
    words = [rng.choice(WORDS) for _ in range(n_tokens)]
    for _ in range(50):
        status, body = await http(host, port, "POST", "/tokenize", {"inputs": " ".join(words)})
        if status != 200:
            raise RuntimeError(f"/tokenize: HTTP {status}: {body[:200]!r}")
        n = len(json.loads(body))
        if n == n_tokens:
            return " ".join(words)
        if n > n_tokens:
            words = words[:len(words) - max(1, (n - n_tokens) // 2)]
        else:
            words += [rng.choice(WORDS) for _ in range(max(1, (n_tokens - n) // 2))]
    raise RuntimeError(f"could not build a prompt of exactly {n_tokens} tokens")


async def stream_one(host, port, prompt, new_tokens, out, schema=None, group="plain",
                     adapter=None):
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    params = {"max_new_tokens": new_tokens, "ignore_eos_token": True}
    if adapter:
        params["adapter_id"] = adapter
    if schema is not None:
        params["response_format"] = {"type": "json_object", "schema": schema}
    body = json.dumps({"inputs": prompt, "parameters": params}).encode()
    writer.write(f"POST /generate_stream HTTP/1.0\r\nHost: {host}\r\n"
                 f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    buf = b""
    times = []
    status = None
    error = None
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            break
        buf += chunk
        if status is None and b"\r\n\r\n" in buf:
            head, _, buf = buf.partition(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
        if status is None:
            continue
        while b"\n\n" in buf:
            event, _, buf = buf.partition(b"\n\n")
            now = time.perf_counter()
            for line in event.split(b"\n"):
                if line.startswith(b"event:") and b"error" in line:
                    error = event.decode(errors="replace")
                if line.startswith(b"data:"):
                    payload = json.loads(line[5:])
                    if "error" in payload:
                        error = str(payload["error"])
                    elif "token" in payload:
                        times.append(now)
    writer.close()
    if status != 200:
        error = f"HTTP {status}: {buf[:200]!r}"
    elif error is None and len(times) != new_tokens:
        error = f"{len(times)} tokens, expected {new_tokens}"
    out.append({"t0": t0, "times": times, "error": error, "group": group})


def pct(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100.0 * (len(s) - 1))))]


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="")
    ap.add_argument("--schema", default="", help="JSON schema file for constrained requests")
    ap.add_argument("--constrained", type=float, default=0.0, help="fraction constrained")
    ap.add_argument("--new-schemas", type=int, default=0,
                    help="constrained requests with a schema of their own (a fresh compile)")
    a = ap.parse_args()
    schema = json.load(open(a.schema)) if a.schema else None
    u = urllib.parse.urlparse(a.url)
    host, port = u.hostname, u.port or 80
    rng = random.Random(a.seed)
    prompts = [await make_prompt(host, port, rng, a.prompt_tokens) for _ in range(a.requests)]
    results = []
    sem = asyncio.Semaphore(a.concurrency)

    # Which requests are constrained: evenly spread, the first --new-schemas with their own schema.
    plan, n_constrained = [], 0
    for i in range(a.requests):
        if schema is not None and int((i + 1) * a.constrained) > int(i * a.constrained):
            s_i, group = schema, "cached_schema"
            if n_constrained < a.new_schemas:
                s_i = json.loads(json.dumps(schema).replace('"id"', f'"id{n_constrained}"'))
                group = "new_schema"
            plan.append((s_i, group))
            n_constrained += 1
        else:
            plan.append((None, "plain"))
    if schema is not None:  # one warm-up compile of the shared schema, as a server that has seen it
        await stream_one(host, port, prompts[0], 2, [], schema, "warmup")

    async def bounded(i, p):
        async with sem:
            await stream_one(host, port, p, a.new_tokens, results, *plan[i])

    t_start = time.perf_counter()
    await asyncio.gather(*(bounded(i, p) for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t_start
    ok = [r for r in results if r["error"] is None]
    errors = [r["error"] for r in results if r["error"] is not None]
    ttft = [(r["times"][0] - r["t0"]) * 1e3 for r in ok if r["times"]]
    itl = [(b - a_) * 1e3 for r in ok for a_, b in zip(r["times"], r["times"][1:])]
    tokens = sum(len(r["times"]) for r in ok)
    summary = {
        "requests": a.requests, "concurrency": a.concurrency, "prompt_tokens": a.prompt_tokens,
        "new_tokens": a.new_tokens, "completed": len(ok), "errors": len(errors),
        "wall_s": round(wall, 3), "completed_tokens_per_s": round(tokens / wall, 1),
        "ttft_ms_p50": round(pct(ttft, 50), 1), "ttft_ms_p99": round(pct(ttft, 99), 1),
        "itl_ms_p50": round(pct(itl, 50), 2), "itl_ms_p99": round(pct(itl, 99), 2),
        "itl_ms_mean": round(statistics.fmean(itl), 2) if itl else None,
        "first_errors": errors[:3],
    }
    if schema is not None:
        for group in ("plain", "cached_schema", "new_schema"):
            g = [(r["times"][0] - r["t0"]) * 1e3 for r in ok if r["times"] and r["group"] == group]
            if g:
                summary[f"ttft_ms_{group}"] = {"n": len(g), "p50": round(pct(g, 50), 1),
                                               "p99": round(pct(g, 99), 1)}
        status, body = await http(host, port, "GET", "/metrics")
        m = {}
        for line in body.decode().splitlines():
            if line.startswith("kestrel_grammar") or line.startswith("kestrel_engine_steps_total"):
                name, _, value = line.rpartition(" ")
                m[name] = float(value)
        summary["grammar_compile_ms_p50"] = round(
            1e3 * m.get('kestrel_grammar_compile_seconds{quantile="0.5"}', float("nan")), 1)
        summary["grammar_compile_ms_p99"] = round(
            1e3 * m.get('kestrel_grammar_compile_seconds{quantile="0.99"}', float("nan")), 1)
        rows = m.get("kestrel_grammar_masked_rows_total", 0)
        mask_s = m.get("kestrel_grammar_mask_seconds_total", 0)
        summary["grammar_compiles"] = m.get("kestrel_grammar_compiles_total")
        summary["mask_us_per_row"] = round(1e6 * mask_s / rows, 1) if rows else None
        summary["mask_ms_per_step"] = round(
            1e3 * mask_s / max(1.0, m.get("kestrel_engine_steps_total", 1)), 3)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps(summary))
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
