"""Hostile requests against a real `kestrel serve`: every one is answered with a 4xx (or a 503 while
shutting down) whose message names the field, the server stays healthy after each, no KV block is
held at the end, and no file outside the folders the operator allowed is opened (the confined
server runs under strace where strace works).

What is attacked: nesting deep enough to overflow a recursive copy, numbers beyond double, adapter
ids that try to leave --adapters-dir or the hub cache (absolute paths, '..', symlinks, files
symlinked out, FIFOs, names in the working folder), error messages that could leak paths or file
contents, metric series grown by id spellings, a hanging adapter load, requests cut by shutdown,
the API key, Content-Type, Host (DNS rebinding) and CORS.
"""
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from conftest import MODEL, ROOT, Server

ADAPTER = ROOT / "tests" / "data" / "lora-e2e-falcon7b-fullvocab" / "adapters" / "e1-r8-all"
SECRET = "secret-for-nobody-7f3a"
DEPTH = 300_000  # a body of a few hundred KB, like the one that killed the server


def strace_works():
    if not shutil.which("strace"):
        return False
    r = subprocess.run(["strace", "-f", "-e", "trace=openat", "-o", "/dev/null", "true"],
                       capture_output=True, timeout=30)
    return r.returncode == 0


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """The allowed folders (adir, hub) and what lies outside them."""
    tmp = tmp_path_factory.mktemp("hostile")
    adir, hub, outside, cwd = tmp / "adir", tmp / "hub", tmp / "outside", tmp / "cwd"
    for d in (adir, hub, outside, cwd):
        d.mkdir()
    shutil.copytree(ADAPTER, adir / "named")
    os.symlink(adir / "named", adir / "alias")  # a second spelling inside the folder
    shutil.copytree(ADAPTER, outside / "ad")
    (outside / "secret.txt").write_text(SECRET)
    os.symlink(outside / "ad", adir / "escape")  # a symlink leaving the folder
    shutil.copytree(ADAPTER, adir / "leaky")  # its weights symlinked to a file outside
    (adir / "leaky" / "adapter_model.safetensors").unlink()
    os.symlink(outside / "secret.txt", adir / "leaky" / "adapter_model.safetensors")
    shutil.copytree(ADAPTER, adir / "fifo")  # its config a FIFO nobody writes
    (adir / "fifo" / "adapter_config.json").unlink()
    os.mkfifo(adir / "fifo" / "adapter_config.json")
    shutil.copytree(ADAPTER, cwd / "cwd-adapter")  # only in the server's working folder
    snap = hub / "models--org--escape" / "snapshots"
    snap.mkdir(parents=True)
    os.symlink(outside / "ad", snap / "s1")  # a hub snapshot leaving the cache
    shutil.copytree(ADAPTER, hub / "models--org--ok" / "snapshots" / "r1")
    return tmp


@pytest.fixture(scope="module")
def hserver(layout):
    """The confined server: --adapters-dir and the hub cache only, run from `cwd`."""
    env = {**os.environ, "HF_HUB_CACHE": str(layout / "hub")}
    trace = layout / "strace.txt"
    prefix = ("strace", "-f", "-e", "trace=open,openat,openat2", "-o", str(trace)) \
        if strace_works() else ()
    s = Server("--max-input-length", 256, "--max-total-tokens", 512, "--adapters-dir",
               layout / "adir", "--adapter-load-timeout", 5, env=env, prefix=prefix,
               cwd=layout / "cwd")
    s.trace = trace if prefix else None
    yield s
    if prefix:  # SIGTERM goes to kestrel itself, not to strace
        kids = Path(f"/proc/{s.proc.pid}/task/{s.proc.pid}/children").read_text().split()
        os.kill(int(kids[0]), signal.SIGTERM)
        s.proc.wait(timeout=60)
    assert s.stop() == 0, s.stderr()


@pytest.fixture(scope="module")
def hurl(hserver):
    return hserver.url


