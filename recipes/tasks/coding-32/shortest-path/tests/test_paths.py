import random
import sys

import pytest

sys.path.insert(0, "/app")

from paths import shortest_path  # noqa: E402


def _cost_of(edges, path):
    """The cheapest cost of walking `path` through `edges` (None if a step has no edge)."""
    total = 0
    for u, v in zip(path, path[1:]):
        weights = [w for a, b, w in edges if a == u and b == v]
        if not weights:
            return None
        total += min(weights)
    return total


def test_example():
    assert shortest_path([("a", "b", 1), ("b", "c", 1), ("a", "c", 5)], "a", "c") == (2, ["a", "b", "c"])


def test_unreachable():
    assert shortest_path([("a", "b", 1), ("c", "d", 1)], "a", "d") is None
    assert shortest_path([], "a", "b") is None


def test_start_is_goal():
    assert shortest_path([("a", "b", 1)], "a", "a") == (0, ["a"])
    assert shortest_path([], "z", "z") == (0, ["z"])


def test_edges_are_directed():
    assert shortest_path([("b", "a", 1)], "a", "b") is None


def test_parallel_edges_and_zero_weights():
    edges = [("a", "b", 4), ("a", "b", 1.5), ("b", "c", 0), ("a", "c", 2)]
    assert shortest_path(edges, "a", "c") == (1.5, ["a", "b", "c"])


def test_negative_weight():
    with pytest.raises(ValueError):
        shortest_path([("a", "b", 1), ("b", "c", -1)], "a", "c")


def test_greedy_first_step_is_wrong():
    edges = [("s", "a", 1), ("a", "t", 10), ("s", "b", 2), ("b", "c", 2), ("c", "t", 2)]
    assert shortest_path(edges, "s", "t") == (6, ["s", "b", "c", "t"])


def test_random_graphs_against_bellman_ford():
    rng = random.Random(11)
    for _ in range(60):
        nodes = [f"n{i}" for i in range(rng.randint(2, 9))]
        edges = [(rng.choice(nodes), rng.choice(nodes), rng.randint(0, 9))
                 for _ in range(rng.randint(0, 25))]
        dist = {nodes[0]: 0}
        for _ in nodes:
            for u, v, w in edges:
                if u in dist and dist[u] + w < dist.get(v, float("inf")):
                    dist[v] = dist[u] + w
        result = shortest_path(edges, nodes[0], nodes[-1])
        if nodes[-1] not in dist:
            assert result is None
            continue
        cost, path = result
        assert cost == dist[nodes[-1]]
        assert path[0] == nodes[0] and path[-1] == nodes[-1]
        assert _cost_of(edges, path) == cost
