"""LoRA adapters over HTTP: adapter_id / adapter_source on the LoRAX routes, OpenAI's `model`,
--adapters-dir, --adapter NAME=DIR, the offline hub cache, folder paths (the server here runs with
--allow-adapter-paths; the confinement without it is test_hostile.py's), broken adapters as 4xx
with the server healthy and other requests unaffected, /v1/models, /info and /metrics.

The truth is tests/data/lora-e2e-falcon7b-fullvocab/fixture.json: the greedy continuations of the
base fixture's prompts under adapter e1-r8-all (transformers + peft).
"""
import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests

from conftest import MODEL, ROOT, Server

FIXTURE = ROOT / "tests" / "data" / "lora-e2e-falcon7b-fullvocab"
ADAPTER = FIXTURE / "adapters" / "e1-r8-all"
LORA = json.loads((FIXTURE / "fixture.json").read_text())["adapters"]["e1-r8-all"]
BASE = json.loads((MODEL / "fixture.json").read_text())
PROMPTS = BASE["texts"]
N = 12  # the fixtures' greedy length


def copy_adapter(dst):
    shutil.copytree(ADAPTER, dst)
    return dst


def edit_config(folder, **changes):
    path = Path(folder) / "adapter_config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """Adapter folders: a named one under --adapters-dir, a preload, a hub snapshot, broken ones."""
    tmp = tmp_path_factory.mktemp("lora")
    copy_adapter(tmp / "adir" / "named-e1")
    copy_adapter(tmp / "pre-e1")
    hub = tmp / "hub"
    copy_adapter(hub / "models--org--e1-hub" / "snapshots" / "rev1")
    (hub / "models--org--e1-hub" / "refs").mkdir(parents=True)
    (hub / "models--org--e1-hub" / "refs" / "main").write_text("rev1\n")
    corrupt = copy_adapter(tmp / "corrupt")
    with open(corrupt / "adapter_model.safetensors", "r+b") as f:
        f.truncate(100)
    edit_config(copy_adapter(tmp / "rank"), r=4)
    edit_config(copy_adapter(tmp / "dora"), use_dora=True)
    for i in range(4):
        copy_adapter(tmp / f"fresh{i}")  # loaded by one test each, never before
    # A load that lasts as long as the test wants: the loader blocks opening this FIFO (its
    # adapter_config.json) until the test writes the real config into it.
    slow = copy_adapter(tmp / "slow")
    config = (slow / "adapter_config.json").read_bytes()
    (slow / "adapter_config.json").unlink()
    os.mkfifo(slow / "adapter_config.json")
    (tmp / "slow-config.json").write_bytes(config)
    return tmp


@pytest.fixture(scope="module")
def lora_server(layout):
    env = {**os.environ, "HF_HUB_CACHE": str(layout / "hub")}
    s = Server("--max-input-length", 256, "--max-total-tokens", 512, "--adapters-dir",
               layout / "adir", "--adapter", f"pre={layout / 'pre-e1'}", "--max-loaded-adapters",
               8, "--allow-adapter-paths", env=env)
    yield s
    assert s.stop() == 0, s.stderr()


@pytest.fixture(scope="module")
def lurl(lora_server):
    return lora_server.url


def generate(url, prompt, path="/generate", timeout=120, **params):
    body = {"inputs": prompt, "parameters": {"max_new_tokens": N, **params}}
    return requests.post(url + path, json=body, timeout=timeout)


def greedy_text(url, prompt, **params):
    r = generate(url, prompt, **params)
    assert r.status_code == 200, r.text
    return r.json()["generated_text"]


def test_base_model_unchanged(lurl):
    for prompt, text in zip(PROMPTS, BASE["greedy_text"]):
        assert greedy_text(lurl, prompt) == text
        assert greedy_text(lurl, prompt, adapter_id="") == text  # "" is the base model


def test_generate_with_local_folder(lurl):
    for prompt, text in zip(PROMPTS, LORA["greedy_text"]):
        assert greedy_text(lurl, prompt, adapter_id=str(ADAPTER)) == text
    # adapter_source "local" said explicitly, and the two other LoRAX routes
    assert greedy_text(lurl, PROMPTS[0], adapter_id=str(ADAPTER),
                       adapter_source="local") == LORA["greedy_text"][0]
    r = requests.post(lurl + "/", json={"inputs": PROMPTS[1], "parameters": {
        "max_new_tokens": N, "adapter_id": str(ADAPTER)}}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()[0]["generated_text"] == LORA["greedy_text"][1]
    assert r.headers["x-adapter-id"] == str(ADAPTER)  # LoRAX's response headers
    assert r.headers["x-adapter-source"] == "local"
    r = generate(lurl, PROMPTS[2], path="/generate_stream", adapter_id=str(ADAPTER))
    assert r.status_code == 200, r.text
    text = r.content.decode("utf-8")  # SSE: no charset in the content type
    events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    assert events[-1]["generated_text"] == LORA["greedy_text"][2]
    assert "".join(e["token"]["text"] for e in events) == LORA["greedy_text"][2]
    assert r.headers["x-adapter-id"] == str(ADAPTER)
    base = generate(lurl, PROMPTS[0], max_new_tokens=1)
    assert "x-adapter-id" not in base.headers


def test_openai_model_is_the_adapter(lurl):
    import openai

    client = openai.OpenAI(base_url=lurl + "/v1", api_key="x", max_retries=0, timeout=120)
    for prompt, text in zip(PROMPTS, LORA["greedy_text"]):
        c = client.completions.create(model=str(ADAPTER), prompt=prompt, max_tokens=N,
                                      temperature=0)
        assert c.choices[0].text == text
        assert c.model == str(ADAPTER)
    # The base model's id (and the model folder's name) means no adapter.
    models = client.models.list()
    base_id = models.data[0].id
    c = client.completions.create(model=base_id, prompt=PROMPTS[0], max_tokens=N, temperature=0)
    assert c.choices[0].text == BASE["greedy_text"][0]
    c = client.completions.create(model="", prompt=PROMPTS[0], max_tokens=N, temperature=0)
    assert c.choices[0].text == BASE["greedy_text"][0]
    # Chat takes the adapter the same way (no fixture text for a chat prompt: it must differ
    # from the base model's answer to the same messages, at least in some token).
    messages = [{"role": "user", "content": PROMPTS[0]}]
    base = client.chat.completions.create(model=base_id, messages=messages, max_tokens=N,
                                          temperature=0)
    lora = client.chat.completions.create(model="pre", messages=messages, max_tokens=N,
                                          temperature=0)
    assert lora.model == "pre"
    assert lora.choices[0].message.content != base.choices[0].message.content


def test_name_under_adapters_dir(lurl):
    assert greedy_text(lurl, PROMPTS[0], adapter_id="named-e1") == LORA["greedy_text"][0]
    r = requests.post(lurl + "/v1/completions", json={
        "model": "named-e1", "prompt": PROMPTS[1], "max_tokens": N, "temperature": 0}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == LORA["greedy_text"][1]


def test_preloaded_adapter(lurl):
    assert greedy_text(lurl, PROMPTS[2], adapter_id="pre") == LORA["greedy_text"][2]


def test_hub_source_offline_cache(lurl):
    r = generate(lurl, PROMPTS[0], adapter_id="org/e1-hub", adapter_source="hub")
    assert r.status_code == 200, r.text
    assert r.json()["generated_text"] == LORA["greedy_text"][0]
    assert r.headers["x-adapter-id"] == "org/e1-hub" and r.headers["x-adapter-source"] == "hub"
    # OpenAI: an ORG/NAME id that is no local folder is looked up in the hub cache.
    r = requests.post(lurl + "/v1/completions", json={
        "model": "org/e1-hub", "prompt": PROMPTS[1], "max_tokens": N, "temperature": 0},
        timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == LORA["greedy_text"][1]
    # Not in the cache: a 404 saying where it looked and that kestrel never downloads.
    r = generate(lurl, PROMPTS[0], adapter_id="org/absent", adapter_source="hub")
    assert r.status_code == 404, r.text
    assert "org/absent" in r.json()["error"] and "never downloads" in r.json()["error"]


def test_lorax_client_adapter_id(lurl):
    from lorax import Client

    client = Client(lurl, timeout=120)
    resp = client.generate(PROMPTS[0], max_new_tokens=N, adapter_id=str(ADAPTER), details=True)
    assert resp.generated_text == LORA["greedy_text"][0]
    streamed = list(client.generate_stream(PROMPTS[1], max_new_tokens=N, adapter_id="named-e1"))
    assert streamed[-1].generated_text == LORA["greedy_text"][1]
    resp = client.generate(PROMPTS[2], max_new_tokens=N, adapter_id="org/e1-hub",
                           adapter_source="hub")
    assert resp.generated_text == LORA["greedy_text"][2]


def assert_error(r, status, *needles):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "error_type"}
    for n in needles:
        assert n in body["error"], (n, body)


def test_broken_adapters_fail_alone(lora_server, lurl, layout):
    """Each broken adapter is its own request's 4xx naming the adapter (the reason goes to the
    server log, not to the client), while a base request that runs meanwhile gets exactly its
    greedy text."""
    base_result = {}

    def base_request():
        r = generate(lurl, PROMPTS[1], max_new_tokens=48, ignore_eos_token=True)
        base_result["r"] = r

    t = threading.Thread(target=base_request)
    t.start()
    missing = layout / "no-such-adapter"
    assert_error(generate(lurl, PROMPTS[0], adapter_id=str(missing)), 404, str(missing))
    for name in ("corrupt", "rank", "dora"):
        assert_error(generate(lurl, PROMPTS[0], adapter_id=str(layout / name)), 422,
                     str(layout / name), "could not be loaded")
    # The reasons are in the log (read by a thread of the test: wait for it to catch up).
    reasons = ("adapter_model.safetensors", "rank 4", "use_dora")
    deadline = time.time() + 10
    while time.time() < deadline and not all(r in lora_server.stderr() for r in reasons):
        time.sleep(0.05)
    for reason in reasons:
        assert reason in lora_server.stderr(), reason
    # The same through OpenAI's model and the stream route.
    r = requests.post(lurl + "/v1/completions", json={
        "model": str(layout / "dora"), "prompt": "x", "max_tokens": 2}, timeout=60)
    assert_error(r, 422, "could not be loaded")
    assert_error(generate(lurl, PROMPTS[0], path="/generate_stream",
                          adapter_id=str(layout / "rank")), 422, "could not be loaded")
    r = requests.post(lurl + "/v1/completions", json={
        "model": "not-a-model", "prompt": "x", "max_tokens": 2}, timeout=60)
    assert_error(r, 404, "not-a-model")
    t.join(timeout=300)
    r = base_result["r"]
    assert r.status_code == 200, r.text
    assert r.json()["generated_text"].startswith(BASE["greedy_text"][1])
    assert lora_server.alive()
    assert requests.get(lurl + "/health", timeout=10).status_code == 200
    # A broken adapter does not stay broken for good adapters: the good ones still work.
    assert greedy_text(lurl, PROMPTS[0], adapter_id="pre") == LORA["greedy_text"][0]


def test_unsupported_source_and_fields(lurl):
    assert_error(generate(lurl, "x", adapter_id="a", adapter_source="s3"), 422, "s3",
                 "adapter_source")
    assert_error(generate(lurl, "x", adapter_id="pre", merged_adapters={"ids": ["a", "b"]}), 422,
                 "merged_adapters")
    assert_error(generate(lurl, "x", adapter_parameters={"ids": ["a"]}), 422,
                 "adapter_parameters")


def test_models_and_info_list_loaded_adapters(lurl):
    generate(lurl, PROMPTS[0], adapter_id="named-e1", max_new_tokens=1)
    models = requests.get(lurl + "/v1/models", timeout=10).json()["data"]
    base = models[0]
    assert base["id"] == "e2e-falcon7b-fullvocab" and "parent" not in base
    by_id = {m["id"]: m for m in models[1:]}
    for name in ("pre", "named-e1", os.path.realpath(ADAPTER)):
        assert by_id[name]["object"] == "model"
        assert by_id[name]["parent"] == base["id"]
        assert by_id[name]["owned_by"]
    info = requests.get(lurl + "/info", timeout=10).json()
    assert info["max_loaded_adapters"] == 8
    loaded = {a["name"]: a for a in info["adapters"]}
    assert loaded["pre"]["rank"] == 8 and loaded["pre"]["bytes"] > 0
    assert all("folder" not in a for a in info["adapters"])  # no server path reaches a client
    # Broken ones never count as loaded.
    assert not any("dora" in a["name"] or "corrupt" in a["name"] for a in info["adapters"])


def test_metrics_by_adapter(lora_server, lurl):
    before = lora_server.metrics()
    key = 'kestrel_adapter_requests_total{adapter="named-e1"}'
    tokens = 'kestrel_adapter_generated_tokens_total{adapter="named-e1"}'
    base_key = 'kestrel_adapter_requests_total{adapter=""}'
    assert greedy_text(lurl, PROMPTS[0], adapter_id="named-e1") == LORA["greedy_text"][0]
    assert greedy_text(lurl, PROMPTS[0]) == BASE["greedy_text"][0]
    after = lora_server.metrics()
    assert after[key] == before.get(key, 0) + 1
    assert after[tokens] == before.get(tokens, 0) + N
    assert after[base_key] == before[base_key] + 1
    assert after['lorax_request_failure{err="adapter"}'] > 0  # the broken ones above
    assert "lorax_request_success" in after and "lorax_request_count" in after


def in_flight(server):
    return server.metrics()["lorax_request_in_flight"]


def test_client_leaves_while_adapter_loads(lora_server, lurl, layout):
    """Clients that disconnect right after asking for a not yet loaded adapter: nothing crashes,
    the concurrency gate is given back, and the adapter still serves later requests."""
    u = urlparse(lurl)
    for i in range(3):
        body = json.dumps({"inputs": PROMPTS[0], "parameters": {
            "max_new_tokens": N, "adapter_id": str(layout / f"fresh{i}")}}).encode()
        for _ in range(4):
            s = socket.create_connection((u.hostname, u.port), timeout=10)
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            s.close()
    deadline = time.time() + 60
    while time.time() < deadline and in_flight(lora_server) != 0:
        time.sleep(0.1)
    assert in_flight(lora_server) == 0
    assert lora_server.alive()
    for i in range(3):
        assert greedy_text(lurl, PROMPTS[0],
                           adapter_id=str(layout / f"fresh{i}")) == LORA["greedy_text"][0]


def test_concurrent_mixed_adapters(lora_server, lurl, layout):
    """Base and adapter requests at once (one batch in the engine): each gets its own text."""
    jobs = []
    for k in range(3):
        for i, prompt in enumerate(PROMPTS):
            jobs.append((prompt, None, BASE["greedy_text"][i]))
            jobs.append((prompt, str(layout / "fresh3") if k == 0 else "pre",
                         LORA["greedy_text"][i]))
    results = [None] * len(jobs)

    def run(j):
        prompt, adapter, _ = jobs[j]
        params = {"adapter_id": adapter} if adapter else {}
        results[j] = generate(lurl, prompt, **params)

    threads = [threading.Thread(target=run, args=(j,)) for j in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for (prompt, adapter, text), r in zip(jobs, results):
        assert r is not None and r.status_code == 200, (adapter, r and r.text)
        assert r.json()["generated_text"] == text, (prompt, adapter)
    assert in_flight(lora_server) == 0


def test_openai_base_names_with_model_id():
    """With --model-id, both that id and the model folder's name mean the base model."""
    s = Server("--model-id", "my-falcon", "--max-input-length", 64, "--max-total-tokens", 96)
    try:
        for model in ("my-falcon", "e2e-falcon7b-fullvocab", ""):
            r = requests.post(s.url + "/v1/completions", json={
                "model": model, "prompt": PROMPTS[0], "max_tokens": N, "temperature": 0},
                timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == BASE["greedy_text"][0]
            assert r.json()["model"] == "my-falcon"
        # Anything else names an adapter; a folder path only where the server allows paths.
        r = requests.post(s.url + "/v1/completions", json={
            "model": str(ADAPTER), "prompt": PROMPTS[0], "max_tokens": N, "temperature": 0},
            timeout=120)
        assert r.status_code == 422, r.text
        assert "absolute paths are not accepted" in r.json()["error"]
    finally:
        assert s.stop() == 0, s.stderr()


def release_fifo(fifo, content):
    """Writes `content` into the FIFO once its reader (the loader) has opened it."""
    deadline = time.time() + 60
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:  # ENXIO: no reader yet
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    os.set_blocking(fd, True)
    os.write(fd, content)
    os.close(fd)


def test_slow_load_blocks_nobody(lora_server, lurl, layout):
    """While one adapter's load hangs (its config a FIFO nobody writes yet), base requests run and
    answer, the waiting requests hold their slots (a second one joins the same load), a client
    that hangs up gives its slot back at once, and when the load ends both waiters get the
    fixture's text."""
    slow = str(layout / "slow")
    results = {}

    def ask(key, prompt):
        results[key] = generate(lurl, prompt, timeout=300, adapter_id=slow)

    waiters = [threading.Thread(target=ask, args=(k, PROMPTS[k])) for k in (0, 1)]
    try:
        for t in waiters:
            t.start()
        deadline = time.time() + 30
        while time.time() < deadline and in_flight(lora_server) < 2:
            time.sleep(0.05)
        assert in_flight(lora_server) == 2
        # The engine and the other connections go on meanwhile.
        for prompt, text in zip(PROMPTS, BASE["greedy_text"]):
            assert greedy_text(lurl, prompt) == text
        assert requests.get(lurl + "/health", timeout=10).status_code == 200
        assert in_flight(lora_server) == 2 and not results
        # A third client for the same adapter hangs up while the load is still blocked.
        u = urlparse(lurl)
        body = json.dumps({"inputs": PROMPTS[2], "parameters": {"adapter_id": slow}}).encode()
        sock = socket.create_connection((u.hostname, u.port), timeout=10)
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.time() + 30
        while time.time() < deadline and in_flight(lora_server) < 3:
            time.sleep(0.05)
        assert in_flight(lora_server) == 3
        sock.close()
        deadline = time.time() + 30
        while time.time() < deadline and in_flight(lora_server) != 2:
            time.sleep(0.05)
        assert in_flight(lora_server) == 2
        assert not results
    finally:
        release_fifo(layout / "slow" / "adapter_config.json",
                     (layout / "slow-config.json").read_bytes())
        for t in waiters:
            t.join(timeout=300)
    for k in (0, 1):
        assert results[k].status_code == 200, results[k].text
        assert results[k].json()["generated_text"] == LORA["greedy_text"][k]
    deadline = time.time() + 30
    while time.time() < deadline and in_flight(lora_server) != 0:
        time.sleep(0.05)
    assert in_flight(lora_server) == 0
    assert lora_server.alive()
