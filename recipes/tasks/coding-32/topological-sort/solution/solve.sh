#!/bin/bash
# Oracle of rl360/topological-sort: writes the reference module.
set -e
mkdir -p /app
cat > /app/toposort.py <<'PY'
"""Topological order: dependencies first, the smallest ready item first."""

import heapq


def order(deps: dict[str, list[str]]) -> list[str]:
    needs: dict[str, set[str]] = {}
    users: dict[str, set[str]] = {}
    for item, before in deps.items():
        needs.setdefault(item, set()).update(before)
        for dep in before:
            needs.setdefault(dep, set())
            users.setdefault(dep, set()).add(item)
    waiting = {item: len(before) for item, before in needs.items()}
    ready = [item for item, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    result = []
    while ready:
        item = heapq.heappop(ready)
        result.append(item)
        for user in users.get(item, ()):
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(result) != len(needs):
        stuck = sorted(item for item, count in waiting.items() if count > 0)
        raise ValueError(f"dependency cycle among: {', '.join(stuck)}")
    return result
PY
