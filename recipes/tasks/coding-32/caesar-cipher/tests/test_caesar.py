import sys

sys.path.insert(0, "/app")

from caesar import crack, decrypt, encrypt  # noqa: E402


def test_encrypt_example():
    assert encrypt("Hello, World!", 3) == "Khoor, Zruog!"


def test_wraps_around():
    assert encrypt("xyz XYZ", 3) == "abc ABC"


def test_negative_and_large_shifts():
    assert encrypt("abc", -1) == "zab"
    assert encrypt("abc", 29) == encrypt("abc", 3)
    assert encrypt("abc", -27) == "zab"


def test_other_characters_unchanged():
    assert encrypt("é 1-2 ß", 5) == "é 1-2 ß"


def test_decrypt_round_trip():
    text = "The Quick Brown Fox, 1234!"
    for shift in (0, 1, 13, 25, 26, 100, -7):
        assert decrypt(encrypt(text, shift), shift) == text


def test_crack():
    secret = encrypt("meet me at the station", 11)
    assert crack(secret, "station") == 11


def test_crack_not_found():
    assert crack("abc", "hello") is None
