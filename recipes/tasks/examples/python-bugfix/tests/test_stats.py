import sys

sys.path.insert(0, "/app")

from stats import mean, median  # noqa: E402


def test_odd_length():
    assert median([3, 1, 2]) == 2


def test_even_length():
    assert median([4, 1, 3, 2]) == 2.5


def test_unsorted_even():
    assert median([10, -2, 7, 1]) == 4.0


def test_mean_unchanged():
    assert mean([1, 2, 3, 4]) == 2.5
