"""Bad requests get their 4xx with a JSON body naming the field, never a 5xx,
and the server stays healthy."""
import json
import socket
from urllib.parse import urlparse

import pytest
import requests


def post(url, path, body, **kw):
    return requests.post(url + path, json=body, timeout=60, **kw)


def assert_validation(r, field):
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error_type"] == "validation"
    assert field in body["error"], body


@pytest.mark.parametrize("params,field", [
    ({"temperature": -0.5}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"typical_p": 3}, "typical_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"frequency_penalty": 9}, "frequency_penalty"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 10**9}, "max_new_tokens"),
    ({"max_new_tokens": 512}, "max_new_tokens"),  # prompt + 512 > max_total_tokens 512
    ({"max_new_tokens": "ten"}, "max_new_tokens"),
    ({"seed": -1}, "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"truncate": 0}, "truncate"),
    ({"best_of": 2}, "best_of"),
    ({"return_k_alternatives": 100}, "return_k_alternatives"),
    ({"adapter_id": 7}, "adapter_id"),
    ({"adapter_id": "a", "adapter_source": "s3"}, "adapter_source"),
    ({"merged_adapters": {"ids": ["a", "b"], "merge_strategy": "svd"}}, "merged_adapters.merge_strategy"),
    ({"merged_adapters": {"ids": ["a"], "density": 2}}, "merged_adapters.density"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_object", "schema": {"uniqueItems": True}}}, "uniqueItems"),
    ({"grammar": {"type": "regex", "value": "(unclosed"}}, "grammar"),
    ({"watermark": True}, "watermark"),
])
def test_bad_parameters(url, params, field):
    assert_validation(post(url, "/generate", {"inputs": "Hello", "parameters": params}), field)


def test_not_supported_yet_message(url):
    for params in ({"watermark": True},):
        r = post(url, "/generate", {"inputs": "Hello", "parameters": params})
        assert "not supported yet" in r.json()["error"]


def test_missing_and_wrong_inputs(url):
    assert_validation(post(url, "/generate", {"parameters": {}}), "inputs")
    assert_validation(post(url, "/generate", {"inputs": 42}), "inputs")
    assert_validation(post(url, "/generate", {"inputs": ""}), "inputs")
    assert_validation(post(url, "/generate", {"inputs": "x", "parameters": []}), "parameters")


def test_prompt_over_max_input_length(url):
    r = post(url, "/generate", {"inputs": "falcon " * 400, "parameters": {"max_new_tokens": 2}})
    assert_validation(r, "inputs")
    assert "256" in r.json()["error"]
    # truncate keeps the last tokens and makes it fit
    r = post(url, "/generate", {"inputs": "falcon " * 400, "parameters": {"max_new_tokens": 2, "truncate": 100}})
    assert r.status_code == 200, r.text


def test_stream_best_of(url):
    assert_validation(post(url, "/generate_stream", {"inputs": "x", "parameters": {
        "best_of": 2, "do_sample": True}}), "best_of")


def test_malformed_json_is_400(url):
    for body in [b'{"inputs": "Hello"', b"{inputs: 1}", b"", b"[1, 2]", b"null"]:
        r = requests.post(url + "/generate", data=body, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 400, (body, r.text)
        assert "error" in r.json()


def test_invalid_utf8_is_422(url):
    for body in [b'{"inputs": "caf\xc3"}', b'{"inputs": "\xff\xfe"}', b'{"inputs": "\\udc00"}']:
        r = requests.post(url + "/generate", data=body, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["error_type"] == "validation"


def test_body_over_limit_is_413(url):
    big = b'{"inputs": "' + b"a" * (10 << 20) + b'"}'
    r = requests.post(url + "/generate", data=big, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413
    assert "limit" in r.json()["error"]


def test_unknown_route_404_and_wrong_method_405(url):
    r = requests.get(url + "/nope", timeout=10)
    assert r.status_code == 404 and r.json()["error_type"] == "not_found"
    r = requests.post(url + "/v1/nope", json={}, timeout=10)
    assert r.status_code == 404
    r = requests.get(url + "/generate", timeout=10)
    assert r.status_code == 405 and "POST" in r.headers["allow"]


def test_openai_errors(url):
    assert_validation(post(url, "/v1/completions", {"model": "m"}), "prompt")
    r = post(url, "/v1/completions", {"model": "m", "prompt": "x"})  # m: no such adapter
    assert r.status_code == 404 and r.json()["error_type"] == "not_found" and "m" in r.json()["error"]
    assert_validation(post(url, "/v1/completions", {"prompt": "x", "temperature": -1}), "temperature")
    assert_validation(post(url, "/v1/completions", {"prompt": "x", "n": 3}), "n")
    assert_validation(post(url, "/v1/completions", {"prompt": "x", "max_tokens": 10**9}), "max_tokens")
    assert_validation(post(url, "/v1/chat/completions", {"messages": []}), "messages")
    assert_validation(post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                         "top_p": 2}), "top_p")


def test_openai_client_raises_on_422(url):
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)
    with pytest.raises(openai.UnprocessableEntityError):
        client.completions.create(model="m", prompt="x", temperature=-1)


def raw_exchange(url, data, read_timeout=10):
    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=read_timeout) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
    return b"".join(chunks)


def test_truncated_body_and_garbage(url):
    # Content-Length promises more than arrives, then the client half-closes.
    resp = raw_exchange(url, b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 100\r\n\r\n{\"inputs\": \"hel")
    assert b" 500 " not in resp.split(b"\r\n", 1)[0]
    resp = raw_exchange(url, b"THIS IS NOT HTTP\r\n\r\n")
    assert resp.startswith(b"HTTP/1.1 400")


def test_pipelined_requests(url):
    req = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    resp = raw_exchange(url, req * 3)
    assert resp.count(b"HTTP/1.1 200") == 3


def test_server_still_healthy(server, url):
    assert server.alive()
    assert requests.get(url + "/health", timeout=10).status_code == 200
    r = post(url, "/generate", {"inputs": "Still alive?", "parameters": {"max_new_tokens": 3}})
    assert r.status_code == 200
    m = server.metrics()
    assert m['lorax_request_failure{err="validation"}'] > 0
