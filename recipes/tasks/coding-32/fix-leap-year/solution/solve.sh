#!/bin/bash
# Oracle of rl360/fix-leap-year: writes the reference module.
set -e
mkdir -p /app
cat > /app/dates.py <<'PY'
"""Calendar arithmetic in the proleptic Gregorian calendar."""

DAYS_IN_MONTH = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap(year):
    """Leap years are divisible by 4, except centuries, except centuries divisible by 400."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    """The number of days in `month` (1-12) of `year`; ValueError for a month outside 1-12."""
    if not 1 <= month <= 12:
        raise ValueError(f"month must be 1-12 (got {month})")
    if month == 2 and is_leap(year):
        return 29
    return DAYS_IN_MONTH[month - 1]


def day_of_year(year, month, day):
    """1 for January 1st ... 365 (366 in leap years) for December 31st; ValueError for a date that
    does not exist."""
    if not 1 <= day <= days_in_month(year, month):
        raise ValueError(f"{year}-{month}-{day} is not a date")
    return sum(days_in_month(year, m) for m in range(1, month)) + day
PY
