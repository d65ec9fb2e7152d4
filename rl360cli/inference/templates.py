"""Launch templates: the command lines of the engines and the router, kept as TOML in the top-level `stages/`.

An operator changes a flag there, not in Python. A template holds a fixed
`argv` prefix, a `[flags]` table and an optional `[env]` table; values may
name `{placeholders}` that rl360 fills in:

    argv = ["{python}", "-m", "sglang_router.launch_router"]
    [flags]
    "--port" = "{port}"              # a placeholder: "--port 31000"
    "--worker-urls" = "{worker_urls}" # a list value: "--worker-urls URL1 URL2"
    "--disable-retries" = true        # a bare flag; false leaves it out
    [env]
    GLOO_SOCKET_IFNAME = "{gloo_ifname}"

A flag or variable whose placeholder has no value (None) is left out. The
folder is `stages/` beside the package, or `$RL360_STAGES_DIR`.
Tested by tests/inference/test_launch.py (golden command lines).
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl360cli.errors import Rl360Error

_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_SECRET_FLAGS = frozenset({"--api-key"})


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    """A rendered template: the argv and the environment variables to add."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def redacted(self) -> tuple[str, ...]:
        """The argv with secrets (API keys) masked, for plans and logs."""
        out = list(self.argv)
        for i, arg in enumerate(out[:-1]):
            if arg in _SECRET_FLAGS:
                out[i + 1] = "***"
        return tuple(out)


def stages_dir() -> Path:
    return Path(os.environ.get("RL360_STAGES_DIR") or Path(__file__).resolve().parents[2] / "stages")


def load_template(name: str) -> dict[str, Any]:
    path = stages_dir() / f"{name}.toml"
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise Rl360Error(f"launch template {path} is missing",
                         "run from an rl360 checkout or set RL360_STAGES_DIR to its stages/ folder") from None
    except tomllib.TOMLDecodeError as e:
        raise Rl360Error(f"launch template {path} is not valid TOML ({e})", "fix the syntax at that line") from None
    unknown = set(data) - {"argv", "flags", "env"}
    if unknown or not isinstance(data.get("argv"), list):
        raise Rl360Error(f"launch template {path} must hold `argv = [...]` and optional [flags] and [env] tables"
                         + (f" (unknown: {', '.join(sorted(unknown))})" if unknown else ""),
                         "compare it with the one in the rl360 repository")
    return data


def render(name: str, values: dict[str, Any], *, extra_args: dict[str, str] | None = None) -> LaunchCommand:
    """Fill template `stages/<name>.toml` with `values`; `extra_args` flags go last and replace same-named ones."""
    data = load_template(name)
    where = f"stages/{name}.toml"
    argv: list[str] = []
    for part in data["argv"]:
        value = _fill(part, values, where)
        if value is None:
            raise Rl360Error(f"{where}: argv entry {part!r} has no value", "give it a literal or a known placeholder")
        argv.extend(value if isinstance(value, list) else [value])
    flags = dict(data.get("flags", {}))
    for flag, value in (extra_args or {}).items():
        flags.pop(flag, None)
        flags[flag if flag.startswith("-") else f"--{flag}"] = value
    for flag, spec in flags.items():
        if spec is False or spec is None:
            continue
        if spec is True:
            argv.append(flag)
            continue
        value = _fill(spec, values, where)
        if value is None:
            continue
        if isinstance(value, list):
            if value:
                argv.extend([flag, *value])
        elif value == "":
            argv.append(flag)
        else:
            argv.extend([flag, value])
    env = {}
    for var, spec in data.get("env", {}).items():
        value = _fill(spec, values, where)
        if value is not None:
            env[var] = value if isinstance(value, str) else " ".join(value)
    return LaunchCommand(argv=tuple(argv), env=env)


def _fill(spec: Any, values: dict[str, Any], where: str) -> str | list[str] | None:
    """A template value with its placeholders filled; None when one of them has no value."""
    if isinstance(spec, bool):
        return "true" if spec else None
    if isinstance(spec, (int, float)):
        return _text(spec)
    if not isinstance(spec, str):
        raise Rl360Error(f"{where}: {spec!r} must be a string, a number or true/false")
    names = _PLACEHOLDER.findall(spec)
    for n in names:
        if n not in values:
            raise Rl360Error(f"{where}: unknown placeholder {{{n}}}", f"use one of: {', '.join(sorted(values))}")
    if any(values[n] is None for n in names):
        return None
    if len(names) == 1 and spec == f"{{{names[0]}}}" and isinstance(values[names[0]], (list, tuple)):
        return [_text(v) for v in values[names[0]]]
    return _PLACEHOLDER.sub(lambda m: _text(values[m.group(1)]), spec)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
