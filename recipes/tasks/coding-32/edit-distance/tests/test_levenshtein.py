import sys

import pytest

sys.path.insert(0, "/app")

from levenshtein import closest, distance  # noqa: E402


def test_known_distances():
    assert distance("kitten", "sitting") == 3
    assert distance("flaw", "lawn") == 2
    assert distance("intention", "execution") == 5


def test_empty_and_identical():
    assert distance("", "") == 0
    assert distance("", "abc") == 3
    assert distance("abc", "") == 3
    assert distance("same", "same") == 0


def test_symmetric():
    for a, b in (("abc", "yabd"), ("sunday", "saturday"), ("a", "ab")):
        assert distance(a, b) == distance(b, a)


def test_unicode():
    assert distance("café", "cafe") == 1


def test_closest():
    assert closest("pythn", ["typhon", "pithon", "python"]) == "python"


def test_closest_tie_first_wins():
    assert closest("cat", ["bat", "cut", "cap"]) == "bat"


def test_closest_no_candidates():
    with pytest.raises(ValueError):
        closest("x", [])
