"""Bounded load on loopback: 500 concurrent streaming requests, 100 of them cut
by the client mid-stream. Every stream that is read to the end completes with
no error, and once idle the server holds 0 KV blocks (read from /metrics).
Writes throughput and time-to-first-token percentiles to $KESTREL_LOAD_REPORT
(default /tmp/kestrel-load-report.json) and prints them."""
import asyncio
import json
import os
import statistics
import time

import aiohttp
import pytest

N_STREAMS = int(os.environ.get("KESTREL_LOAD_STREAMS", 500))
N_CUT = int(os.environ.get("KESTREL_LOAD_CUT", 100))
MAX_NEW = 16


async def one_stream(session, url, i, cut):
    body = {"inputs": f"Request {i}: the falcon", "parameters": {"max_new_tokens": MAX_NEW, "ignore_eos_token": True}}
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    final = None
    async with session.post(url + "/generate_stream", json=body) as resp:
        if resp.status != 200:
            return {"error": f"status {resp.status}: {await resp.text()}"}
        async for line in resp.content:
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                return {"error": event["error"]}
            tokens += 1
            if ttft is None:
                ttft = time.perf_counter() - t0
            if cut and tokens >= 2:
                resp.close()  # the client goes away mid-stream
                return {"cut": True, "ttft": ttft, "tokens": tokens}
            if event.get("details"):
                final = event
    if final is None:
        return {"error": "stream ended without the final event"}
    return {"ttft": ttft, "tokens": tokens, "total": time.perf_counter() - t0,
            "generated": final["details"]["generated_tokens"]}


async def run_load(url):
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()
        results = await asyncio.gather(*[one_stream(session, url, i, i % (N_STREAMS // N_CUT) == 0 if N_CUT else False)
                                         for i in range(N_STREAMS)], return_exceptions=True)
        wall = time.perf_counter() - t0
    return results, wall


def percentile(values, p):
    values = sorted(values)
    k = max(0, min(len(values) - 1, int(round(p / 100 * (len(values) - 1)))))
    return values[k]


def test_load_500_streams_100_cut(server):
    url = server.url
    results, wall = asyncio.run(run_load(url))
    errors = [r for r in results if isinstance(r, Exception) or "error" in r]
    assert not errors, errors[:5]
    done = [r for r in results if not r.get("cut")]
    cut = [r for r in results if r.get("cut")]
    assert len(cut) == N_CUT
    assert all(r["generated"] == MAX_NEW and r["tokens"] == MAX_NEW for r in done)

    # Once idle, nothing holds KV blocks and nothing is in flight.
    deadline = time.time() + 60
    while True:
        m = server.metrics()
        if (m["kestrel_kv_blocks_used"] == 0 and m["lorax_request_in_flight"] == 0) or time.time() > deadline:
            break
        time.sleep(0.2)
    assert m["kestrel_kv_blocks_used"] == 0, m
    assert m["lorax_request_in_flight"] == 0, m
    assert m["lorax_queue_length"] == 0, m

    ttfts = [r["ttft"] for r in results if r.get("ttft") is not None]
    tokens = sum(r["tokens"] for r in results)
    report = {
        "streams": N_STREAMS, "cut": N_CUT, "max_new_tokens": MAX_NEW, "wall_s": round(wall, 3),
        "tokens_streamed": tokens, "tokens_per_s": round(tokens / wall, 1),
        "requests_per_s": round(N_STREAMS / wall, 1),
        "ttft_p50_s": round(percentile(ttfts, 50), 4), "ttft_p99_s": round(percentile(ttfts, 99), 4),
        "ttft_mean_s": round(statistics.mean(ttfts), 4),
        "cancelled_in_metrics": m.get('lorax_request_failure{err="cancelled"}', 0),
        "cpus": os.cpu_count(),
    }
    path = os.environ.get("KESTREL_LOAD_REPORT", "/tmp/kestrel-load-report.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print("\nload:", json.dumps(report))
    assert server.alive()
