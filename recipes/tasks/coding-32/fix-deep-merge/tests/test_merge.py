import copy
import sys

sys.path.insert(0, "/app")

from merge import deep_merge  # noqa: E402


BASE = {"name": "svc", "server": {"host": "0.0.0.0", "port": 80, "tls": {"on": False}},
        "tags": ["a", "b"], "debug": True}


def test_nested_merge():
    result = deep_merge(BASE, {"server": {"port": 8080, "tls": {"on": True}}})
    assert result["server"] == {"host": "0.0.0.0", "port": 8080, "tls": {"on": True}}
    assert result["name"] == "svc"


def test_lists_replaced():
    assert deep_merge(BASE, {"tags": ["c"]})["tags"] == ["c"]


def test_none_removes_keys():
    result = deep_merge(BASE, {"debug": None, "server": {"tls": None}, "missing": None})
    assert "debug" not in result and "missing" not in result
    assert result["server"] == {"host": "0.0.0.0", "port": 80}


def test_type_changes_replace():
    assert deep_merge({"a": {"b": 1}}, {"a": 5}) == {"a": 5}
    assert deep_merge({"a": 5}, {"a": {"b": 1}}) == {"a": {"b": 1}}


def test_inputs_not_modified():
    base, override = copy.deepcopy(BASE), {"server": {"port": 1}, "tags": ["x"], "debug": None}
    snapshot = copy.deepcopy(override)
    deep_merge(base, override)
    assert base == BASE and override == snapshot


def test_result_shares_nothing_with_base():
    base = copy.deepcopy(BASE)
    result = deep_merge(base, {"name": "other"})
    result["server"]["tls"]["on"] = True
    result["tags"].append("z")
    assert base == BASE


def test_result_shares_nothing_with_override():
    override = {"limits": {"cpu": [1, 2]}}
    result = deep_merge({}, override)
    result["limits"]["cpu"].append(3)
    assert override == {"limits": {"cpu": [1, 2]}}
