import random
import sys

import pytest

sys.path.insert(0, "/app")

from wrap import wrap  # noqa: E402


def test_example():
    assert wrap("The quick brown fox jumps over the lazy dog", 10) == [
        "The quick", "brown fox", "jumps over", "the lazy", "dog"]


def test_long_word():
    assert wrap("a verylongword b", 5) == ["a", "veryl", "ongwo", "rd b"]
    assert wrap("abcdef", 3) == ["abc", "def"]


def test_exact_fit():
    assert wrap("ab cd", 5) == ["ab cd"]
    assert wrap("ab cd", 4) == ["ab", "cd"]


def test_whitespace_collapses():
    assert wrap("  one\t\ttwo\n\nthree  ", 20) == ["one two three"]


def test_empty():
    assert wrap("", 10) == []
    assert wrap(" \n\t ", 3) == []


def test_invalid_width():
    for width in (0, -1):
        with pytest.raises(ValueError):
            wrap("text", width)


def test_random_texts():
    rng = random.Random(2)
    for _ in range(300):
        words = ["".join(rng.choice("abcxyz") for _ in range(rng.randint(1, 12)))
                 for _ in range(rng.randint(1, 30))]
        width = rng.randint(1, 15)
        lines = wrap(" ".join(words), width)
        assert all(1 <= len(line) <= width for line in lines)
        assert all(line == line.strip() and "  " not in line for line in lines)
        assert "".join("".join(lines).split()) == "".join(words)
        # greedy: the next line's first word would not have fitted
        for line, following in zip(lines, lines[1:]):
            first = following.split(" ")[0]
            assert len(line) + 1 + len(first) > width or len(first) == width
