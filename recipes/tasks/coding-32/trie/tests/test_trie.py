import sys

sys.path.insert(0, "/app")

from trie import Trie  # noqa: E402


def _trie(*words):
    trie = Trie()
    for word in words:
        trie.insert(word)
    return trie


def test_insert_and_contains():
    trie = _trie("car", "cart", "dog")
    assert "car" in trie and "cart" in trie and "dog" in trie
    assert "ca" not in trie and "carts" not in trie and "do" not in trie


def test_starts_with_sorted():
    trie = _trie("cart", "car", "care", "dog", "cat")
    assert trie.starts_with("car") == ["car", "care", "cart"]
    assert trie.starts_with("ca") == ["car", "care", "cart", "cat"]
    assert trie.starts_with("x") == []


def test_starts_with_empty_prefix_lists_all():
    assert _trie("b", "a", "ab").starts_with("") == ["a", "ab", "b"]


def test_duplicates_counted_once():
    trie = _trie("a", "a", "b")
    assert len(trie) == 2
    assert len(Trie()) == 0


def test_remove_keeps_other_words():
    trie = _trie("car", "cart", "care")
    assert trie.remove("car") is True
    assert "car" not in trie and "cart" in trie and "care" in trie
    assert trie.remove("cart") is True
    assert trie.starts_with("c") == ["care"]
    assert len(trie) == 1


def test_remove_absent():
    trie = _trie("car")
    assert trie.remove("ca") is False
    assert trie.remove("cars") is False
    assert trie.remove("car") is True
    assert trie.remove("car") is False
    assert len(trie) == 0
    assert trie.starts_with("") == []


def test_empty_word():
    trie = _trie("", "a")
    assert "" in trie
    assert len(trie) == 2
    assert trie.starts_with("") == ["", "a"]
    assert trie.remove("") is True
    assert "" not in trie and "a" in trie
