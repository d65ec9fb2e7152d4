import bisect
import random
import sys

sys.path.insert(0, "/app")

from search import binary_search, lower_bound  # noqa: E402


def test_single_element():
    assert binary_search([5], 5) == 0
    assert binary_search([5], 4) == -1


def test_first_and_last():
    items = [1, 3, 5, 7, 9]
    assert binary_search(items, 1) == 0
    assert binary_search(items, 9) == 4


def test_absent():
    items = [1, 3, 5, 7, 9]
    for target in (0, 4, 10):
        assert binary_search(items, target) == -1
    assert binary_search([], 3) == -1


def test_duplicates():
    items = [1, 2, 2, 2, 3]
    assert items[binary_search(items, 2)] == 2


def test_lower_bound_edges():
    assert lower_bound([1, 2, 3], 4) == 3
    assert lower_bound([1, 2, 3], 0) == 0
    assert lower_bound([], 1) == 0
    assert lower_bound([1, 2, 2, 3], 2) == 1


def test_lower_bound_matches_bisect():
    rng = random.Random(1)
    for _ in range(300):
        items = sorted(rng.randint(0, 20) for _ in range(rng.randint(0, 15)))
        target = rng.randint(-2, 22)
        assert lower_bound(items, target) == bisect.bisect_left(items, target)


def test_binary_search_finds_every_element():
    rng = random.Random(2)
    for _ in range(200):
        items = sorted(rng.sample(range(100), rng.randint(1, 20)))
        for index, value in enumerate(items):
            assert binary_search(items, value) == index
