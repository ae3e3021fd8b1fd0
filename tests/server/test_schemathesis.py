"""schemathesis against docs/openapi.json: whatever it generates, no 5xx."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, Server

SPEC = ROOT / "docs" / "openapi.json"


@pytest.fixture(scope="module")
def short_server():
    """A server of its own whose requests stay short: schemathesis sends many
    without max_new_tokens, and each would otherwise run to --max-total-tokens."""
    s = Server("--max-input-length", 64, "--max-total-tokens", 96)
    yield s
    assert s.stop() == 0, s.stderr()


def test_schemathesis_no_server_errors(short_server):
    server = short_server
    st = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")
    if not Path(st).exists():
        pytest.skip("schemathesis not installed")
    examples = os.environ.get("KESTREL_SCHEMATHESIS_EXAMPLES", "40")
    cmd = [st, "run", str(SPEC), "--url", server.url, "--checks", "not_a_server_error",
           "--max-examples", examples, "--workers", "1", "--request-timeout", "60",
           "--max-time", os.environ.get("KESTREL_SCHEMATHESIS_SECONDS", "180"), "--seed", "1",
           "--exclude-path", "/metrics"]
    # One worker: hypothesis's lambda descriptions call ast.parse, which CPython
    # 3.11 can fail spuriously with "AST constructor recursion depth mismatch"
    # (cpython gh-106905) when threads share it. That error is the tool's, not
    # the server's, so such a run is repeated (up to twice); any other failure counts.
    for _ in range(3):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                             env={**os.environ, "SCHEMATHESIS_HOOKS": ""})
        if "AST constructor recursion depth mismatch" not in out.stdout + out.stderr:
            break
    print(out.stdout[-4000:])
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert server.alive()
