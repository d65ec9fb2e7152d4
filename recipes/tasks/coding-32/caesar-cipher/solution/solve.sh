#!/bin/bash
# Oracle of rl360/caesar-cipher: writes the reference module.
set -e
mkdir -p /app
cat > /app/caesar.py <<'PY'
"""The Caesar cipher."""

import string


def _shift(ch: str, shift: int) -> str:
    for alphabet in (string.ascii_lowercase, string.ascii_uppercase):
        if ch in alphabet:
            return alphabet[(alphabet.index(ch) + shift) % 26]
    return ch


def encrypt(text: str, shift: int) -> str:
    return "".join(_shift(ch, shift) for ch in text)


def decrypt(text: str, shift: int) -> str:
    return encrypt(text, -shift)


def crack(ciphertext: str, known_word: str):
    for shift in range(26):
        if known_word in decrypt(ciphertext, shift):
            return shift
    return None
PY
