#!/bin/bash
# Oracle of rl360/fix-palindromes: writes the reference module.
set -e
mkdir -p /app
cat > /app/textutil.py <<'PY'
"""Palindromes in text."""


def is_palindrome(text):
    """True when `text` reads the same backwards, ignoring case and everything but letters and digits."""
    kept = [ch.lower() for ch in text if ch.isalnum()]
    return kept == kept[::-1]


def count_palindromes(words):
    """How many of `words` are palindromes (in the sense of is_palindrome)."""
    return sum(1 for word in words if is_palindrome(word))
PY
