import random
import sys

import pytest

sys.path.insert(0, "/app")

from lru import LRUCache  # noqa: E402


def test_evicts_least_recently_used():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert cache.keys() == ["a", "c"]
    assert cache.get("b") is None


def test_get_default():
    cache = LRUCache(1)
    assert cache.get("missing") is None
    assert cache.get("missing", 42) == 42


def test_put_existing_key_updates_and_refreshes():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert cache.get("a") == 10
    assert "b" not in cache
    assert len(cache) == 2


def test_contains_does_not_refresh():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert "a" in cache
    cache.put("c", 3)
    assert "a" not in cache
    assert cache.keys() == ["b", "c"]


def test_capacity_one():
    cache = LRUCache(1)
    cache.put(1, "x")
    cache.put(2, "y")
    assert cache.keys() == [2]
    assert cache.get(2) == "y"


def test_invalid_capacity():
    for bad in (0, -3):
        with pytest.raises(ValueError):
            LRUCache(bad)


def test_stored_none_is_returned():
    cache = LRUCache(2)
    cache.put("k", None)
    assert cache.get("k", "default") is None


def test_matches_reference_model():
    rng = random.Random(7)
    cache, model = LRUCache(5), []  # model: [key, value] pairs, least recent first
    for _ in range(2000):
        key = rng.randrange(12)
        if rng.random() < 0.5:
            value = rng.randrange(1000)
            cache.put(key, value)
            model[:] = [p for p in model if p[0] != key] + [[key, value]]
            del model[:-5]
        else:
            found = [p for p in model if p[0] == key]
            assert cache.get(key, -1) == (found[0][1] if found else -1)
            if found:
                model.remove(found[0])
                model.append(found[0])
        assert cache.keys() == [p[0] for p in model]
