import sys

import pytest

sys.path.insert(0, "/app")

from roman import from_roman, to_roman  # noqa: E402


KNOWN = {1: "I", 4: "IV", 9: "IX", 14: "XIV", 40: "XL", 90: "XC", 400: "CD", 900: "CM",
         1994: "MCMXCIV", 2024: "MMXXIV", 3999: "MMMCMXCIX"}


def test_to_roman_known():
    for n, numeral in KNOWN.items():
        assert to_roman(n) == numeral


def test_from_roman_known():
    for n, numeral in KNOWN.items():
        assert from_roman(numeral) == n


def test_to_roman_out_of_range():
    for n in (0, -1, 4000):
        with pytest.raises(ValueError):
            to_roman(n)


def test_round_trip_all():
    for n in range(1, 4000):
        assert from_roman(to_roman(n)) == n


def test_from_roman_rejects_non_canonical():
    for bad in ("IIII", "VV", "IC", "XM", "", "mcm", "ABC", "MMMM", "IIX", "VX"):
        with pytest.raises(ValueError):
            from_roman(bad)
