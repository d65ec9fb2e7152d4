#!/bin/bash
# Oracle of rl360/fix-chunks: writes the reference module.
set -e
mkdir -p /app
cat > /app/chunking.py <<'PY'
"""Cutting sequences into pieces."""


def chunks(items, size):
    """Consecutive pieces of `size` items (slices of `items`), in order; the last one may be
    shorter. ValueError for size < 1."""
    if size < 1:
        raise ValueError("size must be at least 1")
    return [items[i:i + size] for i in range(0, len(items), size)]


def windows(items, size):
    """Every run of `size` consecutive items (slices of `items`), in order; none when there are
    fewer than `size` items. ValueError for size < 1."""
    if size < 1:
        raise ValueError("size must be at least 1")
    return [items[i:i + size] for i in range(len(items) - size + 1)]
PY
