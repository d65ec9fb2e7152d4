#!/bin/bash
# Oracle of rl360/word-frequency: writes the reference module.
set -e
mkdir -p /app
cat > /app/wordfreq.py <<'PY'
"""Word counts."""

import re
from collections import Counter


def top_words(text: str, k: int) -> list[tuple[str, int]]:
    if k <= 0:
        return []
    counts = Counter(word.lower() for word in re.findall(r"[A-Za-z]+", text))
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:k]
PY
