#!/bin/bash
# Reward 1 when every test passes, else 0. The exit code of this script is ignored.
mkdir -p /logs/verifier
cd /app
if python3 -m pytest -q -p no:cacheprovider /tests/test_stats.py; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
