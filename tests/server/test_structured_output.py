"""Structured output through the real clients: LoRAX `response_format`, TGI `grammar` (JSON
Schema and regex) and OpenAI `response_format`, against the bundled e2e model. Its weights are
random, so only the constraint makes the text valid: every schema here bounds its strings,
numbers and arrays, and every request must end because its grammar is complete (eos / "stop"),
not at max_new_tokens. Seeds are sent concurrently from threads so that the server batches them.
"""
import json
import re
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
import requests

from conftest import server_fixture

MODEL_ID = "e2e-falcon7b-fullvocab"
PROMPT = "Reply in JSON:"
MESSAGES = [{"role": "system", "content": "You answer in JSON."},
            {"role": "user", "content": "Describe a falcon."}]
SEEDS = range(5)
MAX_NEW = 384
THREADS = 16


server = server_fixture("--max-input-length", 64, "--max-total-tokens", 512,
                        "--max-concurrent-requests", 256)


@pytest.fixture(scope="module")
def url(server):
    return server.url


# ---- The 20 schemas, easiest first, each with the client that sends it. ----
# lorax:  lorax-client, response_format={"type": "json_object", "schema": ...} (lorax-client
#         0.6.3 knows only that type); lorax-raw: POST /generate with {"type": "json_schema"}.
# tgi:    text-generation, Grammar(type=Json, value=schema); tgi-text: the schema as JSON text.
# chat / completions: openai, response_format {"type": "json_schema", "json_schema": {...}}
#         (completions through extra_body: the client has no such argument there).

POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                          "y": {"type": "integer", "minimum": 0, "maximum": 9}},
         "required": ["x", "y"]}

