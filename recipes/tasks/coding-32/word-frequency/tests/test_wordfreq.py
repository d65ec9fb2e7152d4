import sys

sys.path.insert(0, "/app")

from wordfreq import top_words  # noqa: E402


def test_example():
    assert top_words("The cat and the hat. THE END, and.", 2) == [("the", 3), ("and", 2)]


def test_ties_alphabetical():
    assert top_words("b a c b a c d", 3) == [("a", 2), ("b", 2), ("c", 2)]


def test_non_letters_split_words():
    assert top_words("don't stop; abc123abc", 5) == [("abc", 2), ("don", 1), ("stop", 1), ("t", 1)]


def test_k_larger_than_vocabulary():
    assert top_words("one two two", 10) == [("two", 2), ("one", 1)]


def test_k_zero_or_negative():
    assert top_words("a a a", 0) == []
    assert top_words("a a a", -2) == []


def test_no_words():
    assert top_words("", 3) == []
    assert top_words("123 ... !!", 3) == []


def test_non_ascii_letters_separate():
    assert top_words("café cafe", 2) == [("caf", 1), ("cafe", 1)]
