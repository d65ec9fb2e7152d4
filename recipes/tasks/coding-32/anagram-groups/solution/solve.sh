#!/bin/bash
# Oracle of rl360/anagram-groups: writes the reference module.
set -e
mkdir -p /app
cat > /app/anagrams.py <<'PY'
"""Anagram groups."""


def group_anagrams(words: list[str]) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    for word in words:
        groups.setdefault("".join(sorted(word.lower())), []).append(word)
    return sorted((sorted(group) for group in groups.values()), key=lambda group: group[0])
PY
