#!/bin/bash
# Oracle of rl360/semver-compare: writes the reference module.
set -e
mkdir -p /app
cat > /app/semver.py <<'PY'
"""Semantic Versioning 2.0.0 precedence."""

import re

_ID = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_VERSION = re.compile(
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    rf"(?:-({_ID}(?:\.{_ID})*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)


def _key(version: str):
    m = _VERSION.fullmatch(version) if isinstance(version, str) else None
    if m is None:
        raise ValueError(f"{version!r} is not a semantic version")
    major, minor, patch, pre = int(m[1]), int(m[2]), int(m[3]), m[4]
    if pre is None:
        return (major, minor, patch, (1,))
    ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return (major, minor, patch, (0, ids))


def compare(a: str, b: str) -> int:
    ka, kb = _key(a), _key(b)
    return (ka > kb) - (ka < kb)


def sort_versions(versions: list[str]) -> list[str]:
    return sorted(versions, key=_key)
PY
