import sys

sys.path.insert(0, "/app")

from flatten import flatten  # noqa: E402


def test_example():
    assert flatten([1, [2, (3, [4])], "ab", [], ({"k": 1},)]) == [1, 2, 3, 4, "ab", {"k": 1}]


def test_flat_input():
    assert flatten([1, 2, 3]) == [1, 2, 3]
    assert flatten(()) == []


def test_atoms_stay_whole():
    assert flatten(["abc", b"de", {1, 2}, None]) == ["abc", b"de", {1, 2}, None]


def test_empty_nesting():
    assert flatten([[], [[]], ([],)]) == []


def test_order_kept():
    assert flatten([[[1, 2], 3], [4, [5, [6]]], 7]) == [1, 2, 3, 4, 5, 6, 7]


def test_very_deep():
    nested = [0]
    for i in range(1, 10001):
        nested = [nested, i]
    assert flatten(nested) == list(range(10001))


def test_input_unchanged():
    data = [1, [2, [3]]]
    flatten(data)
    assert data == [1, [2, [3]]]
