"""Bad recipes and cluster profiles, fuzzed (hypothesis): whatever the file holds, loading it either gives a
valid config or raises one `ConfigError` of one line, never another exception or a traceback.

Each case starts from a shipped recipe or profile and changes one to three keys anywhere in its schema (also
keys the file leaves out, and unknown ones): a value of the wrong type, a negative or huge number, nan and
infinities, odd strings (empty, NUL, `..`, very long, line breaks), lists and tables where a scalar goes and
the reverse, or a whole table replaced. A few go through the real CLI (`rl360 up --recipe bad.toml`): exit 1,
one line on stderr, the state file as it was and still loadable. Each test prints how many cases it ran.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rl360cli.config import ClusterProfile, Recipe, load_profile, load_recipe
from rl360cli.configload import ConfigError, parse_override, read_toml
from rl360cli.state.store import StateFile
from tests.conftest import REPO, run_cli

RECIPES = sorted((REPO / "recipes").glob("*.toml"))
PROFILES = sorted((REPO / "cluster").glob("*.toml"))
# Hypothesis settings shared by every test: no example database in the repository, no per-case deadline
# (the first load of a module is slow), and function-scoped fixtures are used outside the cases on purpose.
FUZZ = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])


# ----------------------------------------------------------------------------- values and where they go

odd_text = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=24),
    st.sampled_from(["", " ", "..", "../../etc/passwd", "/", "a/b", "\x00", "nul\x00byte", "line\nbreak",
                     "UPPER", "-leading-dash", "ünïcode", "a" * 5000, "inf", "nan", "true", "1e999", "0x10",
                     "::", "unix://", "ssh://", "docker", "process", "local", "slurm", "12:00:00", "1-00:00:00"]),
)
numbers = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, -(2**63), 10**18]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, -1.5, 1e308, -1e308, 5e-324, math.inf, -math.inf, math.nan]),
)
scalars = st.one_of(numbers, odd_text, st.booleans(), st.datetimes(min_value=datetime(1, 1, 1)))
toml_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["a", "name", "share", "x", "1"]), inner,
                                                 max_size=3)), max_leaves=6)


def typed_values(tp: Any) -> st.SearchStrategy:
    """Values of the field's own type, at its edges: these get past the type checks to `__post_init__`."""
    tp = _inner(tp)
    origin = get_origin(tp)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.one_of(st.sampled_from([0, -1, 1, 2, 65535, 65536, 2**31, 2**63 - 1, -(2**63)]),
                         st.integers(min_value=-(2**63), max_value=2**63 - 1))
    if tp is float:
        return st.one_of(st.sampled_from([0.0, -0.0, -1.0, 1.0, 1.0001, 1e308, 5e-324, math.inf, -math.inf]),
                         st.floats(allow_nan=False), st.integers(min_value=-(2**63), max_value=2**63 - 1))
    if tp is str or tp is Path:
        return odd_text
    if origin is typing.Literal:
        return st.one_of(st.sampled_from(get_args(tp)), odd_text)
    if origin in (tuple, list):
        item = get_args(tp)[0] if get_args(tp) else str
        return st.lists(typed_values(item) if not dataclasses.is_dataclass(item) else st.just({}), max_size=5)
    if origin is dict:
        return st.dictionaries(odd_text, typed_values(get_args(tp)[1]) if get_args(tp) else scalars, max_size=3)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(typed_values(a) for a in get_args(tp) if a is not type(None)))
    return toml_values


