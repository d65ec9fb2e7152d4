#!/usr/bin/env bash
# The README's second command (and CI's): install everything, start the real dev services
# (Docker nodes + loopback registry, sshd nodes, Slurm), run the whole test suite, stop
# what was started.
#   bash cluster/dev/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."
bash cluster/dev/bootstrap.sh all

started=0
cleanup() {
    if [ "$started" = 1 ]; then
        echo "› stopping the dev services"
        bash cluster/dev/all.sh down || true
    fi
}
trap cleanup EXIT
echo "› starting the dev services"
started=1
bash cluster/dev/all.sh up

set +e
.venv/bin/python -m pytest -q -ra "$@"
code=$?
set -e
# pytest's 5 means it collected no test: that is a failure of this command, not a pass.
exit $code
