"""Harbor-format tasks, unchanged: load one task folder or a task set (a folder of task folders).

A task folder holds `task.toml`, `instruction.md`, `environment/Dockerfile` (or
`[environment] docker_image`), `tests/test.sh` and optionally
`solution/solve.sh`. `task.toml` is read as Harbor reads it: schema versions
1.x (`version` or `schema_version`), `[task]`, `[metadata]`, `[verifier]`
(timeout_sec, env, user), `[agent]` (timeout_sec, user), `[solution]` env and
`[environment]` (docker_image, cpus, memory_mb, storage_mb, network_mode or
allow_internet, build_timeout_sec, workdir, env, healthcheck, and the legacy
`memory = "2G"` / `storage = "10G"` strings). Keys rl360 does not use are
ignored, as Harbor ignores them.

What rl360 cannot run yet is refused with a one-line reason rather than run
wrongly: multi-step tasks, Windows tasks, GPU tasks, a separate verifier
environment, MCP sidecars / docker-compose environments, network allowlists.

Network: a task gets a network only when it asks for one explicitly
(`network_mode = "public"` or `allow_internet = true`); Harbor's own default
(public) is not followed, because model-written code runs here.

    task = load_task(Path("recipes/tasks/examples/hello-world"))
    tasks = load_task_set(Path("recipes/tasks/examples"), include=("hello-world",))

Test: tests/sandbox/test_task.py (the shipped examples and Harbor's own examples).
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl360cli.errors import Rl360Error
from rl360cli.sandbox import dockerfile

DEFAULT_WORKDIR = "/app"
# Harbor's defaults where task.toml says nothing.
DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
DEFAULT_BUILD_TIMEOUT_S = 600.0
_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class TaskError(Rl360Error):
    """A task folder that cannot be loaded or run: names the task and the problem."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Healthcheck:
    """`[environment.healthcheck]`: a command that must pass before the agent starts."""

    command: str
    interval_s: float = 5.0
    timeout_s: float = 30.0
    start_period_s: float = 0.0
    retries: int = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    """One Harbor task, validated; what the providers and `run_attempt` need of it."""

    # The folder name: unique within a task set; used in labels, image tags and the RL loop.
    id: str
    # `[task] name` (e.g. "harbor/hello-world"), else the folder name.
    name: str
    path: Path
    instruction: str
    # The image to run, when the task names one; else the image built from `dockerfile`.
    docker_image: str | None = None
    dockerfile: Path | None = None
    # Reservation the task asks for (a recipe's [sandbox] cpus / memory_mb override it).
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    # True only when the task asks for a network explicitly.
    network: bool = False
    agent_timeout_s: float = DEFAULT_AGENT_TIMEOUT_S
    verifier_timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S
    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S
    # Where the agent's commands and the verifier run: `[environment] workdir`, else the Dockerfile's
    # last WORKDIR, else /app.
    workdir: str = DEFAULT_WORKDIR
    # Environment of every command (`[environment.env]`), of the verifier and of the oracle solution.
    # Values may hold ${VAR} / ${VAR:-default}, resolved from the orchestrator's environment at run time.
    env: dict[str, str] = field(default_factory=dict, hash=False)
    verifier_env: dict[str, str] = field(default_factory=dict, hash=False)
    solution_env: dict[str, str] = field(default_factory=dict, hash=False)
    agent_user: str | None = None
    verifier_user: str | None = None
    healthcheck: Healthcheck | None = None
    has_solution: bool = False
    skills_dir: str | None = None
    schema_version: str = "1.0"
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    # Content hash of environment/ (the tag of the image built from the Dockerfile).
    env_hash: str = ""

    @property
    def image_ref(self) -> str:
        """What a node's cache is keyed by: the named image, else the content-tagged build of the Dockerfile."""
        if self.docker_image:
            return self.docker_image
        return f"rl360-task/{_repo_name(self.id)}:{self.env_hash[:16]}"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"


