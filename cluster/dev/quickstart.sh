#!/usr/bin/env bash
# The README's first command: install what rl360 needs and run the local recipe end to end.
#   bash cluster/dev/quickstart.sh [extra rl360 up options]
set -euo pipefail
cd "$(dirname "$0")/../.."
bash cluster/dev/bootstrap.sh local
exec .venv/bin/rl360 up --recipe recipes/local-smoke.toml "$@"
