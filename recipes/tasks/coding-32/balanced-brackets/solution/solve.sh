#!/bin/bash
# Oracle of rl360/balanced-brackets: writes the reference module.
set -e
mkdir -p /app
cat > /app/brackets.py <<'PY'
"""Bracket matching."""

_PAIRS = {")": "(", "]": "[", "}": "{"}


def check(text: str) -> int:
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch in "([{":
            stack.append(i)
        elif ch in _PAIRS:
            if not stack or text[stack[-1]] != _PAIRS[ch]:
                return i
            stack.pop()
    return stack[0] if stack else -1


def is_balanced(text: str) -> bool:
    return check(text) == -1
PY
