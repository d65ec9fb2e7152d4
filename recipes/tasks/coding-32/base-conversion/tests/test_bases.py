import random
import sys

import pytest

sys.path.insert(0, "/app")

from bases import from_base, to_base  # noqa: E402


def test_to_base_known():
    assert to_base(255, 16) == "ff"
    assert to_base(-10, 2) == "-1010"
    assert to_base(0, 7) == "0"
    assert to_base(35, 36) == "z"
    assert to_base(36, 36) == "10"


def test_from_base_known():
    assert from_base("FF", 16) == 255
    assert from_base("ff", 16) == 255
    assert from_base("-1010", 2) == -10
    assert from_base("z", 36) == 35
    assert from_base("0", 2) == 0


def test_round_trip():
    rng = random.Random(5)
    for _ in range(500):
        n, base = rng.randint(-10**12, 10**12), rng.randint(2, 36)
        assert from_base(to_base(n, base), base) == n
        assert int(to_base(n, base), base) == n


def test_invalid_base():
    for base in (0, 1, 37):
        with pytest.raises(ValueError):
            to_base(5, base)
        with pytest.raises(ValueError):
            from_base("1", base)


def test_invalid_texts():
    for text, base in (("", 10), ("-", 10), ("+5", 10), (" 10", 10), ("10 ", 10), ("1_0", 10),
                       ("0x1f", 16), ("12", 2), ("g", 16), ("--1", 10)):
        with pytest.raises(ValueError):
            from_base(text, base)
