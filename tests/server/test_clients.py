"""The real clients from PyPI against `kestrel serve`: lorax-client,
text-generation and openai, streamed and not; greedy output equals
`kestrel generate --greedy` for the same prompt."""
import pytest
import requests

from conftest import kestrel_generate

PROMPT = "The falcon is a bird of prey that"
MODEL_ID = "e2e-falcon7b-fullvocab"  # the served model's id: OpenAI's `model` for the base model
N = 12


@pytest.fixture(scope="module")
def reference():
    return kestrel_generate(PROMPT, N)


def test_generate_route_matches_cli(url, reference):
    ids, text = reference
    r = requests.post(url + "/generate", json={"inputs": PROMPT, "parameters": {
        "max_new_tokens": N, "details": True}}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [t["id"] for t in body["details"]["tokens"]] == ids
    assert body["generated_text"] == text
    assert body["details"]["generated_tokens"] == len(ids)
    assert body["details"]["finish_reason"] in ("length", "eos_token")


def test_temperature_zero_is_greedy(url, reference):
    ids, text = reference
    r = requests.post(url + "/generate", json={"inputs": PROMPT, "parameters": {
        "max_new_tokens": N, "temperature": 0, "do_sample": True}}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["generated_text"] == text


def test_lorax_client(url, reference):
    from lorax import Client

    ids, text = reference
    client = Client(url, timeout=60)
    resp = client.generate(PROMPT, max_new_tokens=N, details=True)
    assert resp.generated_text == text
    assert [t.id for t in resp.details.tokens] == ids
    assert resp.details.prompt_tokens > 0
    streamed = list(client.generate_stream(PROMPT, max_new_tokens=N))
    assert [s.token.id for s in streamed] == ids
    assert "".join(s.token.text for s in streamed) == text
    assert streamed[-1].generated_text == text
    assert streamed[-1].details.generated_tokens == len(ids)
    assert all(s.generated_text is None for s in streamed[:-1])


def test_lorax_client_sampling_and_alternatives(url):
    from lorax import Client

    client = Client(url, timeout=60)
    a = client.generate(PROMPT, max_new_tokens=8, do_sample=True, temperature=0.8, top_k=20,
                        top_p=0.9, seed=7, details=True, return_k_alternatives=2)
    b = client.generate(PROMPT, max_new_tokens=8, do_sample=True, temperature=0.8, top_k=20,
                        top_p=0.9, seed=7, details=True)
    assert a.generated_text == b.generated_text  # seeded: reproducible
    assert a.details.seed == 7
    assert all(len(t.alternative_tokens) == 2 for t in a.details.tokens)


def test_decoder_input_details(url):
    """`prefill`: every prompt token with its logprob under the model (the first has none)."""
    r = requests.post(url + "/generate", json={"inputs": PROMPT, "parameters": {
        "max_new_tokens": 4, "details": True, "decoder_input_details": True}}, timeout=60)
    assert r.status_code == 200, r.text
    details = r.json()["details"]
    prefill = details["prefill"]
    assert len(prefill) == details["prompt_tokens"] > 1
    assert prefill[0]["logprob"] is None
    assert all(isinstance(t["logprob"], float) and t["logprob"] <= 0 for t in prefill[1:])
    assert "".join(t["text"] for t in prefill) == PROMPT


def test_best_of(url):
    """best_of: the best candidate by cumulative logprob, the others in `best_of_sequences`."""
    r = requests.post(url + "/generate", json={"inputs": PROMPT, "parameters": {
        "max_new_tokens": 6, "best_of": 3, "do_sample": True, "details": True}}, timeout=60)
    assert r.status_code == 200, r.text
    details = r.json()["details"]
    others = details["best_of_sequences"]
    assert len(others) == 2
    def total(d):
        return sum(t["logprob"] for t in d["tokens"])
    assert all(total(details) >= total(o) for o in others)
    assert all(o["generated_tokens"] == len(o["tokens"]) > 0 for o in others)
    assert len({details["seed"], *(o["seed"] for o in others)}) == 3


def test_text_generation_client_best_of_and_prefill(url):
    from text_generation import Client

    resp = Client(url, timeout=60).generate(PROMPT, max_new_tokens=4, best_of=2, do_sample=True,
                                            decoder_input_details=True)
    assert len(resp.details.best_of_sequences) == 1
    assert len(resp.details.prefill) > 1
    assert resp.details.prefill[0].logprob is None
    assert all(t.logprob <= 0 for t in resp.details.prefill[1:])


def test_lorax_client_missing_adapter(url):
    """adapter_id is served (tests/server/test_lora.py); one that names no folder is a 404 that
    lorax-client raises as NotFoundError, naming the adapter."""
    from lorax import Client
    from lorax.errors import NotFoundError

    with pytest.raises(NotFoundError, match="some/adapter"):
        Client(url, timeout=60).generate(PROMPT, adapter_id="some/adapter", max_new_tokens=2)


def test_openai_unknown_model_is_404(url):
    import openai

    with pytest.raises(openai.NotFoundError) as e:
        openai_client(url).completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2)
    assert "no-such-model" in e.value.response.json()["error"]


def test_text_generation_client(url, reference):
    from text_generation import Client

    ids, text = reference
    client = Client(url, timeout=60)
    resp = client.generate(PROMPT, max_new_tokens=N)
    assert resp.generated_text == text
    assert [t.id for t in resp.details.tokens] == ids
    streamed = list(client.generate_stream(PROMPT, max_new_tokens=N))
    assert [s.token.id for s in streamed] == ids
    assert streamed[-1].generated_text == text
    full = client.generate(PROMPT, max_new_tokens=N, return_full_text=True)
    assert full.generated_text == PROMPT + text


def test_text_generation_client_stop_sequence(url, reference):
    from text_generation import Client

    _, text = reference
    stop = text[len(text) // 2: len(text) // 2 + 3]
    if not stop.strip():
        pytest.skip("reference text has no usable stop sequence")
    resp = Client(url, timeout=60).generate(PROMPT, max_new_tokens=N, stop_sequences=[stop])
    assert stop not in resp.generated_text
    assert text.startswith(resp.generated_text)
    assert resp.details.finish_reason.value == "stop_sequence"


def openai_client(url):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="unused", timeout=60, max_retries=0)


def test_openai_completions(url, reference):
    ids, text = reference
    client = openai_client(url)
    c = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=N, temperature=0)
    assert c.choices[0].text == text
    assert c.usage.completion_tokens == len(ids)
    assert c.usage.total_tokens == c.usage.prompt_tokens + len(ids)
    chunks = list(client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=N,
                                            temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == text
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_openai_completions_logprobs(url, reference):
    ids, _ = reference
    c = openai_client(url).completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=N,
                                              temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ids)
    assert all(v <= 0 for v in lp.token_logprobs)
    assert all(len(top) == 2 for top in lp.top_logprobs)


