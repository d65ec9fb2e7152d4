import sys

import pytest

sys.path.insert(0, "/app")

from chunking import chunks, windows  # noqa: E402


def test_chunks_exact():
    assert chunks([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_chunks_partial_last():
    assert chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert chunks("abcdefg", 3) == ["abc", "def", "g"]


def test_chunks_small_inputs():
    assert chunks([], 3) == []
    assert chunks((1, 2), 5) == [(1, 2)]


def test_chunks_invalid_size():
    for size in (0, -1, -5):
        with pytest.raises(ValueError):
            chunks([1, 2], size)


def test_windows():
    assert windows([1, 2, 3, 4], 2) == [[1, 2], [2, 3], [3, 4]]
    assert windows("abcd", 3) == ["abc", "bcd"]


def test_windows_edges():
    assert windows([1, 2, 3], 3) == [[1, 2, 3]]
    assert windows([1, 2], 3) == []
    assert windows([7], 1) == [[7]]


def test_windows_invalid_size():
    with pytest.raises(ValueError):
        windows([1, 2], 0)