def load_task(path: Path | str) -> Task:
    """Load and validate one task folder; `TaskError` names the task and the problem."""
    path = Path(path)
    label = path.name or str(path)
    if not path.is_dir():
        raise TaskError(f"task {label}: {path} is not a folder", "pass a task folder (it holds task.toml)")
    toml_path = path / "task.toml"
    try:
        data = tomllib.loads(toml_path.read_text())
    except FileNotFoundError:
        raise TaskError(f"task {label}: no task.toml in {path}", "a Harbor task folder holds task.toml") from None
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"task {label}: task.toml is not valid TOML ({e})", "fix the syntax at that line") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"task {label}: task.toml cannot be read ({e})", "check the file's permissions") from None
    try:
        return _build(path, data)
    except _Refused as e:
        raise TaskError(f"task {label}: {e.problem}", e.fix) from None


def load_task_set(path: Path | str, include: tuple[str, ...] | list[str] = ()) -> list[Task]:
    """Every task folder in `path` (or `path` itself when it is a task), sorted by id; `include` filters."""
    path = Path(path)
    if (path / "task.toml").exists():
        folders = [path]
    elif path.is_dir():
        folders = sorted(p for p in path.iterdir() if p.is_dir() and (p / "task.toml").exists())
    else:
        raise TaskError(f"task set {path}: no such folder", "check [tasks] path in the recipe")
    if include:
        names = {p.name for p in folders}
        missing = [name for name in include if name not in names]
        if missing:
            raise TaskError(f"task set {path}: no task folder named {', '.join(missing)}",
                            f"use names from: {', '.join(sorted(names)) or '(none)'}")
        folders = [p for p in folders if p.name in include]
    if not folders:
        raise TaskError(f"task set {path}: holds no task folder (none has a task.toml)",
                        "point [tasks] path at a Harbor dataset folder")
    return [load_task(p) for p in folders]


