#!/usr/bin/env bash
# The prepared GPU check (bench/gpu/check.py): one H200, under 8 minutes, figures in one JSON file.
#   bash bench/gpu/check.sh [--dry-run] [--out FILE]
# On the GPU machine: python3 there holds torch, transformers, aiohttp and msgpack; megatron-core, if
# wanted, travels as a wheel in .whl/ (see docs/benchmarks.md, "GPU check") and is installed here first.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
if [ "${1:-}" = "--dry-run" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi   # it holds megatron-core already
elif compgen -G ".whl/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
exec timeout 480 "$PYTHON" bench/gpu/check.py "$@"
