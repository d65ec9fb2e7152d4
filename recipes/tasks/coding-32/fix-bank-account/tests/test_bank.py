import sys

import pytest

sys.path.insert(0, "/app")

from bank import Account, InsufficientFunds  # noqa: E402


def _state(*accounts):
    return [(a.balance, list(a.history)) for a in accounts]


def test_deposit_and_withdraw():
    a = Account("ann", 100)
    a.deposit(50)
    a.withdraw(30)
    assert a.balance == 120
    assert a.history == [("deposit", 50), ("withdraw", 30)]


def test_invalid_deposit():
    a = Account("ann", 100)
    for amount in (0, -50):
        with pytest.raises(ValueError):
            a.deposit(amount)
    assert _state(a) == [(100, [])]


def test_no_overdraft():
    a = Account("ann", 100)
    with pytest.raises(InsufficientFunds):
        a.withdraw(101)
    assert _state(a) == [(100, [])]


def test_withdraw_everything():
    a = Account("ann", 100)
    a.withdraw(100)
    assert a.balance == 0


def test_transfer():
    a, b = Account("ann", 100), Account("bob", 5)
    a.transfer(b, 60)
    assert (a.balance, b.balance) == (40, 65)
    assert a.history == [("withdraw", 60)] and b.history == [("deposit", 60)]


def test_failed_transfer_changes_nothing():
    a, b = Account("ann", 100), Account("bob", 5)
    with pytest.raises(InsufficientFunds):
        a.transfer(b, 150)
    assert _state(a, b) == [(100, []), (5, [])]


def test_invalid_transfer_changes_nothing():
    a, b = Account("ann", 100), Account("bob", 5)
    for amount in (0, -10):
        with pytest.raises(ValueError):
            a.transfer(b, amount)
    assert _state(a, b) == [(100, []), (5, [])]
