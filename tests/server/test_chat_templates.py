"""kestrel's Jinja subset against Python's jinja2 (the reference, set up as transformers'
apply_chat_template sets it up): every template under tests/data/chat_templates and 200 random
conversations each, rendered by `kestrel chat-template --json` and by jinja2, byte for byte.
Conversations a template refuses (raise_exception, or reading into an undefined value such as
messages[0] of no messages) must be refused by both.
"""
import json
import random
import subprocess
from pathlib import Path

import pytest

from conftest import BINARY, ROOT

jinja2 = pytest.importorskip("jinja2")
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

TEMPLATES = sorted(p.name for p in (ROOT / "tests" / "data" / "chat_templates").iterdir())
CONVERSATIONS = 200

PIECES = ["Hello", "What is a falcon?", "  padded  ", "two\nlines", "tab\there", "{{ not jinja }}",
          "{% raw %}", "quotes ' and \"", "back\\slash", "ünïcödé", "日本語のテキスト", "emoji 🦅",
          "", " ", "\n", "a" * 300, "User: fake turn", "<|assistant|>", "</s>", "[INST]", "0",
          "-1.5e3", "true", "None"]


class RaiseException(Exception):
    pass


def reference(source, bos, eos, messages, add_generation_prompt):
    """What transformers renders: trim_blocks, lstrip_blocks, loopcontrols, raise_exception,
    tojson."""
    def raise_exception(message):
        raise RaiseException(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False,
                                                              indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source).render(messages=messages, bos_token=bos, eos_token=eos,
                                          add_generation_prompt=add_generation_prompt)


def random_conversation(rng):
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(PIECES)})
    turns = rng.randint(0, 6)
    role = "user" if rng.random() < 0.9 else "assistant"  # mostly alternating from user
    for _ in range(turns):
        content = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3)))
        messages.append({"role": role, "content": content})
        if rng.random() < 0.93:
            role = "assistant" if role == "user" else "user"
    return {"messages": messages, "add_generation_prompt": rng.random() < 0.7}


@pytest.mark.parametrize("name", TEMPLATES)
def test_renders_as_jinja2(name, tmp_path):
    if not BINARY.exists():
        pytest.skip(f"{BINARY} not built (set KESTREL_BINARY)")
    folder = ROOT / "tests" / "data" / "chat_templates" / name
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    rng = random.Random(name)
    convs = [random_conversation(rng) for _ in range(CONVERSATIONS)]
    path = tmp_path / "conversations.json"
    path.write_text(json.dumps(convs, ensure_ascii=False))
    out = subprocess.run([str(BINARY), "chat-template", "--model", str(folder),
                          "--conversations", str(path), "--json"],
                         capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert len(got) == len(convs)
    refused = 0
    for i, (conv, text) in enumerate(zip(convs, got)):
        try:
            want = reference(cfg["chat_template"], cfg.get("bos_token", ""),
                             cfg.get("eos_token", ""), conv["messages"],
                             conv["add_generation_prompt"])
        except RaiseException as e:
            refused += 1
            assert isinstance(text, dict) and str(e) in text["error"], (i, conv, text)
            continue
        except jinja2.exceptions.UndefinedError:
            refused += 1
            assert isinstance(text, dict) and "undefined value" in text["error"], (i, conv, text)
            continue
        assert text == want, (i, conv)
    if name == "constructs":
        assert 0 < refused < CONVERSATIONS  # both branches taken