SCHEMAS = [
    ("enum", "tgi", True, {"enum": ["red", "green", "blue"]}),
    ("bounded_integer", "lorax", False, {"type": "integer", "minimum": -5, "maximum": 250}),
    ("short_string", "completions", False, {"type": "string", "minLength": 2, "maxLength": 6}),
    ("const_boolean_null", "chat", False, {
        "type": "object",
        "properties": {"v": {"const": "kestrel"}, "ok": {"type": "boolean"},
                       "nothing": {"type": "null"}},
        "required": ["v", "ok", "nothing"]}),
    ("flat_object", "lorax", True, {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8},
                       "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"]}),
    ("number_bounds", "tgi", False, {
        "type": "object",
        "properties": {"x": {"type": "number", "minimum": -1.5, "maximum": 2.5},
                       "y": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}},
        "required": ["x", "y"]}),
    ("optional_properties", "chat", True, {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99},
                       "nick": {"type": "string", "minLength": 1, "maxLength": 6},
                       "vip": {"type": "boolean"}},
        "required": ["id"]}),
    ("integer_array", "lorax-raw", True, {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 2, "maxItems": 4}),
    ("string_pattern", "tgi-text", False, {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                       "plate": {"type": "string", "pattern": "^[a-z]{2}[0-9]{1,3}$"}},
        "required": ["code", "plate"]}),
    ("type_arrays", "completions", False, {
        "type": "object",
        "properties": {"a": {"type": ["string", "null"], "maxLength": 5},
                       "b": {"type": ["integer", "null"], "minimum": 0, "maximum": 5},
                       "c": {"type": ["boolean", "string"], "maxLength": 3}},
        "required": ["a", "b", "c"]}),
    ("mixed_enum", "lorax", False, {
        "type": "object", "properties": {"e": {"enum": [1, "two", None, True, 2.5]}},
        "required": ["e"]}),
    ("string_formats", "chat", False, {
        "type": "object",
        "properties": {"id": {"type": "string", "format": "uuid"},
                       "day": {"type": "string", "pattern": "^20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])$"},
                       "other": {"type": "string", "format": "uuid"}},
        "required": ["id", "day", "other"]}),
    ("tuple_prefix_items", "tgi", True, {
        "type": "array",
        "prefixItems": [{"enum": ["a", "b"]}, {"type": "integer", "minimum": 0, "maximum": 3},
                        {"type": "boolean"}],
        "items": False}),
    ("any_of", "lorax-raw", False, {
        "type": "object",
        "properties": {"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 50},
                                       {"type": "string", "maxLength": 5},
                                       {"type": "array", "items": {"type": "boolean"},
                                        "maxItems": 2}]}},
        "required": ["v"]}),
    ("one_of_disjoint", "completions", True, {
        "type": "object",
        "properties": {"v": {"oneOf": [{"enum": [1, 2, 3]}, {"enum": ["a", "b"]},
                                       {"type": "boolean"}, {"type": "null"}]}},
        "required": ["v"]}),
    ("nested_objects", "tgi", False, {
        "type": "object",
        "properties": {"user": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 6},
                           "address": {"type": "object",
                                       "properties": {"city": {"enum": ["Oslo", "Lima", "Pune"]},
                                                      "zip": {"type": "string",
                                                              "pattern": "^[0-9]{5}$"}},
                                       "required": ["city", "zip"]}},
            "required": ["name", "address"]}},
        "required": ["user"]}),
    ("array_of_objects", "lorax", True, {
        "type": "object",
        "properties": {"points": {"type": "array", "items": POINT, "minItems": 1, "maxItems": 3}},
        "required": ["points"]}),
    ("defs_ref_all_of", "chat", False, {
        "type": "object", "$defs": {"pt": POINT},
        "properties": {"start": {"$ref": "#/$defs/pt"},
                       "end": {"allOf": [{"$ref": "#/$defs/pt"}]}},
        "required": ["start", "end"]}),
    ("recursive_ref", "lorax-raw", False, {
        "$defs": {"node": {"type": "object",
                           "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                          "kids": {"type": "array",
                                                   "items": {"$ref": "#/$defs/node"},
                                                   "maxItems": 1}},
                           "required": ["v", "kids"]}},
        "$ref": "#/$defs/node"}),
    ("order", "chat", True, {
        "type": "object",
        "$defs": {"addr": {"type": "object",
                           "properties": {"street": {"type": "string", "maxLength": 10},
                                          "country": {"enum": ["NO", "PE", "IN"]}},
                           "required": ["street", "country"]}},
        "properties": {
            "order_id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"},
            "lines": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object",
                "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
                               "qty": {"type": "integer", "minimum": 1, "maximum": 20},
                               "price": {"type": "number", "minimum": 0, "maximum": 100}},
                "required": ["sku", "qty"]}},
            "status": {"enum": ["new", "paid", "shipped"]},
            "note": {"type": ["string", "null"], "maxLength": 8},
            "ship_to": {"$ref": "#/$defs/addr"},
            "tags": {"type": "array", "items": {"enum": ["gift", "rush", "fragile"]},
                     "maxItems": 3},
            "attrs": {"type": "object",
                      "patternProperties": {"^[a-z]{1,3}$": {"type": "integer", "minimum": 0,
                                                             "maximum": 9}},
                      "maxProperties": 2},
            "rush": {"type": "boolean"}},
        "required": ["order_id", "lines", "status", "ship_to"]}),
]
assert len(SCHEMAS) == 20
SCHEMA_IDS = [name for name, *_ in SCHEMAS]
STREAMED = [(name, client, schema) for name, client, stream, schema in SCHEMAS if stream]

REGEXES = [
    r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",  # ISO date
    r"\(\d{3}\) \d{3}-\d{4}",  # US phone number
    r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)",  # IPv4
    r"#[0-9a-fA-F]{6}",  # hex color
    r"[A-Za-z_][A-Za-z0-9_]{0,9}",  # identifier
    r"(yes|no|maybe)",  # alternation
    r"(ab|cd){2,4}",  # bounded repetition of a group
    r"v\d{1,2}\.\d{1,2}\.\d{1,2}(-(alpha|beta|rc)\d?)?",  # semver, optional suffix
    r"[a-z]{1,8}@[a-z]{1,8}\.(com|org|net)",  # e-mail address
    r'"[^"\\]{1,8}" at ([01]\d|2[0-3]):[0-5]\d(:[0-5]\d)?',  # negated class, escapes, time
]


# ---- Clients. ----

def openai_client(url):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="unused", timeout=120, max_retries=0)


