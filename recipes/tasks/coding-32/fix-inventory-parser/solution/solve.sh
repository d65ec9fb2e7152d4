#!/bin/bash
# Oracle of rl360/fix-inventory-parser: writes the reference module.
set -e
mkdir -p /app
cat > /app/inventory.py <<'PY'
"""Inventory files: one `name: quantity` per line."""


def parse_inventory(text):
    """{name: total quantity} from lines like `Apples: 3`.

    Names are case-insensitive (stored lowercase, surrounding spaces removed); a name listed more
    than once has its quantities added up. Blank lines and comment lines (whose first non-space
    character is `#`) are skipped. A quantity must be a non-negative whole number. Any other line
    raises ValueError("line N: ...") with N counted from 1.
    """
    items = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, quantity = line.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"line {number}: expected `name: quantity`")
        try:
            count = int(quantity)
        except ValueError:
            raise ValueError(f"line {number}: {quantity.strip()!r} is not a whole number") from None
        if count < 0:
            raise ValueError(f"line {number}: a quantity cannot be negative")
        key = name.strip().lower()
        items[key] = items.get(key, 0) + count
    return items
PY
