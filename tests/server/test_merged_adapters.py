"""LoRAX's `merged_adapters` over HTTP: lorax-client's MergedAdapters against `kestrel serve
--adapters-dir tests/data/merge-falcon7b/adapters`, the merge held once under its "merge:" name,
the 422s (unequal ranks, bad density, unknown strategy, with adapter_id) and a server that stays
healthy. The merge math against peft is tests/lora (merge_test, merged_store_test).

The base is conftest's e2e-falcon7b-fullvocab (it has a tokenizer; falcon7b-mqa-parallel, the
base the merge fixture was made on, has none): the same layer shapes, so the fixture's adapters
load on it.
"""
import pytest
import requests

from conftest import ROOT, server_fixture

ADAPTERS = ROOT / "tests" / "data" / "merge-falcon7b" / "adapters"
PROMPT = "The falcon is a bird of prey that"
N = 8


merge_server = server_fixture("--adapters-dir", ADAPTERS, "--max-input-length", 256,
                              "--max-total-tokens", 512)


@pytest.fixture(scope="module")
def murl(merge_server):
    return merge_server.url


def generate(url, **params):
    params.setdefault("max_new_tokens", N)
    return requests.post(url + "/generate", json={"inputs": PROMPT, "parameters": params},
                         timeout=120)


def merges_loaded(url):
    info = requests.get(url + "/info", timeout=10).json()
    return [a for a in info["adapters"] if a["name"].startswith("merge:")]


def assert_422(r, *needles):
    assert r.status_code == 422, r.text
    for n in needles:
        assert n in r.json()["error"], (n, r.json())


def test_lorax_client_merged_request(murl):
    from lorax import Client
    from lorax.types import MergedAdapters

    client = Client(murl, timeout=120)
    # One adapter at weight 1 is the adapter itself (peft: sqrt(w s) on A and on B, scale 1).
    one = client.generate(PROMPT, max_new_tokens=N, details=True,
                          merged_adapters=MergedAdapters(ids=["m1-r4-all"], weights=[1.0],
                                                         density=1.0))
    plain = client.generate(PROMPT, max_new_tokens=N, details=True, adapter_id="m1-r4-all")
    assert [t.id for t in one.details.tokens] == [t.id for t in plain.details.tokens]
    assert one.generated_text == plain.generated_text

    # Two adapters, every strategy the client knows; each answers and repeats itself.
    for strategy in ("linear", "ties", "dare_linear", "dare_ties"):
        spec = MergedAdapters(ids=["m1-r4-all", "m2-r4-attn-fc1-rslora"], weights=[0.7, 0.5],
                              merge_strategy=strategy, density=0.5,
                              majority_sign_method="total")
        a = client.generate(PROMPT, max_new_tokens=N, details=True, seed=3, merged_adapters=spec)
        b = client.generate(PROMPT, max_new_tokens=N, details=True, seed=3, merged_adapters=spec)
        assert a.details.generated_tokens == N or a.details.finish_reason != "length"
        assert [t.id for t in a.details.tokens] == [t.id for t in b.details.tokens], strategy
        assert [t.logprob for t in a.details.tokens] == [t.logprob for t in b.details.tokens]


def test_same_merge_loads_once(murl):
    spec = {"ids": ["m1-r4-all", "m3-r4-mlp-layer1"], "weights": [0.4, 0.9],
            "merge_strategy": "ties", "density": 0.7}
    before = {a["name"] for a in merges_loaded(murl)}
    for seed in (1, 2):  # ties draws nothing: the seed does not make another merge
        r = generate(murl, merged_adapters=spec, seed=seed)
        assert r.status_code == 200, r.text
    new = [a for a in merges_loaded(murl) if a["name"] not in before]
    assert len(new) == 1, new
    assert new[0]["rank"] == 4
    # DARE below density 1 takes the seed: another seed, another merge.
    spec = dict(spec, merge_strategy="dare_ties")
    for seed in (1, 2, 2):
        assert generate(murl, merged_adapters=spec, seed=seed).status_code == 200
    assert len(merges_loaded(murl)) == len(before) + 3


def test_refusals_are_422(murl, merge_server):
    # Unequal ranks (4 and 2) for a strategy that adds factor by factor.
    assert_422(generate(murl, merged_adapters={"ids": ["m1-r4-all", "m4-r2-qkv"]}),
               "equal ranks", "m4-r2-qkv")
    assert_422(generate(murl, merged_adapters={"ids": ["m1-r4-all", "m4-r2-qkv"],
                                               "merge_strategy": "ties", "density": 0.5}),
               "equal ranks")
    assert_422(generate(murl, merged_adapters={"ids": ["m1-r4-all", "m2-r4-attn-fc1-rslora"],
                                               "merge_strategy": "ties", "density": 1.5}),
               "merged_adapters.density")
    assert_422(generate(murl, merged_adapters={"ids": ["m1-r4-all", "m2-r4-attn-fc1-rslora"],
                                               "merge_strategy": "dare_ties", "density": 0}),
               "merged_adapters.density")
    # One adapter is always linear (as peft): its density is not used.
    assert generate(murl, merged_adapters={"ids": ["m1-r4-all"], "merge_strategy": "dare_ties",
                                           "density": 0}).status_code == 200
    assert_422(generate(murl, merged_adapters={"ids": ["m1-r4-all", "m2-r4-attn-fc1-rslora"],
                                               "merge_strategy": "svd"}),
               "merged_adapters.merge_strategy", "svd")
    assert_422(generate(murl, merged_adapters={"ids": ["m1-r4-all"],
                                               "majority_sign_method": "mean"}),
               "merged_adapters.majority_sign_method")
    assert_422(generate(murl, merged_adapters={"ids": ["m1-r4-all", "m2-r4-attn-fc1-rslora"],
                                               "weights": [1.0]}),
               "merged_adapters.weights")
    assert_422(generate(murl, adapter_id="m1-r4-all", merged_adapters={"ids": ["m1-r4-all"]}),
               "merged_adapters")
    assert_422(generate(murl, merged_adapters={"ids": ["m1-r4-all", "../adapters/m1-r4-all"]}),
               "merged_adapters.ids")
    r = generate(murl, merged_adapters={"ids": ["m1-r4-all", "no-such-adapter"]})
    assert r.status_code == 404, r.text
    assert "no-such-adapter" in r.json()["error"]

    # The server is healthy and serves base, adapter and merged requests after the refusals.
    assert merge_server.alive()
    assert requests.get(murl + "/health", timeout=10).status_code == 200
    assert generate(murl).status_code == 200
    assert generate(murl, adapter_id="m4-r2-qkv").status_code == 200
    r = generate(murl, merged_adapters={"ids": ["m1-r4-all", "m4-r2-qkv"],
                                        "merge_strategy": "cat"})
    assert r.status_code == 200, r.text
    assert any(a["rank"] == 6 for a in merges_loaded(murl))
