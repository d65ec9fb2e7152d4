import sys

sys.path.insert(0, "/app")

from brackets import check, is_balanced  # noqa: E402


def test_balanced():
    assert check("a(b[c]{d}e)f") == -1
    assert check("{[()()]}") == -1
    assert check("") == -1
    assert check("no brackets") == -1


def test_mismatched_closer():
    assert check("(]") == 1
    assert check("([)]") == 2


def test_closer_with_nothing_open():
    assert check("x)") == 1
    assert check("()}") == 2


def test_left_open():
    assert check("(()") == 0
    assert check("a(b)c(") == 5
    assert check("x([{") == 1


def test_is_balanced():
    assert is_balanced("f(a[0], {b: c})")
    assert not is_balanced("f(a[0)]")


def test_first_problem_wins():
    assert check("(]}") == 1
