#!/bin/bash
# Oracle of rl360/merge-intervals: writes the reference module.
set -e
mkdir -p /app
cat > /app/intervals.py <<'PY'
"""Merging integer intervals."""


def merge(intervals):
    pairs = []
    for start, end in intervals:
        if start > end:
            raise ValueError(f"interval ({start}, {end}) ends before it starts")
        pairs.append((start, end))
    pairs.sort()
    merged: list[tuple[int, int]] = []
    for start, end in pairs:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def covered(intervals) -> int:
    return sum(end - start for start, end in merge(intervals))
PY
