#!/bin/bash
# Oracle of rl360/base-conversion: writes the reference module.
set -e
mkdir -p /app
cat > /app/bases.py <<'PY'
"""Integers in bases 2 to 36."""

DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def _check_base(base: int) -> None:
    if not 2 <= base <= 36:
        raise ValueError(f"base must be 2 to 36 (got {base})")


def to_base(n: int, base: int) -> str:
    _check_base(base)
    if n == 0:
        return "0"
    sign, n = ("-", -n) if n < 0 else ("", n)
    out = []
    while n:
        n, digit = divmod(n, base)
        out.append(DIGITS[digit])
    return sign + "".join(reversed(out))


def from_base(text: str, base: int) -> int:
    _check_base(base)
    sign, body = (-1, text[1:]) if text.startswith("-") else (1, text)
    if not body:
        raise ValueError(f"{text!r} has no digits")
    value = 0
    for ch in body.lower():
        digit = DIGITS.find(ch)
        if digit < 0 or digit >= base:
            raise ValueError(f"{ch!r} is not a digit in base {base}")
        value = value * base + digit
    return sign * value
PY
