#!/bin/bash
# Oracle of rl360/fix-bank-account: writes the reference module.
set -e
mkdir -p /app
cat > /app/bank.py <<'PY'
"""Bank accounts holding whole numbers of cents."""


class InsufficientFunds(Exception):
    """A withdrawal or transfer larger than the balance."""


class Account:
    def __init__(self, owner, balance=0):
        if balance < 0:
            raise ValueError("an account cannot open with a negative balance")
        self.owner = owner
        self.balance = balance
        # ("deposit", amount) and ("withdraw", amount) entries, oldest first.
        self.history = []

    def deposit(self, amount):
        """Add a positive amount; ValueError (and no change) for zero or negative amounts."""
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.balance += amount
        self.history.append(("deposit", amount))

    def withdraw(self, amount):
        """Take a positive amount out; ValueError for zero or negative amounts, InsufficientFunds
        when it exceeds the balance (no change in either case)."""
        if amount <= 0:
            raise ValueError("amount must be positive")
        if amount > self.balance:
            raise InsufficientFunds(f"{self.owner} has {self.balance}, needs {amount}")
        self.balance -= amount
        self.history.append(("withdraw", amount))

    def transfer(self, other, amount):
        """Move `amount` to `other`: a withdrawal here and a deposit there, or (on any error)
        neither."""
        # The withdrawal checks everything a deposit checks, so once it succeeded the deposit does too.
        self.withdraw(amount)
        other.deposit(amount)
PY
