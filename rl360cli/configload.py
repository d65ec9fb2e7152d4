"""Load TOML tables into frozen, keyword-only dataclasses, validating as it goes.

Every configuration object in rl360 is a dataclass whose fields carry types;
this module turns a TOML mapping into one, checking each value against its
field's type. An unknown key is an error that suggests the closest valid key,
and a `ValueError` from a dataclass's `__post_init__` comes back naming the
file and the table, so a bad recipe is caught before an allocation is spent.

Command-line overrides (`--set section.key=value`) are put into the raw TOML
mapping before it is validated (`parse_override`, `with_overrides`), so they
pass exactly the checks the file does.

    profile = load_toml(ClusterProfile, Path("cluster/local.toml"))
    data = with_overrides(Recipe, read_toml(path), [parse_override("run.seed=3")])

A dataclass's `__post_init__` is a short list of rules (`check_positive`,
`check_non_negative`, `check_at_least`, `check_above`, `check_range`,
`check_one_of`, `check_integer`, `check_finite`, `check_name`), each raising
`ValueError("<field> must be <rule> (got <value>); <fix>")`:

    def __post_init__(self) -> None:
        check_at_least(self, 1, "num_steps", "num_tasks_per_step")
        check_range(self, 0, 1, "top_p", low_open=True)
        check_non_negative(self, "max_restarts", fix="0 leaves a dead engine dead")
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import numbers
import re
import tomllib
import types
import typing
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from rl360cli.errors import Rl360Error

T = TypeVar("T")

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
"""What a run, profile, node or image name may be: lowercase letters, digits, '.', '_' and '-'."""
NAME_RULE = "lowercase letters, digits, '.', '_' or '-'"


class ConfigError(Rl360Error):
    """A configuration file that cannot be loaded: names the file, the key and the reason, on one line
    (a key or a dataclass's message with a line break in it is joined up)."""

    def __init__(self, problem: str, fix: str | None = None):
        super().__init__(_one_line(problem), _one_line(fix) if fix else None)


def load_toml(cls: type[T], path: Path) -> T:
    """Read `path` and build `cls` from it; any problem is a `ConfigError`."""
    return from_mapping(cls, read_toml(path), where=str(path))


def read_toml(path: Path) -> dict[str, Any]:
    """The raw mapping of TOML file `path`; a missing, unreadable or malformed file is a `ConfigError`."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file", "check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a TOML file", "pass the file inside it") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({_one_line(str(e))})", "fix the syntax at that line") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read ({_one_line(str(e))})") from None


# ----------------------------------------------------------------------------- rules for __post_init__

# Each rule checks the named fields of `config` and raises `error` (ValueError, which `from_mapping` reports
# with the file and the table; a subclass where the caller answers with its own) naming the field, the bad
# value and what it must be, then `fix` where one helps. A field that is None is unset and passes: an
# optional setting is checked only when it is set. A number rule also refuses what is not a finite number
# (a bool, a string, nan, an infinity), so a config built in Python is held to what a TOML file is.


def check_positive(config: Any, *names: str, fix: str | None = None, error: type[ValueError] = ValueError) -> None:
    """Each field > 0."""
    _check(config, names, "positive", lambda v: v > 0, fix, error)


def check_non_negative(config: Any, *names: str, fix: str | None = None,
                       error: type[ValueError] = ValueError) -> None:
    """Each field >= 0."""
    _check(config, names, ">= 0", lambda v: v >= 0, fix, error)


def check_at_least(config: Any, low: float, *names: str, fix: str | None = None,
                   error: type[ValueError] = ValueError) -> None:
    """Each field >= `low`."""
    _check(config, names, f"at least {_bound(low)}", lambda v: v >= low, fix, error)


def check_above(config: Any, low: float, *names: str, fix: str | None = None,
                error: type[ValueError] = ValueError) -> None:
    """Each field > `low`."""
    _check(config, names, f"> {_bound(low)}", lambda v: v > low, fix, error)


def check_range(config: Any, low: float, high: float, *names: str, low_open: bool = False, high_open: bool = False,
                fix: str | None = None, error: type[ValueError] = ValueError) -> None:
    """Each field within [low, high]; an open end leaves that bound out (`low_open`: (low, high])."""
    what = f"in {'(' if low_open else '['}{_bound(low)}, {_bound(high)}{')' if high_open else ']'}"
    _check(config, names, what,
           lambda v: (low < v if low_open else low <= v) and (v < high if high_open else v <= high), fix, error)


def check_one_of(config: Any, allowed: Collection[Any], *names: str, fix: str | None = None,
                 error: type[ValueError] = ValueError) -> None:
    """Each field one of `allowed`."""
    _check(config, names, f"one of {', '.join(map(str, allowed))}", lambda v: v in allowed, fix, error,
           number=False)


def check_integer(config: Any, *names: str, fix: str | None = None, error: type[ValueError] = ValueError) -> None:
    """Each field a whole number (an int, not a bool)."""
    _check(config, names, "an integer", lambda v: isinstance(v, int), fix, error)


def check_finite(config: Any, *names: str, fix: str | None = None, error: type[ValueError] = ValueError) -> None:
    """Each field a finite number, with no bound."""
    _check(config, names, "a finite number", lambda v: True, fix, error)


def check_name(config: Any, *names: str, fix: str | None = None, error: type[ValueError] = ValueError) -> None:
    """Each field a name as `NAME` allows (a run, profile, node or image name)."""
    _check(config, names, NAME_RULE, lambda v: isinstance(v, str) and NAME.match(v) is not None, fix, error,
           number=False)


def _check(config: Any, names: Sequence[str], what: str, ok: Callable[[Any], bool], fix: str | None,
           error: type[ValueError], *, number: bool = True) -> None:
    for name in names:
        value = getattr(config, name)
        if value is None:
            continue
        if not ((not number or _is_finite_number(value)) and ok(value)):
            raise error(f"{name} must be {what} (got {_shown(value)})" + (f"; {fix}" if fix else ""))


def _is_finite_number(value: Any) -> bool:
    # bool is an int; a `true` where a number belongs is a typo, not 1. An int is finite however large
    # (math.isfinite would overflow on one past a float's range).
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _bound(value: float) -> str:
    """A rule's bound as a person writes it: 1 for 1.0, 0.25 for 0.25."""
    return f"{value:g}" if isinstance(value, float) else str(value)


# ----------------------------------------------------------------------------- command-line overrides

# `section.key` or deeper (`engine.extra_args.name`): TOML bare keys joined by dots.
_OVERRIDE_KEY = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


@dataclass(frozen=True, slots=True)
class Override:
    """One `--set section.key=value`: where it goes in the TOML, the value as TOML reads it, and its text."""

    path: tuple[str, ...]
    value: Any
    text: str

    @property
    def key(self) -> str:
        return ".".join(self.path)


def parse_override(text: str) -> Override:
    """`run.seed=3` -> an `Override`; the value is read as a TOML value (`3`, `5e-6`, `"docker"`, `[1, 2]`,
    `{a = 1}`), and text that is not one is a string, so `--set sandbox.provider=docker` needs no quotes."""
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not _OVERRIDE_KEY.match(key):
        raise ConfigError(f"--set {_one_line(text)}: expected section.key=value", "for example --set run.seed=3")
    try:
        doc = tomllib.loads(f"value = {raw}")
    except tomllib.TOMLDecodeError:
        doc = {}
    # More than one key means the text carried a line break and TOML of its own: it is a string then.
    value = doc["value"] if list(doc) == ["value"] else raw
    return Override(path=tuple(key.split(".")), value=value, text=f"{key}={raw}")


def with_overrides(cls: type, data: dict[str, Any], overrides: Sequence[Override]) -> dict[str, Any]:
    """A copy of the raw mapping `data` (of dataclass `cls`) with each override put in place, later ones
    winning. A key `cls` does not have is a `ConfigError` naming the closest valid key; types and ranges
    are left to `from_mapping`, which checks the result as it checks a file."""
    merged = copy.deepcopy(data)
    for override in overrides:
        check_override_key(cls, override)
        table = merged
        for depth, name in enumerate(override.path[:-1]):
            inner = table.setdefault(name, {})
            if not isinstance(inner, dict):
                where = ".".join(override.path[: depth + 1])
                raise ConfigError(f"--set {override.text}: {where} is {_kind(inner)}, not a table",
                                  f"set it whole: --set {where}=VALUE")
            table = inner
        table[override.path[-1]] = override.value
    return merged


def check_override_key(cls: type, override: Override) -> None:
    """Walk `override.path` through `cls`'s fields (and the values of its dict fields)."""
    tp: Any = cls
    for depth, name in enumerate(override.path):
        tp = _table_type(tp)
        if dataclasses.is_dataclass(tp):
            fields = [f.name for f in dataclasses.fields(tp) if f.init]
            if name not in fields:
                raise ConfigError(f"--set {override.text}: {_join('.'.join(override.path[:depth]), name)}: "
                                  "unknown key", _closest_key(cls, override.path[:depth], name, fields))
            tp = typing.get_type_hints(tp)[name]
        elif get_origin(tp) is dict:
            tp = (get_args(tp) or (str, Any))[1]
        elif tp is Any:
            return
        else:
            where = ".".join(override.path[:depth])
            raise ConfigError(f"--set {override.text}: {where} is a value, not a table",
                              f"set it whole: --set {where}=VALUE")


def _table_type(tp: Any) -> Any:
    """The dataclass or dict inside `X | None`, else `tp` itself."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        for option in get_args(tp):
            if dataclasses.is_dataclass(option) or get_origin(option) is dict:
                return option
    return tp


def _closest_key(cls: type, prefix: tuple[str, ...], name: str, fields: list[str]) -> str:
    """The valid key nearest `prefix.name`: a sibling if one is close, else any key of `cls` (`seed` ->
    `run.seed`)."""
    close = difflib.get_close_matches(name, fields, n=1)
    if close:
        return f"did you mean '{'.'.join((*prefix, close[0]))}'?"
    every = list(_dotted_keys(cls))
    close = difflib.get_close_matches(".".join((*prefix, name)), every, n=1) or [
        k for k in every if k.rsplit(".", 1)[-1] == name][:1]
    if close:
        return f"did you mean '{close[0]}'?"
    return f"valid keys here: {', '.join(sorted(fields))}"


def _dotted_keys(cls: type, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = _join(prefix, f.name)
        inner = _table_type(hints[f.name])
        if dataclasses.is_dataclass(inner):
            yield from _dotted_keys(inner, key)
        else:
            yield key


def _one_line(text: str) -> str:
    return " ".join(text.split())


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
            raise ConfigError(f"{where}: {key}: {_shown(value)} is not allowed", hint)
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
        # nan passes every `<` and `>` check a __post_init__ makes, inf most upper ones; neither means
        # anything in a recipe or profile.
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}: {key}: expected a finite number, got {value}")
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
    return ConfigError(f"{where}: {key}: expected {expected}, got {_kind(value)} {_shown(value)}")


def _shown(value: Any, limit: int = 80) -> str:
    """`repr(value)`, cut to `limit` characters (a 5,000-character string, or a whole table, is no help)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _kind(value: Any) -> str:
    return {dict: "a table", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), type(value).__name__)


def _join(table: str, key: str) -> str:
    return f"{table}.{key}" if table else key


def _name(table: str, key: str = "") -> str:
    """`[grpo]` for a table, `grpo.lr` for a key in it."""
    if key:
        return _join(table, key)
    return f"[{table}]" if table else "the top level"
