import sys

import pytest

sys.path.insert(0, "/app")

from csvline import parse_line  # noqa: E402


def test_simple():
    assert parse_line("a,b,c") == ["a", "b", "c"]


def test_empty_fields():
    assert parse_line("a,,b,") == ["a", "", "b", ""]
    assert parse_line(",") == ["", ""]


def test_empty_line():
    assert parse_line("") == [""]


def test_quoted_comma():
    assert parse_line('x,"1,2",y') == ["x", "1,2", "y"]


def test_escaped_quotes():
    assert parse_line('x,"1,2","say ""hi"""') == ["x", "1,2", 'say "hi"']
    assert parse_line('""""') == ['"']


def test_empty_quoted_field():
    assert parse_line('"",a') == ["", "a"]


def test_spaces_kept():
    assert parse_line(" a , b ") == [" a ", " b "]


def test_quote_inside_unquoted_field():
    assert parse_line('5" disk,x') == ['5" disk', "x"]


def test_unterminated_quote():
    for bad in ('a,"bc', '"', '"a""'):
        with pytest.raises(ValueError):
            parse_line(bad)


def test_text_after_closing_quote():
    for bad in ('"ab"c', 'x,"a" ,y'):
        with pytest.raises(ValueError):
            parse_line(bad)
