#!/bin/bash
# Oracle of rl360/fix-binary-search: writes the reference module.
set -e
mkdir -p /app
cat > /app/search.py <<'PY'
"""Searching in sorted lists."""


def binary_search(items, target):
    """Index of `target` in the sorted list `items`, or -1 when it is not there."""
    i = lower_bound(items, target)
    return i if i < len(items) and items[i] == target else -1


def lower_bound(items, target):
    """The first index i with items[i] >= target (len(items) when there is none)."""
    lo, hi = 0, len(items)
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    return lo
PY
