#!/bin/bash
# Oracle of rl360/flatten-nested: writes the reference module.
set -e
mkdir -p /app
cat > /app/flatten.py <<'PY'
"""Flattening nested lists and tuples, without recursion."""


def flatten(items) -> list:
    out = []
    stack = [iter(items)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, (list, tuple)):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out
PY
