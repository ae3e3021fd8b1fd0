"""The non-generating routes, auth, 429, and SIGTERM draining."""
import json
import signal
import threading
import time

import requests

from conftest import Server


def test_info(url):
    info = requests.get(url + "/info", timeout=10).json()
    assert info["model_id"] == "e2e-falcon7b-fullvocab"
    assert info["max_input_length"] == 256
    assert info["max_total_tokens"] == 512
    assert info["version"]


def test_health(url):
    r = requests.get(url + "/health", timeout=10)
    assert r.status_code == 200


def test_docs_serves_openapi(url):
    spec = requests.get(url + "/docs", timeout=10).json()
    assert spec["openapi"].startswith("3.")
    for path in ["/generate", "/generate_stream", "/v1/completions", "/v1/chat/completions", "/tokenize"]:
        assert path in spec["paths"]


def test_tokenize(url):
    r = requests.post(url + "/tokenize", json={"inputs": "Hello world"}, timeout=10)
    assert r.status_code == 200
    toks = r.json()
    assert "".join(t["text"] for t in toks) == "Hello world"
    assert toks[0]["start"] == 0 and toks[-1]["stop"] == len("Hello world")


def test_metrics_names(server, url):
    requests.post(url + "/generate", json={"inputs": "metrics", "parameters": {"max_new_tokens": 2}}, timeout=30)
    text = requests.get(url + "/metrics", timeout=10).text
    for name in ["lorax_request_count", "lorax_request_success", "lorax_request_failure",
                 "lorax_request_duration_bucket", "lorax_request_queue_duration_count",
                 "lorax_request_inference_duration_sum", "lorax_request_mean_time_per_token_duration_count",
                 "lorax_request_generated_tokens_sum", "lorax_request_input_length_count",
                 "lorax_queue_length", "lorax_batch_current_size", "kestrel_kv_blocks_total",
                 "kestrel_kv_blocks_used", "kestrel_kv_cache_usage"]:
        assert name in text, name
    assert server.metrics()["lorax_request_success"] >= 1


def test_startup_prints_address(server):
    assert server.address_line.startswith("kestrel serving ")
    assert "loading model" in server.stderr()


def test_api_key_and_overload():
    s = Server("--api-key", "sekrit", "--max-concurrent-requests", 1)
    try:
        assert requests.get(s.url + "/health", timeout=10).status_code == 200
        r = requests.post(s.url + "/generate", json={"inputs": "x"}, timeout=10)
        assert r.status_code == 401
        auth = {"Authorization": "Bearer sekrit"}
        assert requests.get(s.url + "/info", headers=auth, timeout=10).status_code == 200
        # One long stream holds the only slot: the next request gets 429.
        slow = requests.post(s.url + "/generate_stream", headers=auth, stream=True, timeout=60,
                             json={"inputs": "x", "parameters": {"max_new_tokens": 400, "ignore_eos_token": True}})
        it = slow.iter_lines()
        next(l for l in it if l.startswith(b"data:"))
        r = requests.post(s.url + "/generate", headers=auth, json={"inputs": "x"}, timeout=10)
        assert r.status_code == 429, r.text
        assert r.json()["error_type"] == "overloaded"
        slow.close()
    finally:
        assert s.stop() == 0


def test_sigterm_drains_in_flight():
    s = Server()
    result = {"events": []}
    first = threading.Event()

    def stream():
        r = requests.post(s.url + "/generate_stream", stream=True, timeout=120,
                          json={"inputs": "drain me", "parameters": {"max_new_tokens": 200, "ignore_eos_token": True}})
        for line in r.iter_lines():
            if line.startswith(b"data:"):
                result["events"].append(json.loads(line[5:]))
                first.set()

    t = threading.Thread(target=stream)
    t.start()
    # The signal arrives while the request is streaming (a loaded machine may take a while to start it).
    assert first.wait(60), "no token streamed within 60 s"
    s.proc.send_signal(signal.SIGTERM)
    t.join(120)
    assert s.proc.wait(60) == 0, s.stderr()
    events = result["events"]
    assert events[-1]["details"] is not None, events[-1]
    assert events[-1]["details"]["generated_tokens"] == 200
    assert s.proc.returncode == 0


def test_sigint_exits_zero():
    s = Server()
    assert s.stop(signal.SIGINT) == 0
