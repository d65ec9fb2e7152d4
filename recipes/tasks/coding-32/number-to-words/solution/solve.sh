#!/bin/bash
# Oracle of rl360/number-to-words: writes the reference module.
set -e
mkdir -p /app
cat > /app/numwords.py <<'PY'
"""English number names."""

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
         "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _below_thousand(n: int) -> list[str]:
    words = []
    hundreds, rest = divmod(n, 100)
    if hundreds:
        words += [_ONES[hundreds], "hundred"]
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        words.append(_TENS[tens] + (f"-{_ONES[ones]}" if ones else ""))
    elif rest:
        words.append(_ONES[rest])
    return words


def to_words(n: int) -> str:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 999_999_999:
        raise ValueError(f"{n!r} is not an integer from 0 to 999999999")
    if n == 0:
        return "zero"
    words = []
    for size, name in ((1_000_000, "million"), (1_000, "thousand"), (1, "")):
        group, n = divmod(n, size)
        if group:
            words += _below_thousand(group) + ([name] if name else [])
    return " ".join(words)
PY
