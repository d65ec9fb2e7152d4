#!/bin/bash
# Oracle of rl360/knapsack: writes the reference module.
set -e
mkdir -p /app
cat > /app/knapsack.py <<'PY'
"""The 0/1 knapsack problem by dynamic programming over capacities."""


def _check(items, capacity: int) -> None:
    if capacity < 0:
        raise ValueError(f"negative capacity {capacity}")
    for weight, value in items:
        if weight < 0 or value < 0:
            raise ValueError(f"item ({weight}, {value}) is negative")


def _table(items, capacity: int) -> list[list[int]]:
    rows = [[0] * (capacity + 1)]
    for weight, value in items:
        prev = rows[-1]
        rows.append([max(prev[c], prev[c - weight] + value) if weight <= c else prev[c]
                     for c in range(capacity + 1)])
    return rows


def best_value(items, capacity: int) -> int:
    _check(items, capacity)
    return _table(items, capacity)[-1][capacity]


def best_selection(items, capacity: int) -> list[int]:
    _check(items, capacity)
    rows = _table(items, capacity)
    chosen, c = [], capacity
    for i in range(len(items), 0, -1):
        if rows[i][c] != rows[i - 1][c]:
            chosen.append(i - 1)
            c -= items[i - 1][0]
    return sorted(chosen)
PY
