#!/usr/bin/env bash
# The HTTP tests: pytest drives the real `kestrel serve` with the real clients
# (lorax-client, text-generation, openai), raw HTTP, schemathesis and a bounded
# load test. Creates .venv-test (once) and installs what it needs from PyPI.
#   scripts/test-python.sh [pytest args...]     KESTREL_BINARY=build/kestrel by default
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-test
packages=(pytest lorax-client text-generation openai schemathesis requests aiohttp selenium jinja2
          jsonschema)
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# Installed once; a marker records the package list so that edits to it reinstall.
marker="$venv/.kestrel-packages"
if [ ! -f "$marker" ] || [ "$(cat "$marker")" != "${packages[*]}" ]; then
  "$venv/bin/pip" install -q --disable-pip-version-check "${packages[@]}"
  echo "${packages[*]}" > "$marker"
fi

export KESTREL_BINARY="${KESTREL_BINARY:-$PWD/build/kestrel}"
if [ ! -x "$KESTREL_BINARY" ]; then
  echo "test-python: $KESTREL_BINARY is not built (cmake --build build, or set KESTREL_BINARY)" >&2
  exit 1
fi
exec "$venv/bin/python" -m pytest tests/server -q -p no:cacheprovider "$@"
