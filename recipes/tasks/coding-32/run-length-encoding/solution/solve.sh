#!/bin/bash
# Oracle of rl360/run-length-encoding: writes the reference module.
set -e
mkdir -p /app
cat > /app/rle.py <<'PY'
"""Run-length encoding of text: "aaab" <-> "3a1b"."""


def encode(text: str) -> str:
    out = []
    i = 0
    while i < len(text):
        j = i
        while j < len(text) and text[j] == text[i]:
            j += 1
        out.append(f"{j - i}{text[i]}")
        i = j
    return "".join(out)


def decode(data: str) -> str:
    out = []
    count = ""
    for ch in data:
        if ch in "0123456789":
            count += ch
        else:
            out.append(ch * int(count))
            count = ""
    return "".join(out)
PY
