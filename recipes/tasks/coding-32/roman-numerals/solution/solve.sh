#!/bin/bash
# Oracle of rl360/roman-numerals: writes the reference module.
set -e
mkdir -p /app
cat > /app/roman.py <<'PY'
"""Roman numerals from 1 to 3999, in their one canonical form."""

_VALUES = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]


def to_roman(n: int) -> str:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 3999:
        raise ValueError(f"{n!r} is not an integer from 1 to 3999")
    out = []
    for value, symbol in _VALUES:
        count, n = divmod(n, value)
        out.append(symbol * count)
    return "".join(out)


def from_roman(s: str) -> int:
    if not isinstance(s, str) or not s:
        raise ValueError(f"{s!r} is not a Roman numeral")
    total, i = 0, 0
    for value, symbol in _VALUES:
        while s.startswith(symbol, i):
            total += value
            i += len(symbol)
    if i != len(s) or not 1 <= total <= 3999 or to_roman(total) != s:
        raise ValueError(f"{s!r} is not a canonical Roman numeral")
    return total
PY
