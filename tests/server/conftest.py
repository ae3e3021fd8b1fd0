"""Fixtures for the HTTP tests: a real `kestrel serve` on a free loopback port.

The binary is $KESTREL_BINARY (default build/kestrel); the model is the bundled
tests/data/e2e-falcon7b-fullvocab (tokenizer.json included).
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "tests" / "data" / "e2e-falcon7b-fullvocab"
BINARY = Path(os.environ.get("KESTREL_BINARY", ROOT / "build" / "kestrel"))


class Server:
    """One `kestrel serve` process; its stderr is kept for failure messages."""

    def __init__(self, *extra_args, env=None, prefix=(), cwd=None):
        """`prefix`: a command the server runs under (strace); `cwd`: its working folder."""
        if not BINARY.exists():
            pytest.skip(f"{BINARY} not built (set KESTREL_BINARY)")
        self.args = [*prefix, str(BINARY), "serve", "--model", str(MODEL), "--host", "127.0.0.1",
                     "--port", "0", *map(str, extra_args),
                     # e.g. KESTREL_SERVE_ARGS="--tensor-parallel 2": the suite against other setups.
                     *os.environ.get("KESTREL_SERVE_ARGS", "").split()]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, cwd=cwd)
        self.stderr_lines = []
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()
        self.url = self._read_address()
        self.stdout_rest = []
        threading.Thread(target=self._drain_stdout, daemon=True).start()
        self._wait_healthy()

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line)

    def _drain_stdout(self):
        for line in self.proc.stdout:
            self.stdout_rest.append(line)

    def _read_address(self):
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"kestrel serve exited {self.proc.returncode}:\n{self.stderr()}")
                continue
            if " on http://" in line:
                self.address_line = line.strip()
                return line.strip().split(" on ", 1)[1]
        raise RuntimeError(f"kestrel serve printed no address:\n{self.stderr()}")

    def _wait_healthy(self):
        for _ in range(200):
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"kestrel serve never became healthy:\n{self.stderr()}")

    def stderr(self):
        return "".join(self.stderr_lines[-200:])

    def alive(self):
        return self.proc.poll() is None

    def metrics(self):
        text = requests.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
        return out

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"kestrel serve did not exit after {sig}:\n{self.stderr()}")
        return self.proc.returncode


def server_fixture(*args, scope="module"):
    """A fixture: one `kestrel serve` with these arguments for the scope, which must exit 0 on
    SIGTERM at its end."""

    @pytest.fixture(scope=scope)
    def fixture():
        s = Server(*args)
        yield s
        rc = s.stop()
        assert rc == 0, f"kestrel serve exited {rc} on SIGTERM:\n{s.stderr()}"

    return fixture


server = server_fixture("--max-input-length", 256, "--max-total-tokens", 512, scope="session")


@pytest.fixture(scope="session")
def url(server):
    return server.url


def kestrel_generate(prompt, max_new_tokens):
    """Greedy token ids and text of `kestrel generate` for one prompt."""
    out = subprocess.run([str(BINARY), "generate", "--model", str(MODEL), "--prompt", prompt,
                          "--max-new-tokens", str(max_new_tokens), "--greedy", "--json"],
                         check=True, capture_output=True, text=True, timeout=300)
    row = json.loads(out.stdout)["outputs"][0]
    return row["token_ids"], row["text"]
