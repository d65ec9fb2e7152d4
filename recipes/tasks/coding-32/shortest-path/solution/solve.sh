#!/bin/bash
# Oracle of rl360/shortest-path: writes the reference module.
set -e
mkdir -p /app
cat > /app/paths.py <<'PY'
"""Dijkstra's shortest paths."""

import heapq
import itertools


def shortest_path(edges, start, goal):
    graph: dict = {}
    for u, v, w in edges:
        if w < 0:
            raise ValueError(f"edge {u}->{v} has a negative weight {w}")
        graph.setdefault(u, []).append((v, w))
    best = {start: 0}
    parent: dict = {}
    tie = itertools.count()
    queue = [(0, next(tie), start)]
    done = set()
    while queue:
        cost, _, node = heapq.heappop(queue)
        if node in done:
            continue
        if node == goal:
            path = [node]
            while path[-1] != start:
                path.append(parent[path[-1]])
            return cost, path[::-1]
        done.add(node)
        for nxt, w in graph.get(node, ()):
            new = cost + w
            if nxt not in best or new < best[nxt]:
                best[nxt] = new
                parent[nxt] = node
                heapq.heappush(queue, (new, next(tie), nxt))
    return None
PY
