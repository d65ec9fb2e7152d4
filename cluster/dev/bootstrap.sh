#!/usr/bin/env bash
# Create .venv with rl360 and the extras named in $1 (default: local), installing
# the few Debian packages the sandboxes need when running as root.
#   bash cluster/dev/bootstrap.sh local
set -euo pipefail
cd "$(dirname "$0")/../.."
extras="${1:-local}"

if [ "$(id -u)" = 0 ] && ! command -v bwrap >/dev/null; then
    echo "› installing bubblewrap (sandbox isolation)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }
fi
if [ ! -x .venv/bin/python ]; then
    echo "› creating .venv"
    python3 -m venv .venv
fi
stamp=".venv/.rl360-$extras-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -e "$stamp" ]; then
    echo "› installing rl360[$extras] into .venv (about a minute the first time)"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]" 2>&1 | grep -v '^WARNING: Location' || true
    .venv/bin/python -c "import rl360cli" && touch "$stamp"
fi