def schema_paths(cls: type, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key of dataclass `cls`, tables and leaves (a dict of tables: its keys `service` etc. and `x`;
    a tuple of tables: its first item)."""
    paths = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = (*prefix, f.name)
        paths.append(path)
        FIELD_TYPES[path] = hints[f.name]
        tp = _inner(hints[f.name])
        if dataclasses.is_dataclass(tp):
            paths += schema_paths(tp, path)
        elif get_origin(tp) is dict and dataclasses.is_dataclass(_inner(get_args(tp)[1])):
            for key in ("service", "training", "rollout", "x"):
                paths += schema_paths(_inner(get_args(tp)[1]), (*path, key))
        elif get_origin(tp) is tuple and get_args(tp) and dataclasses.is_dataclass(get_args(tp)[0]):
            paths += schema_paths(get_args(tp)[0], (*path, "0"))
    return paths


def _inner(tp: Any) -> Any:
    args = [a for a in get_args(tp) if a is not type(None)]
    return args[0] if get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1 else tp


FIELD_TYPES: dict[tuple[str, ...], Any] = {}
RECIPE_PATHS = schema_paths(Recipe)
PROFILE_PATHS = schema_paths(ClusterProfile)


@st.composite
def mutations(draw, paths: list[tuple[str, ...]]) -> list[tuple[str, tuple[str, ...], Any]]:
    """One to three changes, each (`set` | `delete`, path, value): a value of the field's own type at its
    edges, any value, a key deleted, or an unknown key set."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["typed", "typed", "typed", "set", "delete", "unknown"]))
        path = draw(st.sampled_from(paths))
        if kind == "unknown":
            path = (*path[:-1], draw(st.sampled_from(["lrr", "nmae", "seed ", "x", "Tiers", "num_step"])))
        value = {"typed": lambda: draw(typed_values(FIELD_TYPES[path])), "set": lambda: draw(toml_values),
                 "unknown": lambda: draw(toml_values), "delete": lambda: None}[kind]()
        out.append(("delete" if kind == "delete" else "set", path, value))
    return out


def mutate(data: dict, changes: list) -> dict:
    for kind, path, value in changes:
        node: Any = data
        for name in path[:-1]:
            if isinstance(node, list):
                if not node:
                    node.append({})
                node = node[0]
            elif isinstance(node, dict):
                node = node.setdefault(name, {})
            if not isinstance(node, (dict, list)):
                break  # a scalar on the way (an earlier change put it there): nothing below it to change
        else:
            if isinstance(node, list):
                node = node[0] if node and isinstance(node[0], dict) else None
            if isinstance(node, dict):
                if kind == "delete":
                    node.pop(path[-1], None)
                else:
                    node[path[-1]] = value
    return data


# ----------------------------------------------------------------------------- a TOML writer (inline tables)


def toml_text(data: dict) -> str:
    return "".join(f"{_key(k)} = {_value(v)}\n" for k, v in data.items())


def _key(key: str) -> str:
    return _string(str(key))


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def _string(text: str) -> str:
    body = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F or c in '"\\' else c for c in text)
    return f'"{body}"'


# ----------------------------------------------------------------------------- the tests


def check_loads_or_one_line(loader, path: Path, counts: Counter) -> None:
    try:
        loader(path)
    except ConfigError as e:
        message = str(e)
        assert message and "\n" not in message and "\r" not in message, repr(message)
        counts["ConfigError"] += 1
    else:
        counts["loaded"] += 1


def report(name: str, counts: Counter, record_property) -> None:
    total = sum(counts.values())
    record_property("fuzz_cases", total)
    print(f"\n{name}: {total} cases ({', '.join(f'{n} {k}' for k, n in sorted(counts.items()))})")


def test_fuzzed_recipes_load_or_fail_in_one_line(tmp_path, record_property):
    counts: Counter = Counter()
    bases = {p: read_toml(p) for p in RECIPES}

    @settings(max_examples=1000, **FUZZ)
    @given(base=st.sampled_from(RECIPES), changes=mutations(RECIPE_PATHS))
    def case(base, changes):
        import copy

        data = mutate(copy.deepcopy(bases[base]), changes)
        path = tmp_path / "recipe.toml"
        path.write_text(toml_text(data))
        # Relative paths stay as the shipped recipe means them.
        check_loads_or_one_line(lambda p: load_recipe(p, base_dir=base.parent), path, counts)

    case()
    report("recipes", counts, record_property)
    assert sum(counts.values()) >= 1000 and counts["ConfigError"] > 0 and counts["loaded"] > 0


