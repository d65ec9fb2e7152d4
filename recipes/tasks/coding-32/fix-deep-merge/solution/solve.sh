#!/bin/bash
# Oracle of rl360/fix-deep-merge: writes the reference module.
set -e
mkdir -p /app
cat > /app/merge.py <<'PY'
"""Layered configuration: merge an override mapping into a base mapping."""

import copy


def deep_merge(base, override):
    """A new dict: `base` with `override` applied on top.

    - A key whose values are dicts on both sides is merged recursively (by these same rules).
    - Any other value in `override` replaces the base value; lists are replaced, not concatenated.
    - A value of None in `override` removes the key (if `base` has it).
    - Neither argument is modified, and the result shares no dict or list with either of them.
    """
    result = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = deep_merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result
PY
