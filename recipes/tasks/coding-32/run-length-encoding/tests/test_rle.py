import sys

sys.path.insert(0, "/app")

from rle import decode, encode  # noqa: E402


def test_encode_runs():
    assert encode("aaabccdddd") == "3a1b2c4d"


def test_encode_empty():
    assert encode("") == ""


def test_encode_long_run():
    assert encode("x" * 12 + "y") == "12x1y"


def test_encode_spaces_and_unicode():
    assert encode("  éé!") == "2 2é1!"


def test_decode():
    assert decode("12x1y") == "x" * 12 + "y"
    assert decode("") == ""


def test_round_trip():
    for text in ["a", "ab", "aabbbaa", "zz  zz", "ñññ--", "q" * 105]:
        assert decode(encode(text)) == text