def test_fuzzed_profiles_load_or_fail_in_one_line(tmp_path, record_property):
    counts: Counter = Counter()
    bases = {p: read_toml(p) for p in PROFILES}

    @settings(max_examples=1000, **FUZZ)
    @given(base=st.sampled_from(PROFILES), changes=mutations(PROFILE_PATHS))
    def case(base, changes):
        import copy

        data = mutate(copy.deepcopy(bases[base]), changes)
        path = tmp_path / "profile.toml"
        path.write_text(toml_text(data))
        check_loads_or_one_line(load_profile, path, counts)

    case()
    report("profiles", counts, record_property)
    assert sum(counts.values()) >= 1000 and counts["ConfigError"] > 0 and counts["loaded"] > 0


def test_fuzzed_bytes_are_not_toml_in_one_line(tmp_path, record_property):
    counts: Counter = Counter()

    @settings(max_examples=200, **FUZZ)
    @given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda t: t.encode("utf-8", "replace")),
                         st.sampled_from([b"[run\nname = 1", b"\xff\xfe[run]", b'[run]\nname = "a\n', b"= 1",
                                          b"[[tasks]]\npath = 1", b"[run]\n[run]\n"])))
    def case(raw):
        path = tmp_path / "raw.toml"
        path.write_bytes(raw)
        check_loads_or_one_line(load_recipe, path, counts)
        check_loads_or_one_line(load_profile, path, counts)

    case()
    report("raw files", counts, record_property)
    assert counts["ConfigError"] >= 400


def test_fuzzed_overrides_load_or_fail_in_one_line(record_property):
    """`--set` text of any shape, also keys the schema has with values of their own type at the edges."""
    counts: Counter = Counter()
    smoke = REPO / "recipes" / "local-smoke.toml"
    typed = st.sampled_from([p for p in RECIPE_PATHS if p[0] not in ("tasks", "run") or p[-1] == "seed"]).flatmap(
        lambda path: typed_values(FIELD_TYPES[path]).map(lambda v: f"{'.'.join(path)}={_value(v)}"))

    @settings(max_examples=500, **FUZZ)
    @given(texts=st.lists(st.one_of(typed, st.text(max_size=40), odd_text.map(lambda t: f"run.seed={t}")),
                          min_size=1, max_size=3))
    def case(texts):
        try:
            overrides = [parse_override(t) for t in texts]
        except ConfigError as e:
            assert "\n" not in str(e), repr(str(e))
            counts["bad syntax"] += 1
            return
        check_loads_or_one_line(lambda p: load_recipe(p, overrides=overrides), smoke, counts)

    case()
    report("--set overrides", counts, record_property)
    assert sum(counts.values()) >= 500 and counts["loaded"] > 0


@pytest.mark.parametrize("name", ["folder", "missing"])
def test_a_path_that_is_no_file_is_one_line(tmp_path, name):
    path = tmp_path / name
    if name == "folder":
        path.mkdir()
    for loader in (load_recipe, load_profile):
        with pytest.raises(ConfigError) as e:
            loader(path)
        assert "\n" not in str(e.value)


def test_fuzzed_recipes_through_the_cli_exit_1_in_one_line(tmp_path, state_path, record_property):
    """`rl360 up --recipe bad.toml`: refused before anything starts; the state file is as it was."""
    with StateFile(state_path).update() as doc:
        doc["current_run"] = None
    before = state_path.read_bytes()
    smoke = REPO / "recipes" / "local-smoke.toml"
    base = read_toml(smoke)
    counts: Counter = Counter()

    @settings(max_examples=12, **FUZZ)
    @given(changes=mutations(RECIPE_PATHS))
    def case(changes):
        import copy

        data = mutate(copy.deepcopy(base), changes)
        # Always bad: one unknown key on top of the changes, so nothing can start.
        data.setdefault("run", {})
        if isinstance(data["run"], dict):
            data["run"]["nmae"] = "x"
        else:
            data["nmae"] = 1
        recipe = tmp_path / "bad.toml"
        recipe.write_text(toml_text(data))
        proc = run_cli("up", "--recipe", str(recipe), "--profile", str(REPO / "cluster/local.toml"),
                       "--set", "run.seed=1", state=state_path, cwd=tmp_path, timeout=30)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
        assert state_path.read_bytes() == before
        StateFile(state_path).read()
        counts["exit 1"] += 1

    case()
    report("recipes through `rl360 up`", counts, record_property)
    assert counts["exit 1"] >= 12
    assert not (tmp_path / "rl360" / "runs").exists()