def openai_format(name, schema):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def post(url, path, body, timeout=120):
    return requests.post(url + path, json=body, timeout=timeout)


def sse_events(resp):
    """The JSON events of a text/event-stream response (`data:` lines; OpenAI's [DONE] left out).
    Lines split as bytes: a token's text may hold U+2028, which str.splitlines would split at."""
    for line in resp.iter_lines():
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data != b"[DONE]":
                yield json.loads(data)


class Out:
    """One generation: its text and whether it ended because the grammar was complete."""

    def __init__(self, text, finish_reason, grammar_end):
        self.text, self.finish_reason, self.grammar_end = text, finish_reason, grammar_end

    def __repr__(self):
        return f"Out({self.text!r}, finish_reason={self.finish_reason!r})"


def lorax_out(text, reason):
    reason = getattr(reason, "value", reason)
    return Out(text, reason, reason == "eos_token")


def openai_out(text, reason):
    return Out(text, reason, reason == "stop")


def generate_json(url, client, name, schema, seed, stream=False, max_new=MAX_NEW, **sampling):
    """Samples one constrained text at temperature 1 through `client`; streamed: the text is the
    concatenation of the streamed pieces (special tokens left out), which must equal the final
    generated_text where the API sends one."""
    kw = dict(do_sample=True, temperature=1.0, seed=seed, max_new_tokens=max_new, **sampling)
    if client == "lorax":
        from lorax import Client

        c = Client(url, timeout=120)
        fmt = {"type": "json_object", "schema": schema}
        if not stream:
            r = c.generate(PROMPT, response_format=fmt, details=True, **kw)
            return lorax_out(r.generated_text, r.details.finish_reason)
        events = list(c.generate_stream(PROMPT, response_format=fmt, **kw))
        text = "".join(e.token.text for e in events if not e.token.special)
        assert events[-1].generated_text == text
        return lorax_out(text, events[-1].details.finish_reason)
    if client in ("tgi", "tgi-text"):
        from text_generation import Client
        from text_generation.types import Grammar, GrammarType

        c = Client(url, timeout=120)
        value = schema if client == "tgi" else json.dumps(schema)
        grammar = Grammar(type=GrammarType.Json, value=value)
        if not stream:
            r = c.generate(PROMPT, grammar=grammar, **kw)
            return lorax_out(r.generated_text, r.details.finish_reason)
        events = list(c.generate_stream(PROMPT, grammar=grammar, **kw))
        text = "".join(e.token.text for e in events if not e.token.special)
        assert events[-1].generated_text == text
        return lorax_out(text, events[-1].details.finish_reason)
    if client == "lorax-raw":
        params = dict(kw, details=True,
                      response_format={"type": "json_schema", "schema": schema})
        body = {"inputs": PROMPT, "parameters": params}
        if not stream:
            r = post(url, "/generate", body)
            assert r.status_code == 200, r.text
            return lorax_out(r.json()["generated_text"], r.json()["details"]["finish_reason"])
        with requests.post(url + "/generate_stream", json=body, stream=True, timeout=120) as r:
            assert r.status_code == 200, r.text
            events = list(sse_events(r))
        text = "".join(e["token"]["text"] for e in events if not e["token"]["special"])
        assert events[-1]["generated_text"] == text
        return lorax_out(text, events[-1]["details"]["finish_reason"])
    oa = openai_client(url)
    common = dict(model=MODEL_ID, temperature=1.0, seed=seed, max_tokens=max_new, **sampling)
    fmt = openai_format(name, schema)
    if client == "chat":
        if not stream:
            r = oa.chat.completions.create(messages=MESSAGES, response_format=fmt, **common)
            return openai_out(r.choices[0].message.content, r.choices[0].finish_reason)
        chunks = list(oa.chat.completions.create(messages=MESSAGES, response_format=fmt,
                                                 stream=True, **common))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
        return openai_out(text, reasons[-1])
    assert client == "completions"
    if not stream:
        r = oa.completions.create(prompt=PROMPT, extra_body={"response_format": fmt}, **common)
        return openai_out(r.choices[0].text, r.choices[0].finish_reason)
    chunks = list(oa.completions.create(prompt=PROMPT, extra_body={"response_format": fmt},
                                        stream=True, **common))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    return openai_out(text, reasons[-1])