def resolve_env(env: dict[str, str], environ: dict[str, str] | os._Environ | None = None) -> dict[str, str]:
    """Fill ${VAR} and ${VAR:-default} from the orchestrator's environment; KeyError names a missing VAR."""
    environ = os.environ if environ is None else environ

    def fill(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise KeyError(name)

    return {key: _TEMPLATE.sub(fill, value) for key, value in env.items()}


# ----------------------------------------------------------------------------- building


class _Refused(Exception):
    def __init__(self, problem: str, fix: str | None = None):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def _build(path: Path, data: dict) -> Task:
    schema = _schema_version(data)
    env_table = _table(data, "environment")
    agent = _table(data, "agent")
    verifier = _table(data, "verifier")
    solution = _table(data, "solution")
    _refuse_unsupported(path, data, env_table, agent, verifier)

    info = _table(data, "task")
    name = info.get("name", path.name)
    if not isinstance(name, str) or not name.strip():
        raise _Refused("[task] name must be a non-empty string")

    cpus = _number(env_table, "cpus", 1, where="[environment]")
    if cpus <= 0:
        raise _Refused(f"[environment] cpus must be positive (got {cpus:g})")
    memory_mb = _size_mb(env_table, "memory_mb", "memory", 2048)
    storage_mb = _size_mb(env_table, "storage_mb", "storage", 10240)
    if memory_mb < 16:
        raise _Refused(f"[environment] memory must be at least 16 MB (got {memory_mb} MB)")
    if storage_mb < 1:
        raise _Refused(f"[environment] storage must be at least 1 MB (got {storage_mb} MB)")
    agent_timeout = _timeout(agent, "[agent]", DEFAULT_AGENT_TIMEOUT_S)
    verifier_timeout = _timeout(verifier, "[verifier]", DEFAULT_VERIFIER_TIMEOUT_S)
    build_timeout = _number(env_table, "build_timeout_sec", DEFAULT_BUILD_TIMEOUT_S, where="[environment]")
    if build_timeout <= 0:
        raise _Refused(f"[environment] build_timeout_sec must be positive (got {build_timeout:g})")

    instruction_path = path / "instruction.md"
    try:
        instruction = instruction_path.read_text()
    except FileNotFoundError:
        raise _Refused("no instruction.md", "write the task's instruction to instruction.md") from None
    except (OSError, UnicodeDecodeError) as e:
        raise _Refused(f"instruction.md cannot be read ({e})") from None
    test_sh = path / "tests" / "test.sh"
    if not test_sh.is_file():
        raise _Refused("no tests/test.sh", "add tests/test.sh: it writes /logs/verifier/reward.txt or reward.json")

    docker_image = env_table.get("docker_image")
    if docker_image is not None and (not isinstance(docker_image, str) or not docker_image.strip()):
        raise _Refused(f"[environment] docker_image must be an image reference (got {docker_image!r})")
    env_dir = path / "environment"
    dockerfile_path = env_dir / "Dockerfile"
    has_dockerfile = dockerfile_path.is_file()
    if not docker_image and not has_dockerfile:
        raise _Refused("no environment/Dockerfile and no [environment] docker_image",
                       "add one of them: the image the sandbox runs")
    image_workdir = None
    if has_dockerfile:
        try:
            image_workdir = dockerfile.last_workdir(dockerfile.parse(dockerfile_path.read_text()))
        except (OSError, UnicodeDecodeError) as e:
            raise _Refused(f"environment/Dockerfile cannot be read ({e})") from None
    workdir = env_table.get("workdir", image_workdir or DEFAULT_WORKDIR)
    if not isinstance(workdir, str) or not workdir.startswith("/") or workdir.rstrip("/") == "":
        raise _Refused(f"[environment] workdir must be an absolute path below / (got {workdir!r})")

    healthcheck = None
    if "healthcheck" in env_table:
        healthcheck = _healthcheck(_table(env_table, "healthcheck", where="[environment]"))

    return Task(
        id=path.name,
        name=name,
        path=path.absolute(),
        instruction=instruction,
        docker_image=docker_image.strip() if docker_image else None,
        dockerfile=dockerfile_path.absolute() if has_dockerfile else None,
        cpus=float(cpus),
        memory_mb=memory_mb,
        storage_mb=storage_mb,
        network=_network(env_table, agent),
        agent_timeout_s=agent_timeout,
        verifier_timeout_s=verifier_timeout,
        build_timeout_s=float(build_timeout),
        workdir=workdir.rstrip("/") or "/",
        env=_env(env_table, "[environment.env]"),
        verifier_env=_env(verifier, "[verifier.env]"),
        solution_env=_env(solution, "[solution.env]"),
        agent_user=_user(agent, "[agent]"),
        verifier_user=_user(verifier, "[verifier]"),
        healthcheck=healthcheck,
        has_solution=(path / "solution" / "solve.sh").is_file(),
        skills_dir=env_table.get("skills_dir") if isinstance(env_table.get("skills_dir"), str) else None,
        schema_version=schema,
        metadata=_table(data, "metadata"),
        env_hash=dockerfile.context_hash(env_dir) if has_dockerfile else "",
    )


def _schema_version(data: dict) -> str:
    version = data.get("schema_version", data.get("version", "1.0"))
    if not isinstance(version, str) or not re.fullmatch(r"\d+(\.\d+)*", version):
        raise _Refused(f"schema version {version!r} is not a version string like \"1.1\"")
    if int(version.split(".")[0]) != 1:
        raise _Refused(f"schema version {version} is not supported (rl360 reads Harbor task schema 1.x)",
                       "convert the task to schema 1.x")
    return version


def _refuse_unsupported(path: Path, data: dict, env: dict, agent: dict, verifier: dict) -> None:
    if "steps" in data:
        raise _Refused("multi-step tasks are not supported yet ([[steps]])", "use single-step tasks")
    if str(env.get("os", "linux")).lower() == "windows":
        raise _Refused("Windows tasks need a Windows node, which rl360 does not provide",
                       "use Linux tasks")
    gpus = env.get("gpus", 0)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
        raise _Refused(f"[environment] gpus must be a non-negative integer (got {gpus!r})")
    if gpus > 0:
        raise _Refused(f"GPU tasks are not supported by the sandbox providers yet (gpus = {gpus})",
                       "use CPU tasks")
    if verifier.get("environment_mode", "shared") != "shared" or "environment" in verifier:
        raise _Refused("a separate verifier environment is not supported yet",
                       "let the verifier run in the task's own environment")
    if env.get("mcp_servers"):
        raise _Refused("MCP server sidecars are not supported yet ([[environment.mcp_servers]])")
    for compose in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml"):
        if (path / "environment" / compose).exists():
            raise _Refused(f"multi-container environments (environment/{compose}) are not supported yet")
    for where, table in (("[environment]", env), ("[agent]", agent), ("[verifier]", verifier)):
        if table.get("network_mode") == "allowlist" or table.get("allowed_hosts"):
            raise _Refused(f"{where} network allowlists are not supported yet",
                           'use network_mode = "no-network" or "public"')
        mode = table.get("network_mode")
        if mode is not None and mode not in ("public", "no-network"):
            raise _Refused(f"{where} network_mode {mode!r} is not one of public, no-network, allowlist")


def _table(data: dict, key: str, *, where: str = "") -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise _Refused(f"{where + ' ' if where else ''}[{key}] must be a table (got {type(value).__name__})")
    return value


def _number(table: dict, key: str, default: float, *, where: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Refused(f"{where} {key} must be a number (got {value!r})")
    return value


def _timeout(table: dict, where: str, default: float) -> float:
    value = table.get("timeout_sec")
    if value is None:
        return default
    value = _number(table, "timeout_sec", default, where=where)
    if value <= 0:
        raise _Refused(f"{where} timeout_sec must be positive (got {value:g})")
    return float(value)


def _size_mb(table: dict, key_mb: str, key_legacy: str, default: int) -> int:
    if key_legacy in table and table[key_legacy] is not None:
        return _parse_size(table[key_legacy], key_legacy)
    value = table.get(key_mb, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Refused(f"[environment] {key_mb} must be an integer number of MB (got {value!r})")
    return value


def _parse_size(value: Any, key: str) -> int:
    """Harbor's legacy size strings: "2G", "512M", "1024K" (also "2GB", "2Gi")."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([GMK])(?:i?B|i)?\s*", str(value), re.IGNORECASE) if isinstance(
        value, str) else None
    if m is None:
        raise _Refused(f"[environment] {key} = {value!r} is not a size like \"2G\" or \"512M\"",
                       f"write it as {key}_mb = <MB>")
    number, unit = float(m.group(1)), m.group(2).upper()
    return int(number * {"G": 1024, "M": 1, "K": 1 / 1024}[unit])


def _network(env: dict, agent: dict) -> bool:
    mode = env.get("network_mode")
    if mode is None:
        wants = env.get("allow_internet") is True
    else:
        wants = mode == "public"
    # A phase that asks for less network than the environment gets less: the sandbox has one setting.
    return wants and agent.get("network_mode") != "no-network"


def _env(table: dict, where: str) -> dict[str, str]:
    value = table.get("env", {})
    if not isinstance(value, dict):
        raise _Refused(f"{where} must be a table of strings (got {type(value).__name__})")
    out = {}
    for key, item in value.items():
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise _Refused(f"{where} {key} must be a string (got {item!r})")
        out[str(key)] = str(item)
    return out


def _user(table: dict, where: str) -> str | None:
    value = table.get("user")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _Refused(f"{where} user must be a user name or uid (got {value!r})")
    return str(value)


def _healthcheck(table: dict) -> Healthcheck:
    command = table.get("command")
    if not isinstance(command, str) or not command.strip():
        raise _Refused("[environment.healthcheck] command must be a shell command")
    where = "[environment.healthcheck]"
    retries = table.get("retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
        raise _Refused(f"{where} retries must be a positive integer (got {retries!r})")
    return Healthcheck(
        command=command,
        interval_s=float(_number(table, "interval_sec", 5.0, where=where)),
        timeout_s=float(_number(table, "timeout_sec", 30.0, where=where)),
        start_period_s=float(_number(table, "start_period_sec", 0.0, where=where)),
        retries=retries,
    )


def _repo_name(task_id: str) -> str:
    """A Docker repository path component from a folder name."""
    name = re.sub(r"[^a-z0-9._-]+", "-", task_id.lower()).strip("._-")
    return name or "task"