def post(url, path, body, headers=None, timeout=60):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(url + path, data=data, timeout=timeout,
                         headers={"Content-Type": "application/json", **(headers or {})})


def assert_refused(server, r, status, *needles, sent=""):
    """A 4xx naming what was wrong, leaking nothing, with the server healthy after it."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "error_type"}, body
    for n in needles:
        assert n in body["error"], (n, body)
    text = r.text
    assert SECRET not in text
    tmp = str(Path(server.args[server.args.index("--adapters-dir") + 1]).parent) \
        if "--adapters-dir" in server.args else None
    if tmp and tmp not in sent:  # a path comes back only when the client sent it
        assert tmp not in text, text
    assert "pid" not in body["error"].lower()
    assert server.alive(), server.stderr()
    assert requests.get(server.url + "/health", timeout=10).status_code == 200


def nest(depth, open_="[", close="]"):
    return open_ * depth + "0" + close * depth


# --- request JSON ----------------------------------------------------------------------------

DEEP_BODIES = [
    ("/generate", lambda d: '{"inputs": ' + nest(d) + "}", "`inputs"),
    ("/generate", lambda d: '{"inputs": "x", "parameters": {"stop": ' + nest(d) + "}}",
     "`parameters.stop"),
    ("/generate_stream", lambda d: '{"inputs": "x", "parameters": ' + nest(d, '{"a":', "}") + "}",
     "`parameters"),
    ("/", lambda d: '{"inputs": "x", "parameters": {"adapter_id": ' + nest(d) + "}}",
     "`parameters.adapter_id"),
    ("/v1/completions", lambda d: '{"prompt": ' + nest(d) + "}", "`prompt"),
    ("/v1/chat/completions",
     lambda d: '{"messages": [{"role": "user", "content": ' + nest(d) + "}]}",
     "`messages[0].content"),
    ("/v1/chat/completions", lambda d: '{"messages": [], "response_format": ' + nest(d) + "}",
     "`response_format"),
    ("/tokenize", lambda d: '{"inputs": ' + nest(d, '{"x":', "}") + "}", "`inputs"),
]


@pytest.mark.parametrize("path,make,where", DEEP_BODIES)
def test_deep_nesting_is_422_on_every_route(hserver, hurl, path, make, where):
    r = post(hurl, path, make(DEPTH))
    assert_refused(hserver, r, 422, where, "nests deeper than 64")
    # Just under the bound parses (and fails, if at all, on what the field means).
    r = post(hurl, path, make(40))
    assert r.status_code in (200, 422), r.text
    assert "nests deeper" not in r.text


def test_deep_nesting_unclosed_and_in_keys(hserver, hurl):
    assert_refused(hserver, post(hurl, "/generate", '{"inputs": ' + "[" * DEPTH), 422, "`inputs")
    assert_refused(hserver, post(hurl, "/generate", "[" * DEPTH), 422, "nests deeper")


@pytest.mark.parametrize("body,where", [
    ({"inputs": "x", "parameters": {"temperature": "1e400"}}, "parameters.temperature"),
    ({"inputs": "x", "parameters": {"max_new_tokens": "-1e400"}}, "parameters.max_new_tokens"),
    ({"prompt": "x", "max_tokens": "1e999"}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": "1e400"}, "top_p"),
    ({"inputs": "x", "junk": ["1e400"]}, "junk[0]"),
])
def test_number_beyond_double_is_422(hserver, hurl, body, where):
    # The number goes in unquoted: json.dumps would write a float, not the literal.
    text = json.dumps(body).replace('"1e400"', "1e400").replace('"-1e400"', "-1e400") \
        .replace('"1e999"', "1e999")
    path = "/generate" if "inputs" in body else \
        "/v1/chat/completions" if "messages" in body else "/v1/completions"
    assert_refused(hserver, post(hurl, path, text), 422, where, "out of range")


def test_wrong_types_and_huge_ints_are_422(hserver, hurl):
    for params in ({"seed": 2 ** 70}, {"max_new_tokens": 1e300}, {"top_k": "3"},
                   {"stop": [1]}, {"adapter_id": {"a": 1}}, {"temperature": True}):
        r = post(hurl, "/generate", {"inputs": "x", "parameters": params})
        assert_refused(hserver, r, 422, next(iter(params)))


# --- adapters --------------------------------------------------------------------------------

def gen(url, adapter_id, source=None, max_new_tokens=2):
    params = {"max_new_tokens": max_new_tokens, "adapter_id": adapter_id}
    if source:
        params["adapter_source"] = source
    return post(url, "/generate", {"inputs": "The falcon", "parameters": params}, timeout=120)


def test_adapter_ids_stay_inside_their_folders(hserver, hurl, layout):
    outside = str(layout / "outside" / "ad")
    cases = [
        (outside, None, 422, "absolute paths are not accepted"),
        (str(layout / "adir" / "named"), None, 422, "absolute paths are not accepted"),
        ("/etc", None, 422, "absolute paths"),
        ("../outside/ad", None, 422, "without '..'"),
        ("named/../../outside/ad", None, 422, "without '..'"),
        ("./named", None, 422, "without '..', '.'"),
        ("escape", None, 422, "outside the adapters folder"),
        ("cwd-adapter", None, 404, "not found in the adapters folder"),
        ("org/../../outside", "hub", 422, "not a Hugging Face repository id"),
        ("/tmp", "hub", 422, "not a Hugging Face repository id"),
        ("org/escape", "hub", 422, "outside the Hugging Face cache"),
        ("org/absent", "hub", 404, "never downloads"),
        ("x" * 5000, None, 422, "longer than 256 bytes"),
        ("a\u0001b", None, 422, "control character"),
    ]
    for adapter_id, source, status, needle in cases:
        r = gen(hurl, adapter_id, source)
        assert_refused(hserver, r, status, "adapter_id", needle, sent=adapter_id)
    # OpenAI's model field follows the same rules.
    for model, status in ((outside, 422), ("../outside/ad", 422), ("cwd-adapter", 404),
                          ("escape", 422)):
        r = post(hurl, "/v1/completions", {"model": model, "prompt": "x", "max_tokens": 2})
        assert_refused(hserver, r, status, "model", sent=model)
    # What the rules allow works.
    assert gen(hurl, "named").status_code == 200
    assert gen(hurl, "org/ok", "hub").status_code == 200


def test_adapter_files_leaving_or_blocking_are_refused(hserver, hurl):
    r = gen(hurl, "leaky")
    assert_refused(hserver, r, 422, "adapter 'leaky' could not be loaded")
    t0 = time.time()
    r = gen(hurl, "fifo")
    assert_refused(hserver, r, 422, "adapter 'fifo' could not be loaded")
    assert time.time() - t0 < 4, "a FIFO must be refused, not read until the load times out"
    deadline = time.time() + 10  # the reasons, for the operator (stderr is read by a thread)
    while time.time() < deadline and not ("not a regular file" in hserver.stderr() and
                                          "outside" in hserver.stderr()):
        time.sleep(0.05)
    assert "not a regular file" in hserver.stderr() and "outside" in hserver.stderr()


def test_adapter_metrics_are_bounded_and_canonical(hserver, hurl):
    def size():
        return len(requests.get(hurl + "/metrics", timeout=10).text)

    before = size()
    for i in range(400):  # ids that load nothing add no series
        assert gen(hurl, f"nope-{i}").status_code == 404
        assert gen(hurl, f"../x{i}").status_code == 422
    assert size() - before < 200, "failed ids must not add metric series"
    # Two spellings of one adapter are one series, under its canonical name.
    for adapter_id in ("named", "alias", "alias"):
        assert gen(hurl, adapter_id).status_code == 200
    text = requests.get(hurl + "/metrics", timeout=10).text
    series = [l for l in text.splitlines() if l.startswith("kestrel_adapter_requests_total{")]
    assert any('adapter="named"' in l for l in series), series
    assert not any('adapter="alias"' in l for l in series), series


def test_hanging_load_times_out_while_others_load(layout):
    """An operator-allowed folder whose config is a FIFO nobody writes: its request fails with 503
    after --adapter-load-timeout, while another adapter loads and answers meanwhile."""
    hang = layout / "hang"
    shutil.copytree(ADAPTER, hang)
    (hang / "adapter_config.json").unlink()
    os.mkfifo(hang / "adapter_config.json")
    s = Server("--adapters-dir", layout / "adir", "--allow-adapter-paths",
               "--adapter-load-timeout", 2)
    try:
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("r", gen(s.url, str(hang))))
        t.start()
        time.sleep(0.3)
        ok = gen(s.url, "named")
        assert ok.status_code == 200, ok.text
        assert "r" not in result  # answered while the other load still hangs, not behind it
        t.join(timeout=60)
        r = result["r"]
        assert r.status_code == 503, r.text
        assert r.json()["error_type"] == "unavailable" and "did not load within 2 s" in r.text
        assert s.alive()
        assert gen(s.url, "named").status_code == 200
    finally:
        fd = os.open(hang / "adapter_config.json", os.O_RDWR | os.O_NONBLOCK)  # frees the reader
        os.write(fd, b"{}")
        os.close(fd)
        assert s.stop() == 0, s.stderr()


# --- shutdown --------------------------------------------------------------------------------

def test_requests_cut_by_shutdown_are_503():
    s = Server("--drain-timeout", 0.5, "--max-total-tokens", 2048, "--max-input-length", 64)
    results = {}
    long = {"inputs": "The falcon", "parameters": {"max_new_tokens": 1900,
                                                    "ignore_eos_token": True}}

    def plain():
        results["plain"] = post(s.url, "/generate", long, timeout=120)

    def stream():
        results["stream"] = post(s.url, "/generate_stream", long, timeout=120)

    threads = [threading.Thread(target=plain), threading.Thread(target=stream)]
    for t in threads:
        t.start()
    deadline = time.time() + 30
    while time.time() < deadline and s.metrics()["lorax_request_in_flight"] < 2:
        time.sleep(0.05)
    s.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=60)
    assert s.proc.wait(timeout=60) == 0
    r = results["plain"]
    assert r.status_code == 503, r.text
    assert r.json()["error_type"] == "unavailable"
    events = [json.loads(l[5:]) for l in results["stream"].text.splitlines()
              if l.startswith("data:")]
    assert events[-1].get("error_type") == "unavailable", events[-1]


# --- headers ---------------------------------------------------------------------------------

def test_api_key_scheme_and_challenge():
    s = Server("--api-key", "s3cret-key")
    try:
        r = requests.get(s.url + "/info", timeout=10)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
        r = requests.get(s.url + "/info", headers={"Authorization": "Bearer wrong"}, timeout=10)
        assert r.status_code == 401 and 'error="invalid_token"' in r.headers["WWW-Authenticate"]
        for auth in ("Bearer s3cret-key", "bearer s3cret-key", "BEARER   s3cret-key"):
            r = requests.get(s.url + "/info", headers={"Authorization": auth}, timeout=10)
            assert r.status_code == 200, auth
        for auth in ("Bearer s3cret-ke", "Bearer s3cret-keyy", "Basic s3cret-key", "s3cret-key"):
            r = requests.get(s.url + "/info", headers={"Authorization": auth}, timeout=10)
            assert r.status_code == 401, auth
        assert requests.get(s.url + "/health", timeout=10).status_code == 200
    finally:
        assert s.stop() == 0


def test_post_bodies_must_be_json(hserver, hurl):
    body = json.dumps({"inputs": "x"})
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"):
        r = requests.post(hurl + "/tokenize", data=body, headers={"Content-Type": ctype},
                          timeout=10)
        assert_refused(hserver, r, 415, "Content-Type")
    for ctype in ("application/json", "Application/JSON; charset=utf-8"):
        r = requests.post(hurl + "/tokenize", data=body, headers={"Content-Type": ctype},
                          timeout=10)
        assert r.status_code == 200, (ctype, r.text)
    assert requests.post(hurl + "/tokenize", data=body, timeout=10).status_code == 200


def test_host_header_guards_against_dns_rebinding(hserver, hurl):
    port = hurl.rsplit(":", 1)[1]
    for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.attacker.example"):
        r = requests.get(hurl + "/info", headers={"Host": host}, timeout=10)
        assert_refused(hserver, r, 403, "Host")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "LOCALHOST"):
        assert requests.get(hurl + "/info", headers={"Host": host}, timeout=10).status_code == 200
    s = Server("--allowed-hosts", "kestrel.internal,127.0.0.1")
    try:
        r = requests.get(s.url + "/info", headers={"Host": "kestrel.internal:80"}, timeout=10)
        assert r.status_code == 200
        r = requests.get(s.url + "/info", headers={"Host": "localhost"}, timeout=10)
        assert r.status_code == 403
    finally:
        assert s.stop() == 0


def preflight(url, origin, path="/generate"):
    return requests.options(url + path, timeout=10, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})


def test_cors_default_none(hserver, hurl):
    r = preflight(hurl, "https://evil.example")
    assert_refused(hserver, r, 403, "Origin")
    assert "Access-Control-Allow-Origin" not in r.headers
    r = requests.get(hurl + "/info", headers={"Origin": "https://evil.example"}, timeout=10)
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers


def test_cors_allowed_origin():
    s = Server("--cors-allow-origin", "https://app.example")
    try:
        r = preflight(s.url, "https://app.example")
        assert r.status_code == 204, r.text
        assert r.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert "POST" in r.headers["Access-Control-Allow-Methods"]
        assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
        assert preflight(s.url, "https://other.example").status_code == 403
        origin = {"Origin": "https://app.example"}
        body = {"inputs": "x", "parameters": {"max_new_tokens": 2}}
        for path in ("/generate", "/generate_stream"):
            r = post(s.url, path, body, headers=origin)
            assert r.status_code == 200, r.text
            assert r.headers["Access-Control-Allow-Origin"] == "https://app.example"
        r = post(s.url, "/generate", body, headers={"Origin": "https://other.example"})
        assert "Access-Control-Allow-Origin" not in r.headers
    finally:
        assert s.stop() == 0


# --- after all of it -------------------------------------------------------------------------

def test_healthy_and_no_block_held_after(hserver, hurl):
    deadline = time.time() + 30
    while time.time() < deadline and (hserver.metrics()["lorax_request_in_flight"] != 0 or
                                      hserver.metrics()["kestrel_kv_blocks_used"] != 0):
        time.sleep(0.1)
    m = hserver.metrics()
    assert m["lorax_request_in_flight"] == 0
    assert m["kestrel_kv_blocks_used"] == 0
    assert m.get('lorax_request_failure{err="internal"}', 0) == 0
    assert hserver.alive()


def test_no_file_outside_the_allowed_folders_was_opened(hserver, layout):
    if hserver.trace is None:
        pytest.skip("strace cannot trace here")
    opened = set()
    for line in hserver.trace.read_text().splitlines():
        if "open" not in line or '"' not in line:
            continue
        path = line.split('"', 2)[1]
        opened.add(os.path.normpath(path if path.startswith("/") else
                                    os.path.join(layout / "cwd", path)))
    assert any(p.startswith(str(layout / "adir" / "named")) for p in opened), "trace is empty?"
    forbidden = [layout / "outside", layout / "cwd" / "cwd-adapter", Path("/etc/passwd"),
                 layout / "adir" / "fifo" / "adapter_config.json",
                 layout / "adir" / "leaky" / "adapter_model.safetensors"]
    for p in opened:
        for f in forbidden:
            assert not (p == str(f) or p.startswith(str(f) + "/")), f"opened {p}"
