#!/bin/sh
# Runs in the verifier's sandbox: /app/answer.txt is the artifact handed over from the agent's;
# the agent's /app/numbers.txt is not here, so the expected sum is baked into this image.
mkdir -p /logs/verifier
if [ -e /app/numbers.txt ]; then
    echo "the agent's sandbox leaked into the verifier's" >&2; echo 0 > /logs/verifier/reward.txt; exit 0
fi
if [ "$(tr -d ' \n' < /app/answer.txt 2>/dev/null)" = "$(cat /tests/expected.txt)" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
