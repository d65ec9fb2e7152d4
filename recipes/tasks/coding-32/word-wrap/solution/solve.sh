#!/bin/bash
# Oracle of rl360/word-wrap: writes the reference module.
set -e
mkdir -p /app
cat > /app/wrap.py <<'PY'
"""Greedy word wrapping."""


def wrap(text: str, width: int) -> list[str]:
    if width < 1:
        raise ValueError(f"width must be at least 1 (got {width})")
    lines: list[str] = []
    current = ""
    for word in text.split():
        while len(word) > width:
            if current:
                lines.append(current)
                current = ""
            lines.append(word[:width])
            word = word[width:]
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines
PY
