import sys

sys.path.insert(0, "/app")

from spiral import spiral  # noqa: E402


def test_square():
    assert spiral([[1, 2, 3], [4, 5, 6], [7, 8, 9]]) == [1, 2, 3, 6, 9, 8, 7, 4, 5]


def test_wide():
    assert spiral([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]) == [1, 2, 3, 4, 8, 12, 11, 10, 9, 5, 6, 7]


def test_tall():
    assert spiral([[1, 2], [3, 4], [5, 6], [7, 8]]) == [1, 2, 4, 6, 8, 7, 5, 3]


def test_single_row_and_column():
    assert spiral([[1, 2, 3]]) == [1, 2, 3]
    assert spiral([[1], [2], [3]]) == [1, 2, 3]


def test_empty():
    assert spiral([]) == []
    assert spiral([[]]) == []


def test_every_element_once():
    matrix = [[r * 7 + c for c in range(7)] for r in range(5)]
    assert sorted(spiral(matrix)) == list(range(35))


def test_input_unchanged():
    matrix = [[1, 2], [3, 4]]
    spiral(matrix)
    assert matrix == [[1, 2], [3, 4]]
