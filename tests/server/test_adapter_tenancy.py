"""Adapter tenancy over HTTP: vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter
behind the API key (a round trip that requests under the new name follow, through lorax-client
and the OpenAI client), their refusals, and --max-requests-per-adapter (429 for the adapter at
its cap, nobody else). Fair admission across adapters is tests/engine (fairness_test); its GPU
measurement is bench/serve_load.py --adapters (docs/benchmarks.md).
"""
import threading
import time

import pytest
import requests

from conftest import ROOT, Server, server_fixture

ADAPTERS = ROOT / "tests" / "data" / "merge-falcon7b" / "adapters"
KEY = "tenancy-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "The falcon is a bird of prey that"
N = 8


tenancy_server = server_fixture("--adapters-dir", ADAPTERS, "--api-key", KEY,
                                "--max-requests-per-adapter", 2, "--max-input-length", 256,
                                "--max-total-tokens", 2048)


@pytest.fixture(scope="module")
def turl(tenancy_server):
    return tenancy_server.url


def load(url, name, path, headers=AUTH, **extra):
    return requests.post(url + "/v1/load_lora_adapter",
                         json={"lora_name": name, "lora_path": str(path), **extra},
                         headers=headers, timeout=60)


def unload(url, name, headers=AUTH):
    return requests.post(url + "/v1/unload_lora_adapter", json={"lora_name": name},
                         headers=headers, timeout=60)