def test_openai_chat(url):
    client = openai_client(url)
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name a falcon."}]
    c = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=10,
                                       temperature=0, logprobs=True, top_logprobs=2)
    choice = c.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert c.usage.completion_tokens == len(choice.logprobs.content)
    # The Falcon convention renders the same prompt /generate gets.
    prompt = "System: You are terse.\nUser: Name a falcon.\nAssistant:"
    r = requests.post(url + "/generate", json={"inputs": prompt, "parameters": {"max_new_tokens": 10}},
                      timeout=60)
    assert r.json()["generated_text"] == choice.message.content
    stream = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=10,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content == choice.message.content
    assert chunks[-1].usage.completion_tokens == c.usage.completion_tokens


def test_openai_models(url):
    models = openai_client(url).models.list()
    assert [m.id for m in models.data] == ["e2e-falcon7b-fullvocab"]


def test_root_route_by_stream(url, reference):
    _, text = reference
    r = requests.post(url + "/", json={"inputs": PROMPT, "parameters": {"max_new_tokens": N}}, timeout=60)
    assert r.status_code == 200 and r.json()[0]["generated_text"] == text
    r = requests.post(url + "/", json={"inputs": PROMPT, "stream": True,
                                       "parameters": {"max_new_tokens": N}}, timeout=60, stream=True)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [line for line in r.iter_lines() if line.startswith(b"data:")]
    assert len(events) >= 1


def test_raw_sse_shape(url, reference):
    import json

    ids, text = reference
    r = requests.post(url + "/generate_stream", json={"inputs": PROMPT, "parameters": {"max_new_tokens": N}},
                      timeout=60, stream=True)
    events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith(b"data:")]
    assert [e["token"]["id"] for e in events] == ids
    for e in events[:-1]:
        assert set(e["token"]) >= {"id", "text", "logprob", "special"}
        assert e["generated_text"] is None and e["details"] is None
    assert events[-1]["generated_text"] == text
    assert set(events[-1]["details"]) >= {"finish_reason", "generated_tokens", "seed"}


def test_prefix_cache_counts_and_keeps_output(server, url):
    """A repeated long prompt is served from the prefix cache, with the same text."""
    prompt = "The falcon hunts over the open fields at dawn, " * 6
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 6, "details": True}}
    before = server.metrics().get("kestrel_prefix_cache_hit_tokens_total", 0)
    a = requests.post(url + "/generate", json=body, timeout=60).json()
    b = requests.post(url + "/generate", json=body, timeout=60).json()
    assert a["generated_text"] == b["generated_text"]
    after = server.metrics()
    assert after["kestrel_prefix_cache_hit_tokens_total"] - before >= 16
    assert after["kestrel_prefix_cache_hits_total"] >= 1
