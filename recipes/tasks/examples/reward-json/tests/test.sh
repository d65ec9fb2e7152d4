#!/bin/bash
# Partial credit: reward = the fraction of the expected lines that are right; reward.json also carries
# the number of correct lines and whether the file exists.
mkdir -p /logs/verifier
python3 - <<'PY'
import json, os

n = int(os.environ.get("NUM_PRIMES", "10"))
primes, k = [], 2
while len(primes) < n:
    if all(k % p for p in primes):
        primes.append(k)
    k += 1
try:
    lines = open("/app/primes.txt").read().split()
    exists = 1.0
except OSError:
    lines, exists = [], 0.0
correct = sum(1 for want, got in zip(primes, lines) if got == str(want))
if len(lines) > n:
    correct = max(0, correct - (len(lines) - n))
result = {"reward": correct / n, "correct_lines": float(correct), "file_exists": exists}
with open("/logs/verifier/reward.json", "w") as f:
    json.dump(result, f)
print(result)
PY
