import sys

import pytest

sys.path.insert(0, "/app")

from calc import evaluate  # noqa: E402


def test_precedence_and_parentheses():
    assert evaluate("2 + 3 * (4 - 1)") == 11
    assert evaluate("2+3*4") == 14
    assert evaluate("(2+3)*4") == 20
    assert evaluate("((7))") == 7


def test_left_to_right():
    assert evaluate("10 - 4 - 3") == 3
    assert evaluate("100 / 10 / 5") == 2
    assert evaluate("8 / 2 * 4") == 16


def test_division_truncates_toward_zero():
    assert evaluate("7/2") == 3
    assert evaluate("-7/2") == -3
    assert evaluate("7/-2") == -3
    assert evaluate("-7/-2") == 3
    assert evaluate("1/3") == 0


def test_unary_signs():
    assert evaluate("-3") == -3
    assert evaluate("--3") == 3
    assert evaluate("2*-3") == -6
    assert evaluate("-(2+3)") == -5
    assert evaluate("+4 - -4") == 8


def test_whitespace():
    assert evaluate("  1+\t2 *\n3 ") == 7


def test_big_integers_exact():
    assert evaluate("123456789 * 987654321") == 121932631112635269


def test_division_by_zero():
    with pytest.raises(ZeroDivisionError):
        evaluate("1 / (2 - 2)")


def test_invalid_expressions():
    for bad in ("", "   ", "1+", "(1", "1)", "3 4", "2**3", "2^3", "1.5", "abc", "()", "*2",
                "__import__('os')"):
        with pytest.raises(ValueError):
            evaluate(bad)


def test_long_chain():
    assert evaluate("+".join(["1"] * 500)) == 500
