#!/bin/bash
# Oracle of rl360/parse-duration: writes the reference module.
set -e
mkdir -p /app
cat > /app/duration.py <<'PY'
"""Durations such as "1d2h3m4s"."""

import re

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"([0-9]+)([dhms])")


def parse_duration(text: str) -> int:
    parts = text.split()
    if not parts:
        raise ValueError("empty duration")
    total, last = 0, -1
    for part in parts:
        pos = 0
        while pos < len(part):
            m = _PART.match(part, pos)
            if m is None:
                raise ValueError(f"cannot read {part[pos:]!r} in {text!r}")
            rank = "dhms".index(m[2])
            if rank <= last:
                raise ValueError(f"unit {m[2]!r} repeated or out of order in {text!r}")
            last = rank
            total += int(m[1]) * _UNITS[m[2]]
            pos = m.end()
    return total


def format_duration(seconds: int) -> str:
    if seconds < 0:
        raise ValueError(f"negative duration {seconds}")
    out = []
    for unit, size in _UNITS.items():
        count, seconds = divmod(seconds, size)
        if count:
            out.append(f"{count}{unit}")
    return "".join(out) or "0s"
PY
