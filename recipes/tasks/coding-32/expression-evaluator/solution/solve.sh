#!/bin/bash
# Oracle of rl360/expression-evaluator: writes the reference module.
set -e
mkdir -p /app
cat > /app/calc.py <<'PY'
"""A small integer calculator: + - * / with C-style division, unary signs and parentheses."""


def _tokenize(expr: str) -> list[str]:
    tokens, i = [], 0
    while i < len(expr):
        ch = expr[i]
        if ch.isspace():
            i += 1
        elif ch in "0123456789":
            j = i
            while j < len(expr) and expr[j] in "0123456789":
                j += 1
            tokens.append(expr[i:j])
            i = j
        elif ch in "+-*/()":
            tokens.append(ch)
            i += 1
        else:
            raise ValueError(f"unexpected character {ch!r} at {i}")
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]):
        self.tokens, self.pos = tokens, 0

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ValueError("unexpected end of expression")
        self.pos += 1
        return token

    def expression(self) -> int:
        value = self.term()
        while self.peek() in ("+", "-"):
            if self.take() == "+":
                value += self.term()
            else:
                value -= self.term()
        return value

    def term(self) -> int:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            right = self.factor()
            if op == "*":
                value *= right
            elif right == 0:
                raise ZeroDivisionError("division by zero")
            else:
                quotient = abs(value) // abs(right)
                value = quotient if (value >= 0) == (right >= 0) else -quotient
        return value

    def factor(self) -> int:
        token = self.take()
        if token in ("+", "-"):
            value = self.factor()
            return value if token == "+" else -value
        if token == "(":
            value = self.expression()
            if self.take() != ")":
                raise ValueError("expected )")
            return value
        if token.isdigit():
            return int(token)
        raise ValueError(f"unexpected {token!r}")


def evaluate(expr: str) -> int:
    parser = _Parser(_tokenize(expr))
    value = parser.expression()
    if parser.peek() is not None:
        raise ValueError(f"unexpected {parser.peek()!r}")
    return value
PY
