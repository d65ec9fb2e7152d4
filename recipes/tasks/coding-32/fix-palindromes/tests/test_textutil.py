import sys

sys.path.insert(0, "/app")

from textutil import count_palindromes, is_palindrome  # noqa: E402


def test_simple():
    assert is_palindrome("level")
    assert not is_palindrome("hello")


def test_case_ignored():
    assert is_palindrome("Racecar")


def test_punctuation_and_spaces_ignored():
    assert is_palindrome("A man, a plan, a canal: Panama!")
    assert is_palindrome("No 'x' in Nixon")


def test_digits_count():
    assert is_palindrome("12 3 21")
    assert not is_palindrome("1231")


def test_empty_and_symbols_only():
    assert is_palindrome("")
    assert is_palindrome("?!")


def test_count_palindromes():
    assert count_palindromes(["noon", "level"]) == 2
    assert count_palindromes(["abc", "Anna", "xyz", "Step on no pets"]) == 2
    assert count_palindromes([]) == 0
