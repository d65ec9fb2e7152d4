"""Load TOML tables into frozen, keyword-only dataclasses, validating as it goes.

Every configuration object in rl360 is a dataclass whose fields carry types;
this module turns a TOML mapping into one, checking each value against its
field's type. An unknown key is an error that suggests the closest valid key,
and a `ValueError` from a dataclass's `__post_init__` comes back naming the
file and the table, so a bad recipe is caught before an allocation is spent.

    profile = load_toml(ClusterProfile, Path("cluster/local.toml"))
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from rl360cli.errors import Rl360Error

T = TypeVar("T")

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
"""What a run, profile, node or image name may be: lowercase letters, digits, '.', '_' and '-'."""


class ConfigError(Rl360Error):
    """A configuration file that cannot be loaded: names the file, the key and the reason."""


def load_toml(cls: type[T], path: Path) -> T:
    """Read `path` and build `cls` from it; any problem is a `ConfigError`."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file", "check the path") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})", "fix the syntax at that line") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read ({e})") from None
    return from_mapping(cls, data, where=str(path))


def from_mapping(cls: type[T], data: Any, *, where: str, table: str = "") -> T:
    """Build dataclass `cls` from a mapping, checking keys and types; `where` names the source."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {_name(table)} must be a table, got {_kind(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(sorted(fields))}"
            raise ConfigError(f"{where}: {_name(table, key)}: unknown key", hint)
    values = {}
    for name, field in fields.items():
        if name in data:
            values[name] = _convert(hints[name], data[name], where, _join(table, name))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}: {_name(table, name)}: missing", f"add `{name} = ...` to {_name(table)}")
    try:
        return cls(**values)
    except ValueError as e:
        raise ConfigError(f"{where}: {_name(table)}: {e}") from None


def _convert(tp: Any, value: Any, where: str, key: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, where, key)
            except ConfigError as e:
                errors.append(e)
        raise errors[0]
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"use one of {', '.join(map(repr, allowed))}"
            raise ConfigError(f"{where}: {key}: {value!r} is not allowed", hint)
        return value
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, where=where, table=key)
    if origin in (tuple, list):
        if not isinstance(value, list):
            raise _type_error(where, key, "a list", value)
        args = get_args(tp)
        item_type = args[0] if args else Any
        return tuple(_convert(item_type, v, where, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise _type_error(where, key, "a table", value)
        key_type, value_type = get_args(tp) or (str, Any)
        return {k: _convert(value_type, v, where, _join(key, k)) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise _type_error(where, key, "true or false", value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(where, key, "an integer", value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _type_error(where, key, "a number", value)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _type_error(where, key, "a string", value)
        return value
    if tp is Path:
        if not isinstance(value, str):
            raise _type_error(where, key, "a path string", value)
        return Path(value)
    raise TypeError(f"configload cannot convert to {tp!r} ({key})")


def _type_error(where: str, key: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(f"{where}: {key}: expected {expected}, got {_kind(value)} {value!r}")


def _kind(value: Any) -> str:
    return {dict: "a table", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), type(value).__name__)


def _join(table: str, key: str) -> str:
    return f"{table}.{key}" if table else key


def _name(table: str, key: str = "") -> str:
    """`[grpo]` for a table, `grpo.lr` for a key in it."""
    if key:
        return _join(table, key)
    return f"[{table}]" if table else "the top level"
