"""Layered configuration: merge an override mapping into a base mapping."""


def deep_merge(base, override):
    """A new dict: `base` with `override` applied on top.

    - A key whose values are dicts on both sides is merged recursively (by these same rules).
    - Any other value in `override` replaces the base value; lists are replaced, not concatenated.
    - A value of None in `override` removes the key (if `base` has it).
    - Neither argument is modified, and the result shares no dict or list with either of them.
    """
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = deep_merge(result[key], value)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = result[key] + value
        else:
            result[key] = value
    return result
