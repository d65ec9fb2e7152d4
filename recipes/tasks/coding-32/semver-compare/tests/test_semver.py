import sys

import pytest

sys.path.insert(0, "/app")

from semver import compare, sort_versions  # noqa: E402


CHAIN = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
         "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.1.0", "2.0.0", "10.0.0"]


def test_chain_in_order():
    for lower, higher in zip(CHAIN, CHAIN[1:]):
        assert compare(lower, higher) == -1, (lower, higher)
        assert compare(higher, lower) == 1, (lower, higher)


def test_equal():
    assert compare("1.2.3", "1.2.3") == 0
    assert compare("1.0.0-rc.1+build.5", "1.0.0-rc.1+other") == 0


def test_numeric_identifiers():
    assert compare("1.0.0-2", "1.0.0-10") == -1
    assert compare("1.0.0-10", "1.0.0-a") == -1
    assert compare("1.0.0-a.b", "1.0.0-a") == 1


def test_sort():
    shuffled = [CHAIN[i] for i in (7, 2, 11, 0, 5, 9, 3, 1, 10, 6, 4, 8)]
    assert sort_versions(shuffled) == CHAIN


def test_sort_is_stable_for_equal_precedence():
    assert sort_versions(["1.0.0+b", "0.9.0", "1.0.0+a"]) == ["0.9.0", "1.0.0+b", "1.0.0+a"]


def test_valid_forms():
    assert compare("0.0.0", "0.0.0-0") == 1
    assert compare("1.2.3-x-y.--z+meta-data.01", "1.2.3-x-y.--z") == 0


def test_invalid():
    for bad in ("1.2", "1.2.3.4", "01.2.3", "1.02.3", "1.2.3-", "1.2.3-01", "1.2.3+", "v1.2.3",
                "1.2.3-a..b", " 1.2.3", "1.2.3 ", "1.2.3-é", "", "1.2.x"):
        with pytest.raises(ValueError):
            compare(bad, "1.0.0")
