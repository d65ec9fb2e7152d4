import sys

sys.path.insert(0, "/app")

from anagrams import group_anagrams  # noqa: E402


def test_example():
    words = ["listen", "Silent", "enlist", "google", "banana"]
    assert group_anagrams(words) == [["Silent", "enlist", "listen"], ["banana"], ["google"]]


def test_empty():
    assert group_anagrams([]) == []


def test_duplicates_kept():
    assert group_anagrams(["ab", "ba", "ab"]) == [["ab", "ab", "ba"]]


def test_case_insensitive():
    assert group_anagrams(["Ab", "bA", "c"]) == [["Ab", "bA"], ["c"]]


def test_letter_counts_matter():
    assert group_anagrams(["aab", "abb", "bab"]) == [["aab"], ["abb", "bab"]]


def test_groups_ordered_by_first_word():
    assert group_anagrams(["zz", "tac", "act", "b"]) == [["act", "tac"], ["b"], ["zz"]]
