import sys

import pytest

sys.path.insert(0, "/app")

from toposort import order  # noqa: E402


def test_example():
    deps = {"app": ["lib", "util"], "lib": ["util"], "test": ["app"]}
    assert order(deps) == ["util", "lib", "app", "test"]


def test_diamond():
    assert order({"d": ["b", "c"], "b": ["a"], "c": ["a"]}) == ["a", "b", "c", "d"]


def test_independent_items_alphabetical():
    assert order({"z": [], "a": [], "m": []}) == ["a", "m", "z"]


def test_items_only_in_dependency_lists():
    assert order({"x": ["y"]}) == ["y", "x"]


def test_smallest_ready_item_first():
    assert order({"b": [], "a": ["c"], "c": []}) == ["b", "c", "a"]


def test_empty():
    assert order({}) == []


def test_repeated_dependency():
    assert order({"a": ["b", "b"], "c": ["a", "b", "a"]}) == ["b", "a", "c"]


def test_cycle():
    with pytest.raises(ValueError, match="cycle"):
        order({"a": ["b"], "b": ["c"], "c": ["a"], "d": []})


def test_self_dependency():
    with pytest.raises(ValueError, match="cycle"):
        order({"a": ["a"]})
