"""Reading Harbor-format tasks, unchanged: load one task folder or a task set (a folder of task
folders) into the task model of task.py (`Task`, `Step`).

A task folder holds `task.toml`, `instruction.md`, `environment/Dockerfile` (or
`[environment] docker_image`), `tests/test.sh` and optionally
`solution/solve.sh`. `task.toml` is read as Harbor reads it: any schema version
string (`schema_version`, else `version`; kept, never checked), `[task]`, `[metadata]`, `[verifier]`
(timeout_sec, env, user), `[agent]` (timeout_sec, user), `[solution]` env and
`[environment]` (docker_image, cpus, memory_mb, storage_mb, network_mode or
allow_internet, build_timeout_sec, workdir, env, healthcheck, and the legacy
`memory = "2G"` / `storage = "10G"` strings). Keys rl360 does not use are
ignored, as Harbor ignores them.

Multi-step tasks (`[[steps]]`, each step in `steps/<name>/` with its own
`instruction.md`, optional `tests/` layered over the task's, `solution/solve.sh`
and `workdir/`), a separate verifier environment (`[verifier] environment_mode
= "separate"` or a `[verifier.environment]` table, also per step) and the
`artifacts` (with `[[verifier.collect]]` hooks, read by task_fields.py) are read as
Harbor defines them (see `Step` and `verifier_task`). GPU tasks (`gpus`, `gpu_types`) load and are placed only on
nodes with GPUs; Harbor's sidecars (`environment/docker-compose.yaml`, read by
sidecars.py) start beside the sandbox, and `[[environment.mcp_servers]]` are
told to the agent (`RL360_MCP_SERVERS`). `placement_problem` (steps.py) refuses,
in one line, what no node of a provider can hold.

What rl360 cannot run is refused with a one-line reason rather than run
wrongly: Windows tasks, the parts of compose a sidecar does not need (bind mounts,
published ports, privileges), network allowlists of one phase ([agent], [verifier]).

Refused as unsafe or unusable, also in one line: a folder name other than letters, digits, `.`, `_`
and `-` (it becomes sandbox names, labels and image tags), a symbolic link in `tests/`, `solution/`, `steps/`
or `environment/` that leads outside the task folder (uploading it would hand the sandbox a host
file), and an `instruction.md` over `MAX_INSTRUCTION_BYTES` (it becomes the prompt).

Network: as Harbor reads it (`_network`): a task wants the internet unless it
says `network_mode = "no-network"` or `allow_internet = false`. Where it may go
is the operator's: the profile's `[egress]` (rl360cli/egress/config.py); a task with
`network_mode = "allowlist"` reaches only its `allowed_hosts` of those (the egress proxy
enforces it, so such a task gets the network under `[egress] mode = "allow"` only).

Every refusal is a `TaskError`: one line that names the task, the problem and the fix.

    task = load_task(Path("recipes/tasks/examples/hello-world"))
    tasks = load_task_set(Path("recipes/tasks/examples"), include=("hello-world",))

Test: tests/sandbox/test_task.py (the shipped examples and Harbor's own examples),
tests/sandbox/test_harbor_format.py (steps, separate verifiers, placement).
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from rl360cli.egress.config import host_pattern_problem
from rl360cli.errors import Rl360Error
from rl360cli.sandbox import dockerfile
from rl360cli.sandbox.sidecars import ComposeRefused, Sidecar, VolumeMount, find_compose, load_sidecars, mcp_env
from rl360cli.sandbox.task import (
    DEFAULT_AGENT_TIMEOUT_S,
    DEFAULT_BUILD_TIMEOUT_S,
    DEFAULT_VERIFIER_TIMEOUT_S,
    DEFAULT_WORKDIR,
    REWARD_STRATEGIES,
    Healthcheck,
    PrebuiltFrom,
    Step,
    Task,
)
from rl360cli.sandbox.task_fields import FieldRefused, read_artifacts, read_collect_hooks, read_mcp_servers

# The prompt is the instruction: Harbor's run to a few KB; anything near this is a mistake, not a task.
MAX_INSTRUCTION_BYTES = 1 << 20
_TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Folders uploaded into the sandbox (tests/, solution/) or sent to a build (environment/).
_UPLOADED_FOLDERS = ("tests", "solution", "environment", "steps")


class TaskError(Rl360Error):
    """A task folder that cannot be loaded or run: names the task and the problem."""


def load_task(path: Path | str) -> Task:
    """Load and validate one task folder; `TaskError` names the task and the problem."""
    # `tasks/foo/..` or `.` name the folder they lead to: the id is that folder's real name.
    path = Path(os.path.normpath(Path(path).absolute()))
    label = _printable(path.name or str(path))
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
    except (_Refused, FieldRefused) as e:
        raise TaskError(f"task {label}: {e.problem}", e.fix) from None


def load_task_set(path: Path | str, include: tuple[str, ...] | list[str] = (), *,
                  refused: dict[str, TaskError] | None = None) -> list[Task]:
    """Every task folder in `path` (or `path` itself when it is a task), sorted by id; `include` filters.
    With a `refused` dict, a task that cannot be loaded goes there under its folder name and the others load
    (one bad task of a published dataset never stops the rest); without one, it raises. A set left with no
    task raises."""
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
            raise TaskError(f"task set {path}: no task folder named {', '.join(map(_printable, missing))}",
                            f"use names from: {', '.join(sorted(map(_printable, names))) or '(none)'}")
        folders = [p for p in folders if p.name in include]
    if not folders:
        raise TaskError(f"task set {path}: holds no task folder (none has a task.toml)",
                        "point [tasks] path at a Harbor dataset folder")
    if refused is None:
        return [load_task(p) for p in folders]
    tasks = []
    for folder in folders:
        try:
            tasks.append(load_task(folder))
        except TaskError as e:
            refused[folder.name] = e
    if not tasks:
        first = next(iter(refused.values()))
        raise TaskError(f"task set {path}: none of its {len(folders)} tasks loads ({first.problem})", first.fix)
    return tasks


# ----------------------------------------------------------------------------- building


class _Refused(Exception):
    def __init__(self, problem: str, fix: str | None = None):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def _build(path: Path, data: dict) -> Task:
    if not _TASK_ID.fullmatch(path.name):
        raise _Refused(f"the folder name {path.name!r} cannot name sandboxes, labels and image tags",
                       "rename the folder to letters, digits, '.', '_' and '-' (128 at most, not starting with "
                       "'.', '_' or '-')")
    _refuse_links_out(path)
    schema = _schema_version(data)
    env_table = _table(data, "environment")
    agent = _table(data, "agent")
    verifier = _table(data, "verifier")
    solution = _table(data, "solution")
    _refuse_unsupported(path, data, env_table, agent, verifier)

    info = _table(data, "task")
    name = info.get("name", path.name)
    if not isinstance(name, str) or not name.strip() or not name.isprintable():
        raise _Refused(f"[task] name must be a non-empty string of printable characters (got {name!r:.60})")

    environment = _environment(env_table, "[environment]", path / "environment", agent_table=agent)
    env_dir = path / "environment"
    if environment["docker_image"] and env_dir.is_dir() and not (env_dir / "Dockerfile").exists() \
            and find_compose(env_dir) is None and any(env_dir.iterdir()):
        environment["environment_upload"] = env_dir.absolute()  # Harbor's rule for a prebuilt image's files
    mcp_servers = read_mcp_servers(env_table)
    sidecars: tuple[Sidecar, ...] = ()
    volume_mounts: tuple[VolumeMount, ...] = ()
    compose = find_compose(path / "environment")
    if compose is not None:
        try:
            sidecars, main_env, volume_mounts = load_sidecars(compose, task_root=path)
        except ComposeRefused as e:
            raise _Refused(e.problem, e.fix) from None
        # Harbor merges compose's `main` environment into the sandbox's; task.toml's own wins.
        environment["env"] = {**main_env, **environment["env"]}
    environment["env"] = {**environment["env"], **mcp_env(mcp_servers)}
    agent_timeout = _timeout(agent, "[agent]", DEFAULT_AGENT_TIMEOUT_S)
    verifier_timeout = _timeout(verifier, "[verifier]", DEFAULT_VERIFIER_TIMEOUT_S)
    raw_steps = data.get("steps")
    multi_step = raw_steps is not None

    instruction_path = path / "instruction.md"
    instruction = ""
    if not multi_step or instruction_path.exists():
        # A multi-step task's root instruction.md is optional and never sent (each step has its own).
        instruction = _read_instruction(instruction_path, "instruction.md")
    test_sh = path / "tests" / "test.sh"
    if not multi_step and not test_sh.is_file():
        raise _Refused("no tests/test.sh", "add tests/test.sh: it writes /logs/verifier/reward.txt or reward.json")

    task = Task(
        id=path.name,
        name=name,
        path=path.absolute(),
        instruction=instruction,
        **environment,
        agent_timeout_s=agent_timeout,
        verifier_timeout_s=verifier_timeout,
        verifier_env=_env(verifier, "[verifier.env]"),
        solution_env=_env(solution, "[solution.env]"),
        agent_user=_user(agent, "[agent]"),
        verifier_user=_user(verifier, "[verifier]"),
        has_solution=(path / "solution" / "solve.sh").is_file(),
        skills_dir=env_table.get("skills_dir") if isinstance(env_table.get("skills_dir"), str) else None,
        schema_version=schema,
        metadata=_table(data, "metadata"),
        mcp_servers=mcp_servers,
        sidecars=sidecars,
        volume_mounts=volume_mounts,
        artifacts=read_artifacts(data, "artifacts", services=_names(sidecars)),
        collect=read_collect_hooks(verifier, "[[verifier.collect]]", services=_names(sidecars)),
        reward_strategy=_reward_strategy(data),
    )
    if multi_step:
        steps = _steps(path, task, raw_steps, agent, verifier, env_table)
        return replace(task, steps=steps, instruction=steps[0].instruction,
                       has_solution=task.has_solution or any(s.has_solution for s in steps))
    verifier_task, uploads = _verifier_environment(path, task, verifier, env_table, "[verifier]",
                                                   (path / "tests",))
    return replace(task, verifier_task=verifier_task, verifier_uploads_tests=uploads)


def _environment(table: dict, where: str, env_dir: Path, *, agent_table: dict | None = None) -> dict[str, Any]:
    """The fields of `Task` that an environment table decides: [environment], or [verifier.environment]
    (whose Dockerfile, Harbor's rule, is the one in tests/)."""
    cpus = _number(table, "cpus", 1, where=where)
    if cpus <= 0:
        raise _Refused(f"{where} cpus must be positive (got {cpus:g})")
    memory_mb = _size_mb(table, "memory_mb", "memory", 2048, where=where)
    storage_mb = _size_mb(table, "storage_mb", "storage", 10240, where=where)
    if memory_mb < 16:
        raise _Refused(f"{where} memory must be at least 16 MB (got {memory_mb} MB)")
    if storage_mb < 1:
        raise _Refused(f"{where} storage must be at least 1 MB (got {storage_mb} MB)")
    build_timeout = _number(table, "build_timeout_sec", DEFAULT_BUILD_TIMEOUT_S, where=where)
    if build_timeout <= 0:
        raise _Refused(f"{where} build_timeout_sec must be positive (got {build_timeout:g})")
    docker_image = table.get("docker_image")
    if docker_image is not None and (not isinstance(docker_image, str) or not docker_image.strip()):
        raise _Refused(f"{where} docker_image must be an image reference (got {docker_image!r})")
    dockerfile_path = env_dir / "Dockerfile"
    has_dockerfile = dockerfile_path.is_file() and not docker_image
    if not docker_image and not has_dockerfile and where == "[environment]":
        raise _Refused("no environment/Dockerfile and no [environment] docker_image",
                       "add one of them: the image the sandbox runs")
    image_workdir = None
    if has_dockerfile:
        try:
            image_workdir = dockerfile.last_workdir(dockerfile.parse(dockerfile_path.read_text()))
        except (OSError, UnicodeDecodeError) as e:
            raise _Refused(f"{env_dir.name}/Dockerfile cannot be read ({e})") from None
    workdir = table.get("workdir", image_workdir or DEFAULT_WORKDIR)
    if not isinstance(workdir, str) or not workdir.startswith("/") or workdir.rstrip("/") == "":
        raise _Refused(f"{where} workdir must be an absolute path below / (got {workdir!r})")
    gpus = table.get("gpus", 0)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
        raise _Refused(f"{where} gpus must be a non-negative integer (got {gpus!r})")
    gpu_types = table.get("gpu_types") or ()
    if not isinstance(gpu_types, list | tuple) or not all(isinstance(g, str) for g in gpu_types):
        raise _Refused(f"{where} gpu_types must be a list of GPU names (got {gpu_types!r})")
    healthcheck = None
    if "healthcheck" in table:
        healthcheck = _healthcheck(_table(table, "healthcheck", where=where), f"{where[:-1]}.healthcheck]")
    prebuilt_from = None
    if docker_image and dockerfile_path.is_file():  # what `--force-build` builds instead (task.force_built)
        try:
            last = dockerfile.last_workdir(dockerfile.parse(dockerfile_path.read_text()))
        except (OSError, UnicodeDecodeError) as e:
            raise _Refused(f"{env_dir.name}/Dockerfile cannot be read ({e})") from None
        prebuilt_from = PrebuiltFrom(dockerfile=dockerfile_path.absolute(), env_hash=dockerfile.context_hash(env_dir),
                                     workdir=last)
    return {
        "prebuilt_from": prebuilt_from,
        "docker_image": docker_image.strip() if docker_image else None,
        "dockerfile": dockerfile_path.absolute() if has_dockerfile else None,
        "env_hash": dockerfile.context_hash(env_dir) if has_dockerfile else "",
        "cpus": float(cpus), "memory_mb": memory_mb, "storage_mb": storage_mb,
        "network": _network(table, agent_table or {}),
        "allowed_hosts": _allowed_hosts(table, where),
        "build_timeout_s": float(build_timeout),
        "workdir": workdir.rstrip("/") or "/",
        # No workdir in task.toml: Harbor execs without -w, in the image's own WORKDIR (a Dockerfile's, else
        # its base image's, else /); the docker provider reads it, the others use `workdir`.
        "workdir_from_image": bool(docker_image or has_dockerfile) and "workdir" not in table,
        "env": _env(table, f"{where[:-1]}.env]"),
        "healthcheck": healthcheck,
        "gpus": gpus, "gpu_types": tuple(gpu_types),
    }


def _read_instruction(path: Path, label: str) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_INSTRUCTION_BYTES:
            raise _Refused(f"{label} is {size / 2**20:.1f} MB, over the {MAX_INSTRUCTION_BYTES >> 20} MB an "
                           "instruction may hold (it becomes the prompt)",
                           "shorten it; put data the agent needs in environment/ instead")
        return path.read_text()
    except FileNotFoundError:
        raise _Refused(f"no {label}", f"write the instruction to {label}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise _Refused(f"{label} cannot be read ({e})") from None


def _verifier_environment(path: Path, task: Task, verifier: dict, env_table: dict, where: str,
                          tests_dirs: tuple[Path, ...], *, inherited: tuple[str | None, dict | None] = (None, None)
                          ) -> tuple[Task | None, bool]:
    """The verifier's own sandbox, as Harbor resolves it (its CHANGELOG, "Separate Verifier
    Environments"): `[verifier.environment]` implies "separate"; "shared" with one is invalid;
    "separate" without one starts from the task's [environment]. The verifier image is built from
    tests/ (tests/Dockerfile, whose image holds /tests itself, so nothing is uploaded), else it is
    `docker_image`, else — rl360's fallback where Harbor would have nothing to build — the agent's
    own image, with the tests uploaded as in shared mode. `inherited` is the task-level (mode,
    environment) a step falls back to."""
    mode = verifier.get("environment_mode", inherited[0])
    table = verifier.get("environment", inherited[1])
    if mode is not None and mode not in ("shared", "separate"):
        raise _Refused(f"{where} environment_mode must be \"shared\" or \"separate\" (got {mode!r})")
    if table is not None and not isinstance(table, dict):
        raise _Refused(f"{where} environment must be a table (got {type(table).__name__})")
    if mode == "shared" and table is not None and "environment" in verifier:
        raise _Refused(f"{where} environment_mode = \"shared\" cannot have a {where[:-1]}.environment] table",
                       "drop one of them (Harbor refuses the pair too)")
    if mode == "shared" or (mode is None and table is None):
        return None, True
    env_where = f"{where[:-1]}.environment]"
    if table is not None and table.get("mcp_servers"):
        raise _Refused(f"{env_where} MCP sidecars of a verifier are not supported")
    source = table if table is not None else env_table
    tests_dir = next((d for d in reversed(tests_dirs) if (d / "Dockerfile").is_file()), None)
    fields = _environment(source if table is not None else {**source, "docker_image": None, "workdir":
                          env_table.get("workdir", task.workdir)}, env_where, tests_dir or path / ".no-tests-image")
    uploads = fields["dockerfile"] is None
    if fields["docker_image"] is None and fields["dockerfile"] is None:
        # Nothing in tests/ to build: the agent's own image, handed the tests (rl360's fallback).
        fields.update(docker_image=task.docker_image, dockerfile=task.dockerfile, env_hash=task.env_hash,
                      prebuilt_from=task.prebuilt_from)
        if "workdir" not in source:
            fields.update(workdir=task.workdir, workdir_from_image=task.workdir_from_image)
    fields["healthcheck"] = None
    verifier_task = replace(task, id=f"{task.id}.verifier", name=f"{task.name} (verifier)", **fields,
                            steps=(), verifier_task=None, mcp_servers=(), sidecars=(), volume_mounts=(),
                            environment_upload=None, has_solution=False)
    return verifier_task, uploads


def _steps(path: Path, task: Task, raw: Any, agent: dict, verifier: dict, env_table: dict) -> tuple[Step, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(s, dict) for s in raw):
        raise _Refused("[[steps]] must be a non-empty array of tables")
    steps: list[Step] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw):
        name = entry.get("name")
        where = f"[[steps]] {name!r}" if isinstance(name, str) else f"[[steps]] #{index + 1}"
        if not isinstance(name, str) or not _TASK_ID.fullmatch(name):
            raise _Refused(f"{where} needs a name of letters, digits, '.', '_' and '-' (it is a folder in steps/)")
        if name in seen:
            raise _Refused(f"{where} is declared twice", "give each step its own name")
        seen.add(name)
        folder = path / "steps" / name
        step_agent = _table(entry, "agent", where=where)
        step_verifier = _table(entry, "verifier", where=where)
        tests_dirs = tuple(d for d in (path / "tests", folder / "tests") if d.is_dir())
        if not any((d / "test.sh").is_file() for d in tests_dirs):
            raise _Refused(f"{where} has no test.sh (neither steps/{name}/tests/test.sh nor tests/test.sh)",
                           "add one: it writes /logs/verifier/reward.txt or reward.json")
        verifier_env = {**task.verifier_env, **_env(step_verifier, f"{where} [steps.verifier.env]")}
        healthcheck = None
        if "healthcheck" in entry:
            healthcheck = _healthcheck(_table(entry, "healthcheck", where=where), f"{where} [steps.healthcheck]")
        verifier_task, uploads = _verifier_environment(
            path, task, step_verifier, env_table, f"{where} [steps.verifier]", tests_dirs,
            inherited=(verifier.get("environment_mode"), verifier.get("environment")))
        steps.append(Step(
            name=name, index=index,
            instruction=_read_instruction(folder / "instruction.md", f"steps/{name}/instruction.md"),
            agent_timeout_s=_timeout(step_agent, f"{where} [steps.agent]", task.agent_timeout_s),
            verifier_timeout_s=_timeout(step_verifier, f"{where} [steps.verifier]", task.verifier_timeout_s),
            verifier_env=verifier_env,
            agent_user=_user(step_agent, f"{where} [steps.agent]") or task.agent_user,
            verifier_user=_user(step_verifier, f"{where} [steps.verifier]") or task.verifier_user,
            min_reward=_min_reward(entry, where),
            tests_dirs=tests_dirs,
            solution_dir=folder / "solution" if (folder / "solution" / "solve.sh").is_file() else None,
            workdir_dir=folder / "workdir" if (folder / "workdir").is_dir() else None,
            healthcheck=healthcheck,
            artifacts=task.artifacts + read_artifacts(entry, f"{where} artifacts", services=_names(task.sidecars)),
            collect=task.collect + read_collect_hooks(step_verifier, f"{where} [[steps.verifier.collect]]",
                                                      services=_names(task.sidecars)),
            verifier_task=verifier_task, verifier_uploads_tests=uploads,
        ))
    return tuple(steps)


def _min_reward(entry: dict, where: str) -> float | dict[str, float] | None:
    value = entry.get("min_reward")
    if value is None:
        return None
    if isinstance(value, dict):
        if not value or not all(_is_number(v) for v in value.values()):
            raise _Refused(f"{where} min_reward must be a number or a table of numbers (got {value!r})")
        return {str(k): float(v) for k, v in value.items()}
    if not _is_number(value):
        raise _Refused(f"{where} min_reward must be a number or a table of numbers (got {value!r})")
    return float(value)


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _reward_strategy(data: dict) -> str:
    # The pre-1.3 `multi_step_reward_mode` is accepted and dropped, as Harbor drops it.
    strategy = data.get("multi_step_reward_strategy") or "mean"
    if strategy not in REWARD_STRATEGIES:
        raise _Refused(f"multi_step_reward_strategy must be \"mean\" or \"final\" (got {strategy!r})")
    return strategy


def _names(sidecars: tuple[Sidecar, ...]) -> frozenset[str]:
    return frozenset(s.name for s in sidecars)


def _refuse_links_out(path: Path) -> None:
    """Refuse a symbolic link in the uploaded folders (or one of those folders itself a link) that
    leads outside the task folder, or nowhere: uploading it would copy, or link, a host file into
    the sandbox (a key, the state file, another sandbox's folder)."""
    root = path.resolve()
    for name in _UPLOADED_FOLDERS:
        top = path / name
        links = [top] if top.is_symlink() else []
        if top.is_dir() and not top.is_symlink():
            for folder, dirs, files in os.walk(top, followlinks=False):
                links += [Path(folder) / entry for entry in dirs + files if os.path.islink(Path(folder) / entry)]
        for link in links:
            try:
                target = link.resolve()
            except (OSError, RuntimeError):  # a loop of links (RuntimeError before Python 3.13)
                target = None
            if target is None or not target.is_relative_to(root) or not os.path.exists(target):
                raise _Refused(f"{link.relative_to(path)} is a symbolic link to {os.readlink(link)!r}, "
                               "outside the task folder (or to nothing)",
                               "copy the file into the task folder instead of linking to it")


def _schema_version(data: dict) -> str:
    """Harbor's rule: `schema_version`, else `version`, a string it keeps and never checks ("2.0" loads
    as "1.4" does); only a value that is not a string is refused, as Harbor's model refuses it."""
    version = data.get("schema_version", data.get("version", "1.0"))
    if not isinstance(version, str):
        raise _Refused(f"schema version {version!r} is not a string", f"quote it: version = \"{version}\"")
    return version


def _refuse_unsupported(path: Path, data: dict, env: dict, agent: dict, verifier: dict) -> None:
    if str(env.get("os", "linux")).lower() == "windows":
        raise _Refused("Windows tasks need a Windows node, which rl360 does not provide",
                       "use Linux tasks")
    if env.get("tpu"):
        raise _Refused("TPU tasks need TPU nodes, which rl360 does not provide", "use CPU or GPU tasks")
    if not isinstance(env.get("allow_internet", True), bool):
        raise _Refused(f"[environment] allow_internet must be true or false (got {env['allow_internet']!r})")
    for where, table in (("[agent]", agent), ("[verifier]", verifier)):
        if table.get("network_mode") == "allowlist" or table.get("allowed_hosts"):
            raise _Refused(f"{where} network allowlists are not supported (the sandbox has one network for all its "
                           "phases)", 'put network_mode = "allowlist" and allowed_hosts in [environment]')
    for where, table in (("[environment]", env), ("[agent]", agent), ("[verifier]", verifier)):
        mode = table.get("network_mode")
        if mode is not None and mode not in ("public", "no-network", "allowlist"):
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


def _size_mb(table: dict, key_mb: str, key_legacy: str, default: int, *, where: str = "[environment]") -> int:
    if key_legacy in table and table[key_legacy] is not None:
        return _parse_size(table[key_legacy], key_legacy)
    value = table.get(key_mb, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Refused(f"{where} {key_mb} must be an integer number of MB (got {value!r})")
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
    # Harbor's rule (harbor-framework/harbor, src/harbor/models/task/config.py: `EnvironmentConfig`,
    # `allow_internet: bool = True`, and `resolve_baseline`): network_mode wins; else allow_internet = false is
    # no network; else public. A task that says nothing (harbor-cookbook's simple-task, whose verifier
    # apt-get installs curl and fetches the uv installer) wants the internet.
    mode = env.get("network_mode")
    wants = env.get("allow_internet") is not False if mode is None else mode in ("public", "allowlist")
    # A phase that asks for less network than the environment gets less: the sandbox has one setting.
    return wants and agent.get("network_mode") != "no-network"


def _allowed_hosts(table: dict, where: str) -> tuple[str, ...] | None:
    """Harbor's `network_mode = "allowlist"` with `allowed_hosts`: the task's own host patterns (None without)."""
    hosts = table.get("allowed_hosts")
    if table.get("network_mode") != "allowlist":
        if hosts:
            raise _Refused(f'{where} allowed_hosts needs network_mode = "allowlist"')
        return None
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise _Refused(f'{where} network_mode = "allowlist" needs allowed_hosts, a list of host names',
                       'for example allowed_hosts = ["pypi.org", "*.debian.org"]')
    for host in hosts:
        if problem := host_pattern_problem(host):
            raise _Refused(f"{where} allowed_hosts: {host!r}: {problem}")
    return tuple(hosts)


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


def _healthcheck(table: dict, where: str = "[environment.healthcheck]") -> Healthcheck:
    command = table.get("command")
    if not isinstance(command, str) or not command.strip():
        raise _Refused(f"{where} command must be a shell command")
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


def _printable(name: str) -> str:
    """`name` as it is, or quoted with escapes when it holds a newline or another unprintable
    character (an error stays one line)."""
    return name if name.isprintable() else repr(name)
