"""Palindromes in text."""


def is_palindrome(text):
    """True when `text` reads the same backwards, ignoring case and everything but letters and digits."""
    return text == text[::-1]


def count_palindromes(words):
    """How many of `words` are palindromes (in the sense of is_palindrome)."""
    count = 0
    for i in range(len(words) - 1):
        if is_palindrome(words[i]):
            count += 1
    return count
