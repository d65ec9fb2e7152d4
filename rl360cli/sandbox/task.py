"""The Harbor task model: a task as rl360 runs it, once its folder has been read and validated.

`Task` is one Harbor task (its instruction, image, reservation, network, timeouts, users, env,
healthcheck, GPUs, MCP servers, sidecars, artifacts, collect hooks); `Step` one entry of a multi-step
task, with its folder resolved; `Healthcheck` and `McpServer` the environment's; `Artifact` and
`CollectHook` what is taken from the sandbox after the agent. A separate verifier
environment is itself a `Task` (`verifier_task`, on the task or on a step). Unset values are
Harbor's defaults (`DEFAULT_*`); `network` is whether the task wants the internet, by Harbor's rule
(task_loader.py: public unless it says otherwise); where it may go is the profile's `[egress]`.

`task_loader.py` reads a task folder's `task.toml` into these (`load_task`, `load_task_set`);
the providers, `run_attempt` (attempt.py) and the placement checks (steps.py) read them.
`resolve_env` fills a task's `${VAR}` / `${VAR:-default}` values at run time.

Test: tests/sandbox/test_task.py, tests/sandbox/test_harbor_format.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rl360cli.sandbox.sidecars import Sidecar, VolumeMount

DEFAULT_WORKDIR = "/app"
# Harbor's defaults where task.toml says nothing.
DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
DEFAULT_BUILD_TIMEOUT_S = 600.0
# Harbor's rule for a multi-step task's reward (`multi_step_reward_strategy`); "mean" is its default.
REWARD_STRATEGIES = ("mean", "final")
_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Healthcheck:
    """`[environment.healthcheck]`: a command that must pass before the agent starts."""

    command: str
    interval_s: float = 5.0
    timeout_s: float = 30.0
    start_period_s: float = 0.0
    retries: int = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class McpServer:
    """One `[[environment.mcp_servers]]` entry: a tool server the agent reaches beside its sandbox."""

    name: str
    # Harbor's default; its "http" is read as "streamable-http".
    transport: str = "sse"
    url: str | None = None
    command: str | None = None
    args: tuple[str, ...] = ()
    # HTTP headers (name, value) for the sse / streamable-http transports; a value may hold ${VAR} /
    # ${VAR:-default}, filled on the orchestrator when the sandbox starts (each travels in its own variable,
    # sidecars.mcp_env).
    headers: tuple[tuple[str, str], ...] = ()


# The compose service that is the sandbox itself (Harbor's MAIN_SERVICE_NAME).
MAIN_SERVICE = "main"


@dataclass(frozen=True, kw_only=True, slots=True)
class Artifact:
    """One `artifacts` entry (Harbor's `ArtifactConfig`): a path taken from the agent's sandbox, or from one of
    its sidecars, after the agent; a separate verifier gets it at the same path (artifacts.py)."""

    # The path in the sandbox (or the sidecar): absolute, or relative to / as `docker cp` reads it.
    source: str
    # Where the kept copy goes under the attempt's artifacts folder (None: the source's own path there).
    destination: str | None = None
    # `tar --exclude` patterns applied when the source is a folder.
    exclude: tuple[str, ...] = ()
    # The compose service it is taken from; "main" is the sandbox itself.
    service: str = MAIN_SERVICE


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectHook:
    """One `[[verifier.collect]]` entry (Harbor's `VerifierCollectConfig`): a command run in a service after the
    agent, before the artifacts are taken (a sidecar's database dumped to a file an artifact names)."""

    command: str
    service: str = MAIN_SERVICE
    timeout_s: float = 60.0
    # Who it runs as (None: the service's own user).
    user: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Step:
    """One `[[steps]]` entry of a multi-step task, with its folder `steps/<name>/` resolved.

    Unset values fall back to the task's own ([agent], [verifier]), as in Harbor."""

    name: str
    index: int
    instruction: str
    agent_timeout_s: float
    verifier_timeout_s: float
    verifier_env: dict[str, str] = field(default_factory=dict, hash=False)
    agent_user: str | None = None
    verifier_user: str | None = None
    # The step ends the task when its reward is below this (a number, or a minimum per reward key).
    min_reward: float | dict[str, float] | None = field(default=None, hash=False)
    # Uploaded to /tests in this order before the step's verifier: the task's tests/, then the step's
    # own (same-named files of the step win).
    tests_dirs: tuple[Path, ...] = ()
    solution_dir: Path | None = None
    # steps/<name>/workdir/: uploaded into the task's workdir before the step's agent starts.
    workdir_dir: Path | None = None
    healthcheck: Healthcheck | None = None
    # Taken from the agent's sandbox after the step's agent (the task's, then the step's), handed to a separate
    # verifier; and the hooks run before they are taken (the task's, then the step's).
    artifacts: tuple[Artifact, ...] = ()
    collect: tuple[CollectHook, ...] = ()
    # The verifier's own environment when the step's verifier is separate (None: the agent's sandbox).
    verifier_task: Task | None = field(default=None, compare=False)
    # Whether tests are uploaded into that verifier sandbox (False: its image, built from tests/, holds them).
    verifier_uploads_tests: bool = True

    @property
    def has_solution(self) -> bool:
        return self.solution_dir is not None


@dataclass(frozen=True, kw_only=True, slots=True)
class PrebuiltFrom:
    """The Dockerfile a task's `docker_image` was built from, its context's hash and its last WORKDIR."""

    dockerfile: Path
    env_hash: str
    workdir: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    """One Harbor task, validated; what the providers and `run_attempt` need of it."""

    # The folder name: unique within a task set; used in labels, image tags and the RL loop.
    id: str
    # `[task] name` (e.g. "harbor/hello-world"), else the folder name.
    name: str
    path: Path
    # The prompt: instruction.md; for a multi-step task, the first step's (each later step's is a new turn).
    instruction: str
    # The image to run, when the task names one; else the image built from `dockerfile`.
    docker_image: str | None = None
    dockerfile: Path | None = None
    # Reservation the task asks for (a recipe's [sandbox] cpus / memory_mb override it).
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    # The task wants the internet (Harbor's rule, applied by the loader); the profile's [egress] says where it
    # may go. False for a task made in code.
    network: bool = False
    # Harbor's `network_mode = "allowlist"`: the only hosts the task may reach (patterns as the profile's
    # `[egress] allow`), within what the profile allows; None: no list of its own.
    allowed_hosts: tuple[str, ...] | None = None
    agent_timeout_s: float = DEFAULT_AGENT_TIMEOUT_S
    verifier_timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S
    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S
    # Where the agent's commands and the verifier run: `[environment] workdir`, else the Dockerfile's
    # last WORKDIR, else /app (what a provider that cannot read the image's config uses).
    workdir: str = DEFAULT_WORKDIR
    # No `[environment] workdir` (a `docker_image` or a Dockerfile task): Harbor runs it in the image's own
    # WORKDIR, inherited from its base, else /. A provider that reads the image's config does so (docker:
    # `Sandbox.workdir`); the others (process, daytona), which cannot, use `workdir`.
    workdir_from_image: bool = False
    # A prebuilt `docker_image` with files in environment/ and neither a Dockerfile nor a compose file there:
    # Harbor uploads them into the workdir once the sandbox has started (environments/base.py).
    environment_upload: Path | None = None
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
    # A `docker_image` with the Dockerfile it was built from beside it (environment/Dockerfile): what
    # Harbor's `--force-build` (`[sandbox] force_build`) builds instead of pulling (`force_built`).
    prebuilt_from: PrebuiltFrom | None = None
    # GPUs the sandbox needs (`[environment] gpus`, `gpu_types`); placed only where a node has them.
    gpus: int = 0
    gpu_types: tuple[str, ...] = ()
    mcp_servers: tuple[McpServer, ...] = ()
    # Harbor's sidecar services (environment/docker-compose.yaml), in start order; private to each sandbox.
    sidecars: tuple[Sidecar, ...] = ()
    # `main`'s compose volumes (per sandbox, shared with the sidecars that mount the same name).
    volume_mounts: tuple[VolumeMount, ...] = ()
    # Top-level `artifacts`: taken from the agent's sandbox (and its sidecars) after the agent, handed to a
    # separate verifier; `[[verifier.collect]]`: the hooks run before they are taken.
    artifacts: tuple[Artifact, ...] = ()
    collect: tuple[CollectHook, ...] = ()
    # A multi-step task's steps, in order (empty: a single-step task).
    steps: tuple[Step, ...] = ()
    reward_strategy: str = "mean"
    # A single-step task's separate verifier environment (None: the verifier runs in the agent's sandbox).
    verifier_task: Task | None = field(default=None, compare=False)
    verifier_uploads_tests: bool = True

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


def _repo_name(task_id: str) -> str:
    """A Docker repository path component from a folder name."""
    name = re.sub(r"[^a-z0-9._-]+", "-", task_id.lower()).strip("._-")
    return name or "task"


def force_built(task: Task) -> Task:
    """`task` as Harbor's `--force-build` runs it: a `docker_image` with its Dockerfile beside it is built
    from that Dockerfile (tagged by the context's hash, as any Dockerfile task), not pulled; it runs in the
    built image's WORKDIR unless task.toml names one (docker reads it; the others, the Dockerfile's last
    WORKDIR, else the task's). A task without such a Dockerfile is unchanged, as in Harbor."""
    verifier = force_built(task.verifier_task) if task.verifier_task is not None else None
    if task.prebuilt_from is None:
        return task if verifier is task.verifier_task else replace(task, verifier_task=verifier)
    built = task.prebuilt_from
    workdir = (built.workdir or task.workdir) if task.workdir_from_image else task.workdir
    return replace(task, docker_image=None, dockerfile=built.dockerfile, env_hash=built.env_hash, workdir=workdir,
                   environment_upload=None, prebuilt_from=None, verifier_task=verifier)

