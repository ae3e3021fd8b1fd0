#!/usr/bin/env bash
# Installs every Debian package kestrel's build and tests need, and builds xgrammar from its
# PyPI source distribution. Idempotent: what is present already is skipped.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev clang-format
  libboost-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev libopenblas-dev
  libcli11-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-pip python3-venv strace chromium chromium-driver
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# xgrammar (structured output, docs/structured-output.md): its C++ core, built from the source
# distribution PyPI ships, at a pinned version and checksum, without its Python bindings. Installed
# under $KESTREL_DEPS_DIR (default ~/.cache/kestrel-deps), where CMake looks for it; skipped when
# that version is there already.
xgrammar_version=0.2.8
xgrammar_sha256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
deps_dir=${KESTREL_DEPS_DIR:-$HOME/.cache/kestrel-deps}
xgrammar_prefix=$deps_dir/xgrammar-$xgrammar_version
if [ -f "$xgrammar_prefix/.sha256" ] && [ "$(cat "$xgrammar_prefix/.sha256")" = "$xgrammar_sha256" ]; then
  echo "install-deps: xgrammar $xgrammar_version present"
else
  echo "install-deps: building xgrammar $xgrammar_version into $xgrammar_prefix"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "xgrammar==$xgrammar_version" -d "$work"
  archive="$work/xgrammar-$xgrammar_version.tar.gz"
  echo "$xgrammar_sha256  $archive" | sha256sum -c --quiet -
  tar -xzf "$archive" -C "$work"
  src="$work/xgrammar-$xgrammar_version"
  mkdir -p "$src/build"
  # A config.cmake in the build folder takes precedence over the one that turns the bindings on.
  printf 'set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)\nset(XGRAMMAR_BUILD_CXX_TESTS OFF)\nset(XGRAMMAR_ENABLE_CPPTRACE OFF)\n' \
    >"$src/build/config.cmake"
  # No LTO (its archive must link into clang and sanitizer builds too), warnings not fatal.
  cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS="-fno-lto -Wno-error" -DCMAKE_INSTALL_PREFIX="$xgrammar_prefix" >/dev/null
  ninja -C "$src/build" -j "${KESTREL_JOBS:-$(nproc)}" >/dev/null
  ninja -C "$src/build" install >/dev/null
  echo "$xgrammar_sha256" >"$xgrammar_prefix/.sha256"
fi
