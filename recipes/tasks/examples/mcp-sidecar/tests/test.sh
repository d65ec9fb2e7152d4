#!/bin/bash
# Reward 1 when /app/secret.txt holds exactly the secret the sidecar gives out (asked again here), else 0.
mkdir -p /logs/verifier
python3 /tests/check_secret.py > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
