import sys

import pytest

sys.path.insert(0, "/app")

from numwords import to_words  # noqa: E402


def test_small():
    expected = {0: "zero", 1: "one", 7: "seven", 10: "ten", 11: "eleven", 13: "thirteen", 19: "nineteen"}
    for n, words in expected.items():
        assert to_words(n) == words


def test_tens():
    expected = {20: "twenty", 21: "twenty-one", 42: "forty-two", 90: "ninety", 99: "ninety-nine"}
    for n, words in expected.items():
        assert to_words(n) == words


def test_hundreds():
    assert to_words(100) == "one hundred"
    assert to_words(305) == "three hundred five"
    assert to_words(110) == "one hundred ten"
    assert to_words(999) == "nine hundred ninety-nine"


def test_thousands_and_millions():
    assert to_words(1000) == "one thousand"
    assert to_words(1_000_001) == "one million one"
    assert to_words(2_000_010) == "two million ten"
    assert to_words(1_000_000) == "one million"
    assert to_words(12_345) == "twelve thousand three hundred forty-five"
    assert to_words(1234567) == "one million two hundred thirty-four thousand five hundred sixty-seven"


def test_largest():
    assert to_words(999_999_999) == ("nine hundred ninety-nine million nine hundred ninety-nine thousand "
                                     "nine hundred ninety-nine")


def test_invalid():
    for bad in (-1, 1_000_000_000, 1.5, "12"):
        with pytest.raises(ValueError):
            to_words(bad)