def greedy_ids(url, adapter_id=None):
    params = {"max_new_tokens": N, "details": True}
    if adapter_id:
        params["adapter_id"] = adapter_id
    r = requests.post(url + "/generate", json={"inputs": PROMPT, "parameters": params},
                      headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return [t["id"] for t in r.json()["details"]["tokens"]]


def model_ids(url):
    r = requests.get(url + "/v1/models", headers=AUTH, timeout=10)
    return [m["id"] for m in r.json()["data"]]


def test_load_unload_round_trip(turl):
    from lorax import Client

    client = Client(turl, headers=AUTH, timeout=120)
    r = load(turl, "prod", "m1-r4-all")
    assert r.status_code == 200, r.text
    assert r.text == "Success: LoRA adapter 'prod' added successfully."
    assert "prod" in model_ids(turl)
    # Requests under the new name run the folder's adapter.
    direct = client.generate(PROMPT, max_new_tokens=N, details=True, adapter_id="m1-r4-all")
    named = client.generate(PROMPT, max_new_tokens=N, details=True, adapter_id="prod")
    assert [t.id for t in named.details.tokens] == [t.id for t in direct.details.tokens]
    assert [t.id for t in named.details.tokens] != greedy_ids(turl), "the adapter changes nothing"

    # The OpenAI client names it as a model.
    from openai import OpenAI
    oa = OpenAI(base_url=turl + "/v1", api_key=KEY)
    out = oa.completions.create(model="prod", prompt=PROMPT, max_tokens=N, temperature=0)
    assert out.model == "prod"
    assert out.choices[0].text == named.generated_text

    # Taken: 409 unless load_inplace, which swaps the weights under the name.
    r = load(turl, "prod", "m2-r4-attn-fc1-rslora")
    assert r.status_code == 409, r.text
    assert "already loaded" in r.json()["error"]
    assert greedy_ids(turl, "prod") == [t.id for t in direct.details.tokens]
    r = load(turl, "prod", "m2-r4-attn-fc1-rslora", load_inplace=True)
    assert r.status_code == 200, r.text
    assert greedy_ids(turl, "prod") == greedy_ids(turl, "m2-r4-attn-fc1-rslora")

    r = unload(turl, "prod")
    assert r.status_code == 200, r.text
    assert r.text == "Success: LoRA adapter 'prod' removed successfully."
    assert "prod" not in model_ids(turl)
    gone = requests.post(turl + "/generate",
                         json={"inputs": PROMPT, "parameters": {"adapter_id": "prod"}},
                         headers=AUTH, timeout=60)
    assert gone.status_code == 404, gone.text
    r = unload(turl, "prod")
    assert r.status_code == 404, r.text
    assert "prod" in r.json()["error"]
    assert requests.get(turl + "/health", timeout=5).status_code == 200


@pytest.mark.parametrize("body,status,needle", [
    ({"lora_name": "x", "lora_path": "../merge-falcon7b"}, 422, "lora_path"),
    ({"lora_name": "x", "lora_path": "/etc"}, 422, "absolute paths"),
    ({"lora_name": "x", "lora_path": "no-such-adapter"}, 404, "not found"),
    ({"lora_path": "m1-r4-all"}, 422, "lora_name"),
    ({"lora_name": "x"}, 422, "lora_path"),
    ({"lora_name": 7, "lora_path": "m1-r4-all"}, 422, "lora_name"),
    ({"lora_name": "merge:abc", "lora_path": "m1-r4-all"}, 422, "lora_name"),
    ({"lora_name": "/abs", "lora_path": "m1-r4-all"}, 422, "lora_name"),
    ({"lora_name": "x" * 300, "lora_path": "m1-r4-all"}, 422, "lora_name"),
    ({"lora_name": "x", "lora_path": "m1-r4-all", "adapter_source": "s3"}, 422, "adapter_source"),
    ({"lora_name": "x", "lora_path": "m1-r4-all", "load_inplace": "yes"}, 422, "load_inplace"),
])
def test_load_refusals(turl, body, status, needle):
    r = requests.post(turl + "/v1/load_lora_adapter", json=body, headers=AUTH, timeout=60)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"], r.json()
    assert str(ADAPTERS) not in r.text, "a server path in the answer"
    assert "x" not in model_ids(turl)
    assert requests.get(turl + "/health", timeout=5).status_code == 200


def test_admin_routes_need_the_key(turl):
    assert load(turl, "k", "m1-r4-all", headers={}).status_code == 401
    assert unload(turl, "k", headers={"Authorization": "Bearer wrong"}).status_code == 401
    r = requests.post(turl + "/v1/load_lora_adapter", data="{not json", headers=AUTH, timeout=10)
    assert r.status_code in (400, 422), r.text
    r = requests.get(turl + "/v1/load_lora_adapter", headers=AUTH, timeout=10)
    assert r.status_code == 405


def test_without_a_key_runtime_loading_is_off():
    s = Server("--adapters-dir", ADAPTERS)
    try:
        r = load(s.url, "a", "m1-r4-all", headers={})
        assert r.status_code == 403, r.text
        assert "--api-key" in r.json()["error"]
        assert unload(s.url, "a", headers={}).status_code == 403
    finally:
        assert s.stop() == 0
    s = Server("--adapters-dir", ADAPTERS, "--allow-runtime-adapters")
    try:
        assert load(s.url, "a", "m1-r4-all", headers={}).status_code == 200
        assert unload(s.url, "a", headers={}).status_code == 200
    finally:
        assert s.stop() == 0


class Stream:
    """A /generate_stream request held open after its first token."""

    def __init__(self, url, adapter_id):
        self.resp = requests.post(
            url + "/generate_stream",
            json={"inputs": PROMPT, "parameters": {"adapter_id": adapter_id,
                                                   "max_new_tokens": 1700,
                                                   "ignore_eos_token": True}},
            headers=AUTH, stream=True, timeout=120)
        assert self.resp.status_code == 200, self.resp.text
        self.lines = self.resp.iter_lines()
        for line in self.lines:
            if line.startswith(b"data:"):
                break

    def close(self):
        self.resp.close()


def test_max_requests_per_adapter(turl):
    held = [Stream(turl, "m3-r4-mlp-layer1") for _ in range(2)]
    try:
        r = requests.post(turl + "/generate",
                          json={"inputs": PROMPT,
                                "parameters": {"adapter_id": "m3-r4-mlp-layer1",
                                               "max_new_tokens": 2}},
                          headers=AUTH, timeout=60)
        assert r.status_code == 429, r.text
        assert "--max-requests-per-adapter" in r.json()["error"]
        assert "m3-r4-mlp-layer1" in r.json()["error"]
        # Other adapters and the base model are not capped by it.
        assert len(greedy_ids(turl, "m4-r2-qkv")) == N
        assert len(greedy_ids(turl)) == N
    finally:
        for s in held:
            s.close()
    # The slots come back when the streams end (the server cancels a request whose client left).
    deadline = time.time() + 30
    while True:
        r = requests.post(turl + "/generate",
                          json={"inputs": PROMPT,
                                "parameters": {"adapter_id": "m3-r4-mlp-layer1",
                                               "max_new_tokens": 2}},
                          headers=AUTH, timeout=60)
        if r.status_code == 200 or time.time() > deadline:
            break
        time.sleep(0.1)
    assert r.status_code == 200, r.text
