#!/bin/bash
# Oracle of rl360/edit-distance: writes the reference module.
set -e
mkdir -p /app
cat > /app/levenshtein.py <<'PY'
"""Levenshtein distance."""


def distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def closest(word: str, candidates: list[str]) -> str:
    if not candidates:
        raise ValueError("no candidates")
    return min(candidates, key=lambda candidate: distance(word, candidate))
PY
