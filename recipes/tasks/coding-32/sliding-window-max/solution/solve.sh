#!/bin/bash
# Oracle of rl360/sliding-window-max: writes the reference module.
set -e
mkdir -p /app
cat > /app/window.py <<'PY'
"""Sliding-window maxima with a monotonic deque."""

from collections import deque


def window_max(nums: list[int], k: int) -> list[int]:
    if not 1 <= k <= len(nums):
        raise ValueError(f"k must be between 1 and {len(nums)} (got {k})")
    candidates: deque[int] = deque()  # indices, their values decreasing
    out = []
    for i, value in enumerate(nums):
        while candidates and nums[candidates[-1]] <= value:
            candidates.pop()
        candidates.append(i)
        if candidates[0] <= i - k:
            candidates.popleft()
        if i >= k - 1:
            out.append(nums[candidates[0]])
    return out
PY
