import calendar
import datetime
import sys

import pytest

sys.path.insert(0, "/app")

from dates import day_of_year, days_in_month, is_leap  # noqa: E402


def test_is_leap():
    assert is_leap(2024) and is_leap(2000) and is_leap(2400) and is_leap(1600)
    assert not is_leap(2023) and not is_leap(1900) and not is_leap(2100)


def test_is_leap_matches_calendar():
    for year in range(1, 3001):
        assert is_leap(year) == calendar.isleap(year), year


def test_days_in_month():
    assert days_in_month(2000, 2) == 29
    assert days_in_month(1900, 2) == 28
    assert days_in_month(2023, 4) == 30
    assert days_in_month(2023, 12) == 31
    for month in (0, 13):
        with pytest.raises(ValueError):
            days_in_month(2023, month)


def test_day_of_year_examples():
    assert day_of_year(2023, 1, 1) == 1
    assert day_of_year(2023, 12, 31) == 365
    assert day_of_year(2000, 12, 31) == 366
    assert day_of_year(2024, 3, 1) == 61


def test_day_of_year_matches_datetime():
    day = datetime.date(1999, 1, 1)
    while day.year < 2002:
        assert day_of_year(day.year, day.month, day.day) == day.timetuple().tm_yday
        day += datetime.timedelta(days=1)


def test_invalid_dates():
    for year, month, day in ((2023, 2, 29), (1900, 2, 29), (2023, 4, 31), (2023, 1, 0)):
        with pytest.raises(ValueError):
            day_of_year(year, month, day)
