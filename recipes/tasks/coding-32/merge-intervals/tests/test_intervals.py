import sys

import pytest

sys.path.insert(0, "/app")

from intervals import covered, merge  # noqa: E402


def test_example():
    assert merge([(5, 8), (1, 3), (2, 4), (8, 9)]) == [(1, 4), (5, 9)]


def test_touching_and_separate():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]
    assert merge([(4, 5), (1, 3)]) == [(1, 3), (4, 5)]


def test_contained_and_points():
    assert merge([(1, 10), (2, 3), (4, 4)]) == [(1, 10)]
    assert merge([(3, 3), (3, 3)]) == [(3, 3)]


def test_empty():
    assert merge([]) == []


def test_lists_in_tuples_out_and_no_mutation():
    data = [[6, 7], [1, 2]]
    assert merge(data) == [(1, 2), (6, 7)]
    assert data == [[6, 7], [1, 2]]


def test_negative_numbers():
    assert merge([(-5, -1), (-2, 0), (2, 3)]) == [(-5, 0), (2, 3)]


def test_invalid_interval():
    with pytest.raises(ValueError):
        merge([(1, 2), (5, 4)])


def test_covered():
    assert covered([(1, 4), (2, 6), (10, 11)]) == 6
    assert covered([]) == 0
