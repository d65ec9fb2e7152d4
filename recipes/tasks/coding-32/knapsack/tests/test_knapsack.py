import itertools
import random
import sys

import pytest

sys.path.insert(0, "/app")

from knapsack import best_selection, best_value  # noqa: E402


def _brute(items, capacity):
    best = 0
    for r in range(len(items) + 1):
        for combo in itertools.combinations(items, r):
            if sum(w for w, _ in combo) <= capacity:
                best = max(best, sum(v for _, v in combo))
    return best


def test_example():
    assert best_value([(1, 1), (3, 4), (4, 5), (5, 7)], 7) == 9


def test_greedy_by_ratio_fails():
    assert best_value([(6, 30), (5, 24), (5, 24)], 10) == 48


def test_edge_cases():
    assert best_value([], 10) == 0
    assert best_value([(3, 5)], 2) == 0
    assert best_value([(0, 5), (1, 1)], 0) == 5


def test_selection_is_valid_and_best():
    items = [(1, 1), (3, 4), (4, 5), (5, 7)]
    chosen = best_selection(items, 7)
    assert chosen == sorted(set(chosen))
    assert sum(items[i][0] for i in chosen) <= 7
    assert sum(items[i][1] for i in chosen) == 9


def test_negative_input():
    for items, capacity in (([(1, 1)], -1), ([(-1, 3)], 5), ([(1, -3)], 5)):
        with pytest.raises(ValueError):
            best_value(items, capacity)
        with pytest.raises(ValueError):
            best_selection(items, capacity)


def test_random_against_brute_force():
    rng = random.Random(9)
    for _ in range(80):
        items = [(rng.randint(0, 12), rng.randint(0, 20)) for _ in range(rng.randint(0, 9))]
        capacity = rng.randint(0, 30)
        best = _brute(items, capacity)
        assert best_value(items, capacity) == best
        chosen = best_selection(items, capacity)
        assert len(set(chosen)) == len(chosen)
        assert sum(items[i][0] for i in chosen) <= capacity
        assert sum(items[i][1] for i in chosen) == best


def test_inputs_not_modified():
    items = [(2, 3), (3, 4)]
    best_selection(items, 4)
    assert items == [(2, 3), (3, 4)]
