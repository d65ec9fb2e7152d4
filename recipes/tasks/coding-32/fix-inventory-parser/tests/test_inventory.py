import sys

import pytest

sys.path.insert(0, "/app")

from inventory import parse_inventory  # noqa: E402


def test_basic():
    assert parse_inventory("apples: 3\npears: 10") == {"apples": 3, "pears": 10}


def test_names_normalised():
    assert parse_inventory("  Green Apples :  4 ") == {"green apples": 4}


def test_duplicates_added_up():
    assert parse_inventory("apples: 3\nAPPLES: 2\npears: 1\napples:5") == {"apples": 10, "pears": 1}


def test_comments_and_blank_lines():
    text = "# stock\n\napples: 1\n   # indented comment\n\t# tab comment\n   \npears: 2\n"
    assert parse_inventory(text) == {"apples": 1, "pears": 2}


def test_empty():
    assert parse_inventory("") == {}


def test_error_line_numbers():
    with pytest.raises(ValueError, match=r"^line 3:"):
        parse_inventory("a: 1\n# note\nbroken line\nb: 2")
    with pytest.raises(ValueError, match=r"^line 1:"):
        parse_inventory(": 5")


def test_bad_quantities():
    with pytest.raises(ValueError, match=r"^line 2:"):
        parse_inventory("a: 1\nb: lots")
    with pytest.raises(ValueError, match=r"^line 1:"):
        parse_inventory("a: -2")
    with pytest.raises(ValueError, match=r"^line 1:"):
        parse_inventory("a: 1.5")
