import sys

import pytest

sys.path.insert(0, "/app")

from duration import format_duration, parse_duration  # noqa: E402


def test_parse_examples():
    assert parse_duration("1h30m") == 5400
    assert parse_duration(" 2d 3h ") == 183600
    assert parse_duration("90m") == 5400
    assert parse_duration("45s") == 45
    assert parse_duration("1d2h3m4s") == 93784
    assert parse_duration("0s") == 0


def test_parse_invalid():
    for bad in ("", "   ", "5", "1x", "1m1h", "1h1h", "1h 1h", "-1s", "1.5h", "1 h", "h", "1hh", "1h,2m"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_format_examples():
    assert format_duration(93784) == "1d2h3m4s"
    assert format_duration(3600) == "1h"
    assert format_duration(61) == "1m1s"
    assert format_duration(86400 * 3 + 5) == "3d5s"


def test_format_zero():
    assert format_duration(0) == "0s"


def test_format_negative():
    with pytest.raises(ValueError):
        format_duration(-1)


def test_round_trip():
    for seconds in (1, 59, 60, 3599, 3601, 86399, 86401, 1234567):
        assert parse_duration(format_duration(seconds)) == seconds