def generate_regex(url, index, seed, stream=False):
    """A regex-constrained text through the text-generation client (even indexes) or raw HTTP
    (odd: POST / for a text, /generate_stream for a stream)."""
    pattern = REGEXES[index]
    kw = dict(do_sample=True, temperature=1.0, seed=seed, max_new_tokens=96)
    if index % 2 == 0:
        from text_generation import Client
        from text_generation.types import Grammar, GrammarType

        c = Client(url, timeout=120)
        grammar = Grammar(type=GrammarType.Regex, value=pattern)
        if not stream:
            r = c.generate(PROMPT, grammar=grammar, **kw)
            return lorax_out(r.generated_text, r.details.finish_reason)
        events = list(c.generate_stream(PROMPT, grammar=grammar, **kw))
        text = "".join(e.token.text for e in events if not e.token.special)
        assert events[-1].generated_text == text
        return lorax_out(text, events[-1].details.finish_reason)
    body = {"inputs": PROMPT, "parameters": dict(kw, details=True,
                                                 grammar={"type": "regex", "value": pattern})}
    if not stream:
        r = post(url, "/", body)
        assert r.status_code == 200, r.text
        out = r.json()[0]  # the root route answers TGI's list
        return lorax_out(out["generated_text"], out["details"]["finish_reason"])
    with requests.post(url + "/generate_stream", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        events = list(sse_events(r))
    text = "".join(e["token"]["text"] for e in events if not e["token"]["special"])
    assert events[-1]["generated_text"] == text
    return lorax_out(text, events[-1]["details"]["finish_reason"])


@pytest.fixture(scope="module")
def runs(url):
    """Every schema x seed (and the streamed twins) and every regex x seed, submitted at once."""
    pool = ThreadPoolExecutor(THREADS)
    futures = {}
    for name, client, stream, schema in SCHEMAS:
        for seed in SEEDS:
            futures[("json", name, seed, False)] = pool.submit(
                generate_json, url, client, name, schema, seed)
            if stream:
                futures[("json", name, seed, True)] = pool.submit(
                    generate_json, url, client, name, schema, seed, stream=True)
    for index in range(len(REGEXES)):
        for seed in SEEDS:
            futures[("regex", index, seed, False)] = pool.submit(generate_regex, url, index, seed)
            if index in (0, 3, 7, 9) and seed < 3:
                futures[("regex", index, seed, True)] = pool.submit(
                    generate_regex, url, index, seed, stream=True)
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


# ---- Checks. ----

def closed(schema):
    """`schema` with additionalProperties / items false wherever kestrel's strict mode closes an
    object or a tuple that does not say: what the outputs must then also satisfy."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if ("properties" in out or "patternProperties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if "prefixItems" in out and "items" not in out:
        out["items"] = False
    return out


def assert_compact(text):
    """JSON with Python's separators: outside strings, the only whitespace is one space after a
    `,` or a `:`."""
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch.isspace():
            assert ch == " " and i > 0 and text[i - 1] in ",:" and not text[i + 1:i + 2].isspace(), \
                f"whitespace at {i} of {text!r}"


# Draft 2020-12's format checks ("date": a calendar date, "uuid"); jsonschema.validate checks no
# format without one. time and date-time are left out of the schemas: their fractional seconds
# have no bound, which the random model need not close.
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


def assert_valid_json(out, schema):
    assert out.grammar_end, f"did not end with the grammar: {out}"
    try:
        value = json.loads(out.text)
    except ValueError as e:
        raise AssertionError(f"not JSON ({e}): {out}") from None
    jsonschema.validate(value, schema, format_checker=FORMATS)
    jsonschema.validate(value, closed(schema), format_checker=FORMATS)
    assert_compact(out.text)
    return value


# ---- 1. JSON Schema ----

@pytest.mark.parametrize("name,client,stream,schema", SCHEMAS, ids=SCHEMA_IDS)
def test_json_schema_outputs_validate(runs, name, client, stream, schema):
    outs = [runs[("json", name, seed, False)].result() for seed in SEEDS]
    values = [assert_valid_json(out, schema) for out in outs]
    # Sampled, not greedy: the seeds do not all write the same value.
    assert len({json.dumps(v) for v in values}) > 1, f"5 seeds gave one output: {outs}"


@pytest.mark.parametrize("name,client,schema", STREAMED, ids=[n for n, *_ in STREAMED])
def test_json_schema_stream_equals_generate(runs, name, client, schema):
    for seed in SEEDS:
        plain = runs[("json", name, seed, False)].result()
        streamed = runs[("json", name, seed, True)].result()
        assert streamed.text == plain.text, f"seed {seed}"
        assert streamed.finish_reason == plain.finish_reason, f"seed {seed}"
        assert_valid_json(streamed, schema)


def test_format_checks_are_live():
    """The format checker used above rejects what the formats forbid (it is not a no-op)."""
    for value, fmt in [("2024-13-01", "date"), ("2023-04-31", "date"), ("not-a-uuid", "uuid")]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(value, {"type": "string", "format": fmt}, format_checker=FORMATS)
    for value, fmt in [("2024-02-29", "date"), ("9ee0ef1c-5b1e-4b0e-8a3e-4f4f7d2c1a00", "uuid")]:
        jsonschema.validate(value, {"type": "string", "format": fmt}, format_checker=FORMATS)


def test_properties_follow_schema_order(url):
    """Keys come out in the schema's order, as OpenAI's structured outputs write them (a schema
    may rely on it: "reasoning" before "answer"); an order that is not alphabetical shows it."""
    schema = {"type": "object",
              "properties": {"zeta": {"enum": [1]}, "alpha": {"enum": [2]},
                             "mid": {"enum": [3]}},
              "required": ["zeta", "alpha", "mid"]}
    for client in ("chat", "lorax", "tgi-text"):
        out = generate_json(url, client, "ordered", schema, seed=0, max_new=64)
        assert_valid_json(out, schema)
        assert list(json.loads(out.text)) == ["zeta", "alpha", "mid"], (client, out.text)


# ---- 2. Regexes ----

@pytest.mark.parametrize("index", range(len(REGEXES)), ids=[f"regex{i}" for i in range(10)])
def test_regex_outputs_fullmatch(runs, index):
    pattern = REGEXES[index]
    outs = [runs[("regex", index, seed, False)].result() for seed in SEEDS]
    for out in outs:
        assert out.grammar_end, out
        assert re.fullmatch(pattern, out.text), f"{out.text!r} does not match {pattern!r}"
    for seed in SEEDS:
        key = ("regex", index, seed, True)
        if key in runs:
            streamed = runs[key].result()
            assert streamed.text == outs[seed].text and streamed.grammar_end, f"seed {seed}"


# ---- 3. json_object without a schema ----

def test_json_object_lorax_and_openai(url):
    """Any JSON object: at temperature 1 the random model closes some within 24 tokens (most run
    on in a string); every text starts an object and every one that ended is one."""
    oa = openai_client(url)

    def lorax(seed):
        r = post(url, "/generate", {"inputs": PROMPT, "parameters": {
            "max_new_tokens": 24, "do_sample": True, "temperature": 1.0, "seed": seed,
            "details": True, "response_format": {"type": "json_object"}}})
        assert r.status_code == 200, r.text
        return lorax_out(r.json()["generated_text"], r.json()["details"]["finish_reason"])

    def chat(seed):
        r = oa.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=24, seed=seed,
                                       response_format={"type": "json_object"})
        return openai_out(r.choices[0].message.content, r.choices[0].finish_reason)

    def completions(seed):
        r = oa.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=24, seed=seed,
                                  extra_body={"response_format": {"type": "json_object"}})
        return openai_out(r.choices[0].text, r.choices[0].finish_reason)

    with ThreadPoolExecutor(THREADS) as pool:
        results = {f.__name__: list(pool.map(f, range(24))) for f in (lorax, chat, completions)}
    for api, outs in results.items():
        ended = [o for o in outs if o.grammar_end]
        assert ended, f"{api}: no json_object finished in 24 tokens: {outs}"
        for o in outs:
            assert o.text.startswith("{"), (api, o)
            if o.grammar_end:
                assert isinstance(json.loads(o.text), dict), (api, o)
                assert_compact(o.text)
            else:
                assert o.finish_reason == "length", (api, o)


def test_openai_text_format_is_unconstrained(url):
    r = openai_client(url).chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, max_tokens=8, temperature=0,
        response_format={"type": "text"})
    plain = openai_client(url).chat.completions.create(
        model=MODEL_ID, messages=MESSAGES, max_tokens=8, temperature=0)
    assert r.choices[0].message.content == plain.choices[0].message.content


# ---- 4. 422s ----

def lorax_body(response_format=None, grammar=None):
    params = {"max_new_tokens": 8}
    if response_format is not None:
        params["response_format"] = response_format
    if grammar is not None:
        params["grammar"] = grammar
    return "/generate", {"inputs": PROMPT, "parameters": params}


def chat_body(response_format):
    return "/v1/chat/completions", {"model": MODEL_ID, "messages": MESSAGES, "max_tokens": 8,
                                    "response_format": response_format}


def completions_body(response_format):
    return "/v1/completions", {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 8,
                               "response_format": response_format}


def prop(**sub):
    return {"type": "object", "properties": {"a": sub}, "required": ["a"]}


REJECTED = {
    # keywords that would not be enforced: the message names the keyword
    "uniqueItems": (lorax_body({"type": "json_schema", "schema": {
        "type": "array", "items": {"type": "integer"}, "uniqueItems": True, "maxItems": 3}}),
        ["`uniqueItems`"]),
    "contains": (lorax_body(grammar={"type": "json", "value": {
        "type": "array", "contains": {"type": "integer"}, "maxItems": 3}}), ["`contains`"]),
    "not": (chat_body(openai_format("n", prop(**{"not": {"type": "string"}}))), ["`not`"]),
    "if_then": (completions_body(openai_format("n", {
        "type": "object", "properties": {"a": {"enum": [1, 2]}, "b": {"type": "boolean"}},
        "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}})), ["`if`"]),
    "multipleOf_number": (lorax_body({"type": "json_object", "schema": prop(
        type="number", multipleOf=0.5, minimum=0, maximum=3)}), ["`multipleOf`"]),
    "format_date": (chat_body(openai_format("n", prop(type="string", format="date"))),
                    ["`format`", "02-31"]),
    "format_ipv4": (lorax_body({"type": "json_schema", "schema": prop(type="string", format="ipv4")}),
                    ["`format`", "leading zeros"]),
    "pattern_with_maxLength": (lorax_body({"type": "json_schema", "schema": prop(
        type="string", pattern="^[a-z]+$", maxLength=3)}), ["`maxLength`"]),
    "unresolvable_ref": (lorax_body(grammar={"type": "json", "value": {
        "$ref": "#/$defs/missing"}}), ["`$ref`", "#/$defs/missing"]),
    # invalid schemas
    "type_5": (lorax_body({"type": "json_schema", "schema": {"type": 5}}), ["`type`"]),
    "schema_not_object": (lorax_body({"type": "json_schema", "schema": "object"}),
                          ["response_format.schema"]),
    "openai_schema_array": (chat_body(openai_format("n", [1])),
                            ["response_format.json_schema.schema"]),
    "grammar_value_number": (lorax_body(grammar={"type": "json", "value": 5}), ["grammar.value"]),
    "grammar_value_bad_json_text": (lorax_body(grammar={"type": "json", "value": "{not json"}),
                                    ["grammar.value"]),
    # invalid regexes
    "regex_unclosed": (lorax_body(grammar={"type": "regex", "value": "(unclosed"}),
                       ["grammar.value"]),
    "regex_bad_class": (lorax_body(grammar={"type": "regex", "value": "[z-a]{2}"}),
                        ["grammar.value"]),
    "regex_empty": (lorax_body(grammar={"type": "regex", "value": ""}), ["grammar.value"]),
    # wrong types, missing schemas, both shapes at once
    "response_format_type": (lorax_body({"type": "yaml"}), ["response_format.type", "yaml"]),
    "grammar_type": (lorax_body(grammar={"type": "ebnf", "value": "a"}), ["grammar.type", "ebnf"]),
    "openai_type": (chat_body({"type": "xml"}), ["response_format.type", "xml"]),
    "lorax_json_schema_without_schema": (lorax_body({"type": "json_schema"}),
                                         ["response_format.schema"]),
    "openai_json_schema_without_schema": (chat_body({"type": "json_schema",
                                                     "json_schema": {"name": "n"}}),
                                          ["response_format.json_schema.schema"]),
    "openai_json_schema_missing": (completions_body({"type": "json_schema"}),
                                   ["response_format.json_schema"]),
    "response_format_and_grammar": (lorax_body({"type": "json_object"},
                                               {"type": "regex", "value": "a"}),
                                    ["response_format", "grammar"]),
}


def assert_healthy(url):
    assert requests.get(url + "/health", timeout=10).status_code == 200
    r = post(url, "/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 2}})
    assert r.status_code == 200, r.text
    assert r.json()["generated_text"]


@pytest.mark.parametrize("case", REJECTED, ids=list(REJECTED))
def test_rejected_with_422(url, case):
    (path, body), needles = REJECTED[case]
    r = post(url, path, body)
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["error_type"] == "validation"
    for needle in needles:
        assert needle in err["error"], f"{needle!r} not in {err['error']!r}"
    # The client's message, not a library's log line (time stamp, source path).
    assert ".cc:" not in err["error"] and "/tmp/" not in err["error"], err["error"]
    assert_healthy(url)


def test_clients_raise_422(url):
    """Each client surfaces the 422 as its own error, carrying the server's message."""
    import openai
    from lorax import Client as LoraxClient
    from lorax.errors import ValidationError as LoraxValidationError
    from text_generation import Client as TgiClient
    from text_generation.errors import ValidationError as TgiValidationError
    from text_generation.types import Grammar, GrammarType

    unique = {"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True, "maxItems": 2}
    with pytest.raises(LoraxValidationError, match="uniqueItems"):
        LoraxClient(url, timeout=60).generate(
            PROMPT, max_new_tokens=4, response_format={"type": "json_object", "schema": unique})
    with pytest.raises(TgiValidationError, match="uniqueItems"):
        TgiClient(url, timeout=60).generate(
            PROMPT, max_new_tokens=4, grammar=Grammar(type=GrammarType.Json, value=unique))
    with pytest.raises(openai.UnprocessableEntityError) as e:
        openai_client(url).chat.completions.create(
            model=MODEL_ID, messages=MESSAGES, max_tokens=4,
            response_format=openai_format("u", unique))
    assert "uniqueItems" in e.value.response.json()["error"]
    assert_healthy(url)


# ---- 5. Composition ----

ARRAY_SCHEMA = SCHEMAS[SCHEMA_IDS.index("array_of_objects")][3]
NESTED_SCHEMA = SCHEMAS[SCHEMA_IDS.index("nested_objects")][3]


def test_best_of_candidates_all_validate(url):
    from lorax import Client

    def one(_):
        return Client(url, timeout=120).generate(
            PROMPT, best_of=2, do_sample=True, temperature=1.0, max_new_tokens=MAX_NEW,
            details=True, response_format={"type": "json_object", "schema": ARRAY_SCHEMA})

    with ThreadPoolExecutor(3) as pool:
        responses = list(pool.map(one, range(3)))
    for r in responses:
        others = r.details.best_of_sequences
        assert len(others) == 1
        assert_valid_json(lorax_out(r.generated_text, r.details.finish_reason), ARRAY_SCHEMA)
        for o in others:
            assert_valid_json(lorax_out(o.generated_text, o.finish_reason), ARRAY_SCHEMA)


def test_stop_sequence_with_schema(url):
    """A stop sequence still cuts a constrained text: the same seed without it gives the text that
    the stop sequence cuts, or, where that text never holds it, the same text ending with eos."""
    stop = "}, {"
    with ThreadPoolExecutor(THREADS) as pool:
        full = list(pool.map(lambda s: generate_json(url, "lorax", "a", ARRAY_SCHEMA, s), SEEDS))
        cut = list(pool.map(lambda s: generate_json(url, "lorax", "a", ARRAY_SCHEMA, s,
                                                    stop_sequences=[stop]), SEEDS))
    assert any(stop in f.text for f in full), f"no seed wrote {stop!r}: {full}"
    for f, c in zip(full, cut):
        assert_valid_json(f, ARRAY_SCHEMA)
        if stop in f.text:
            assert c.text == f.text[:f.text.index(stop)] and c.finish_reason == "stop_sequence", c
        else:
            assert c.text == f.text and c.grammar_end, c


def test_sampling_knobs_with_schema(url):
    """top_k, top_p and repetition_penalty (TGI) and the OpenAI penalties together with a
    schema: still valid, still ended by the grammar."""
    knobs = dict(top_k=20, top_p=0.9, repetition_penalty=1.3)
    with ThreadPoolExecutor(THREADS) as pool:
        tgi = [pool.submit(generate_json, url, "tgi", "n", NESTED_SCHEMA, s, **knobs)
               for s in SEEDS]
        chat = [pool.submit(generate_json, url, "chat", "n", NESTED_SCHEMA, s, top_p=0.8,
                            presence_penalty=0.5, frequency_penalty=0.5) for s in SEEDS]
        for f in tgi + chat:
            assert_valid_json(f.result(), NESTED_SCHEMA)


def test_constrained_and_unconstrained_concurrently(url):
    errors = []
    results = []
    lock = threading.Lock()

    def constrained(i):
        name, client, _, schema = SCHEMAS[(i * 7) % len(SCHEMAS)]
        out = generate_json(url, client, name, schema, 100 + i)
        with lock:
            results.append((out, schema))

    def unconstrained(i):
        r = post(url, "/generate", {"inputs": f"Request {i}: the falcon", "parameters": {
            "max_new_tokens": 16, "do_sample": True, "seed": i, "details": True}})
        assert r.status_code == 200, r.text
        assert 0 < r.json()["details"]["generated_tokens"] <= 16

    def guard(f, i):
        try:
            f(i)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"{f.__name__}({i}): {e!r}")

    threads = [threading.Thread(target=guard, args=(f, i))
               for i in range(10) for f in (constrained, unconstrained)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert len(results) == 10
    for out, schema in results:
        assert_valid_json(out, schema)
    assert_healthy(url)


def test_grammar_metrics_and_cache(server, url):
    def compiles():
        return server.metrics()["kestrel_grammar_compiles_total"]

    def send(schema, seed):
        out = generate_json(url, "lorax-raw", "m", schema, seed, max_new=64)
        assert_valid_json(out, schema)

    # A schema no earlier request sent: one compile, then a cache hit.
    fresh = {"type": "object", "properties": {"tag": {"const": uuid.uuid4().hex},
                                              "n": {"type": "integer", "minimum": 0,
                                                    "maximum": 9}},
             "required": ["tag", "n"]}
    before = server.metrics()
    send(fresh, 1)
    send(fresh, 2)
    after = server.metrics()
    assert after["kestrel_grammar_compiles_total"] - before["kestrel_grammar_compiles_total"] == 1
    assert after["kestrel_grammar_cache_hits_total"] > before["kestrel_grammar_cache_hits_total"]
    # The same new schema from 4 requests at once: one compile, shared while in flight.
    other = dict(fresh, properties=dict(fresh["properties"], tag={"const": uuid.uuid4().hex}))
    start = compiles()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda s: send(other, s), range(4)))
    assert compiles() - start == 1
    text = requests.get(url + "/metrics", timeout=10).text
    for name in ("kestrel_grammar_compiles_total", "kestrel_grammar_compile_seconds_count",
                 "kestrel_grammar_compile_seconds_sum",
                 'kestrel_grammar_compile_seconds{quantile="0.5"}'):
        assert name in text, name
    m = server.metrics()
    assert m["kestrel_grammar_compile_seconds_count"] >= 2
    assert m["kestrel_grammar_compile_seconds_sum"] > 0
    assert m["kestrel_grammar_compiling"] == 0
