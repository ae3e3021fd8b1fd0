"""`kestrel serve --quantize fp8 --kv-cache-dtype fp8`: /info says what the weights and the KV cache
are and what they take, greedy output equals `kestrel generate` with the same options, the cache
holds four times the blocks in the same memory (F32 -> E4M3 on the CPU), and a batch of
concurrent streams finishes with no block held."""
import json
import subprocess
import threading
import time

import requests

from conftest import BINARY, MODEL, Server

PROMPT = "The falcon is a bird of prey that"


def test_fp8_server_info_output_and_cache():
    full = Server("--max-input-length", 64, "--max-total-tokens", 128, "--kv-cache-memory", "4MiB")
    try:
        base_info = requests.get(full.url + "/info", timeout=10).json()
        base_blocks = full.metrics()["kestrel_kv_blocks_total"]
    finally:
        assert full.stop() == 0
    s = Server("--max-input-length", 64, "--max-total-tokens", 128, "--kv-cache-memory", "4MiB",
               "--quantize", "fp8", "--kv-cache-dtype", "fp8")
    try:
        info = requests.get(s.url + "/info", timeout=10).json()
        assert info["quantize"] == "fp8" and base_info["quantize"] is None
        assert info["weight_dtype"] == "F8_E4M3" and base_info["weight_dtype"] == "F32"
        assert info["kv_cache_dtype"] == "F8_E4M3" and base_info["kv_cache_dtype"] == "F32"
        assert info["weight_bytes"] < base_info["weight_bytes"]
        assert s.metrics()["kestrel_kv_blocks_total"] == 4 * base_blocks
        assert info["kv_cache_tokens"] == 4 * base_info["kv_cache_tokens"]
        assert abs(info["kv_cache_bytes"] - base_info["kv_cache_bytes"]) <= \
            base_info["kv_cache_bytes"] / base_blocks  # the same memory, 4x the tokens
        assert "linears F8_E4M3" in s.stderr()
        out = subprocess.run([str(BINARY), "generate", "--model", str(MODEL), "--prompt", PROMPT,
                              "--max-new-tokens", "12", "--greedy", "--json", "--quantize", "fp8",
                              "--kv-cache-dtype", "fp8"],
                             check=True, capture_output=True, text=True, timeout=300)
        want = json.loads(out.stdout)["outputs"][0]["text"]
        r = requests.post(s.url + "/generate", json={
            "inputs": PROMPT, "parameters": {"max_new_tokens": 12, "temperature": 0}}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["generated_text"] == want
        results = []

        def stream(i):
            r = requests.post(s.url + "/generate_stream", timeout=300, json={
                "inputs": f"{PROMPT} {i}", "parameters": {"max_new_tokens": 16,
                                                         "ignore_eos_token": True}})
            results.append(r.status_code == 200 and '"generated_text":"' in r.text)

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert results == [True] * 16
        # The engine frees a finished sequence's blocks at its next step: wait for it.
        deadline = time.time() + 30
        while time.time() < deadline and s.metrics()["kestrel_kv_blocks_used"] != 0:
            time.sleep(0.05)
        m = s.metrics()
        assert m["kestrel_kv_blocks_used"] == 0 and m["lorax_request_in_flight"] == 0
    finally:
        assert s.stop() == 0, s.stderr()
