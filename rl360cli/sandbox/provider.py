"""The one async interface every sandbox provider implements, and its result type.

    provider = make_provider(recipe.sandbox, nodes=profile.nodes, run_id="r1")   # rl360cli.sandbox.providers
    sandbox = await provider.start(task, attempt_id="a1", labels={"rl360.run": "r1"})
    result = await sandbox.exec("python3 -m pytest -q", timeout_s=30)
    await sandbox.upload(task.tests_dir, "/tests")
    await sandbox.stop()

Providers: `process` (rl360cli/sandbox/process/provider.py: bubblewrap + rlimits on
this machine) and `docker` (rl360cli/sandbox/docker/provider.py: a container on
a node's daemon). `providers.make_provider` builds the one a recipe names and
wraps it in fault injection (rl360cli/sandbox/faults.py) when
`inject_failure_rate > 0` and in the admission controller
(rl360cli/sandbox/waves.py); each wrapper is a `WrappedProvider`, itself a `SandboxProvider`.

A provider raises `SandboxError` (rl360cli/sandbox/taxonomy.py) for anything
that is not the policy's doing: the image would not pull, the daemon went
away, the container was killed from outside. What the policy's own command
does (exit codes, timeouts, limits) comes back in `ExecResult`.
"""

from __future__ import annotations

import abc
import re
import shlex
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl360cli.egress.client import EgressReport, EgressRoute
from rl360cli.sandbox.task import force_built
from rl360cli.sandbox.taxonomy import Event, SandboxError

if TYPE_CHECKING:
    from rl360cli.sandbox.task import Task

MANAGED_LABEL = "rl360.managed"


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecResult:
    """What one command in a sandbox did."""

    # None when the command was killed at its timeout.
    exit_code: int | None
    # stdout and stderr together, capped at [sandbox] max_output_chars (head and tail kept).
    output: str
    timed_out: bool = False
    # The command (or a process it started) was killed or failed for lack of memory.
    oom_killed: bool = False
    duration_s: float = 0.0
    # The sandbox limit the command hit, if one: "memory", "processes", "file_size", "cpu_time".
    limit: str | None = None
    # Characters cut from the middle of the output.
    truncated_chars: int = 0


def own_command_failed(result: ExecResult, what: str, *, node: str | None) -> SandboxError:
    """The error for one of rl360's own commands in a sandbox (not the agent's) that failed: out of
    memory when the kernel killed it (a tmpfs filled the sandbox's memory), else a provider error."""
    output = " ".join(result.output.split())[:200]
    if result.oom_killed:
        return SandboxError(Event.SANDBOX_OOM, f"{what}: the command was OOM-killed, the sandbox's memory is full "
                                               f"({output or 'no output'})", node=node)
    return SandboxError(Event.PROVIDER_FAILED, f"{what}: {output}", node=node)


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeCapacity:
    """What a node offers sandboxes: the admission controller never reserves more than this."""

    name: str
    cpus: float
    memory_mb: int
    # GPUs a sandbox on it may reserve (0: GPU tasks are refused at placement, see steps.placement_problem).
    gpus: int = 0
    # Their model ("h100"; "" when the profile does not say), matched against a task's gpu_types.
    gpu_type: str = ""


# ----------------------------------------------------------------------------- output


# Signs, in a command's output, that it hit a limit of its sandbox (the process provider has no daemon
# to ask: rlimits make allocations and forks fail instead of killing).
_LIMIT_MARKERS = (
    ("memory", re.compile(rb"MemoryError|Cannot allocate memory|std::bad_alloc|[Oo]ut of memory")),
    ("file_size", re.compile(rb"File too large|File size limit exceeded")),
    ("processes", re.compile(rb"Resource temporarily unavailable|[Cc]an't fork|Cannot fork|can't start new thread")),
    ("cpu_time", re.compile(rb"CPU time limit exceeded")),
)


class OutputBuffer:
    """Collects a command's output up to a cap (keeping head and tail) and notes limit markers on the way."""

    def __init__(self, max_chars: int):
        self.head_max = max_chars // 2
        self.tail_max = max_chars - self.head_max
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.limits: set[str] = set()
        self._overlap = b""

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        window = self._overlap + chunk
        for name, pattern in _LIMIT_MARKERS:
            if name not in self.limits and pattern.search(window):
                self.limits.add(name)
        self._overlap = chunk[-64:]
        self.total += len(chunk)
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.tail_max:
                del self.tail[: len(self.tail) - self.tail_max]

    def text(self) -> tuple[str, int]:
        """(the kept output, characters cut from the middle)."""
        cut = self.total - len(self.head) - len(self.tail)
        if cut <= 0:
            return (bytes(self.head) + bytes(self.tail)).decode(errors="replace"), 0
        middle = f"\n[... {cut} bytes cut ...]\n".encode()
        return (bytes(self.head) + middle + bytes(self.tail)).decode(errors="replace"), cut

    def first_limit(self) -> str | None:
        for name, _ in _LIMIT_MARKERS:
            if name in self.limits:
                return name
        return None


# ----------------------------------------------------------------------------- interface


class Sandbox(abc.ABC):
    """One live sandbox: a container or a private folder with its own limits."""

    id: str
    node: str
    provider: str
    task: Task
    attempt_id: str

    @property
    def workdir(self) -> str:
        """Where its commands run: the task's workdir, or (none in task.toml, `task.workdir_from_image`)
        the image's WORKDIR where the provider reads it."""
        return self.task.workdir

    @abc.abstractmethod
    async def exec(self, command: str, *, timeout_s: float, env: Mapping[str, str] | None = None,
                   user: str | None = None) -> ExecResult:
        """Run `command` with bash (sh where the image has no bash) in the task's workdir."""

    @abc.abstractmethod
    async def upload(self, local_path: Path | str, remote_path: str) -> None:
        """Copy a local file or folder to `remote_path` (an absolute path in the sandbox); what is there under the
        same names is overwritten (a process sandbox replaces the path as a whole)."""

    @abc.abstractmethod
    async def download(self, remote_path: str, local_path: Path | str) -> None:
        """Copy a file or folder out of the sandbox; `SandboxError` when it is not there."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Remove the sandbox and everything running in it; safe to call twice."""

    def info(self) -> dict[str, Any]:
        """The sandbox as the state file records it."""
        return {"node": self.node, "provider": self.provider, "task": self.task.id, "attempt": self.attempt_id}

    def egress_report(self) -> EgressReport | None:
        """What the node's egress proxy counted for this sandbox, once it stopped (None: it went out through no
        proxy)."""
        return None

    # Its agent's door to its own session (rl360cli/egress/door.py): the route of the proxy attached to it and
    # its name there, set by a provider that gave it one (rl360cli/sandbox/network.py, `Network.door`).
    door_route: EgressRoute | None = None
    door_id: str = ""

    async def open_door(self, upstream: str, key: str) -> dict[str, str] | None:
        """Open the sandbox's door onto `upstream` (its session's prefix on its actor's endpoint) and return the
        environment that points an agent inside at it (OPENAI_BASE_URL, ANTHROPIC_BASE_URL and their key `key`);
        None when its provider gave it no door. `EgressUnavailable` when the proxy did not open it."""
        if self.door_route is None:
            return None
        await self.door_route.open_door(self.door_id, upstream)
        return self.door_route.door_env(key)

    async def read_file(self, remote_path: str, *, max_bytes: int = 1 << 20) -> bytes | None:
        """The file's content (at most `max_bytes`), or None when there is no such file."""
        with tempfile.TemporaryDirectory(prefix="rl360-read-") as tmp:
            local = Path(tmp) / "file"
            try:
                await self.download(remote_path, local)
            except SandboxError as e:
                if e.event == Event.PROVIDER_FAILED and "no such" in e.detail:
                    return None
                raise
            if not local.is_file():
                return None
            with open(local, "rb") as f:
                return f.read(max_bytes)

    async def reset_dir(self, remote_path: str) -> None:
        """Make `remote_path` an empty folder (before the verifier: nothing the agent left in it counts)."""
        result = await self.exec(f"rm -rf {_quote(remote_path)} && mkdir -p {_quote(remote_path)}",
                                 timeout_s=60, user="root")
        if result.exit_code != 0:
            raise own_command_failed(result, f"cannot reset {remote_path}", node=self.node)

    async def end_agent_processes(self) -> None:
        """Stop whatever the agent left running, so it cannot touch the verifier's files."""

    async def service_exec(self, service: str, command: str, *, timeout_s: float,
                           user: str | None = None) -> ExecResult:
        """Run `command` with sh in one of its sidecars (Harbor's collect hooks), as `user` (None: the
        sidecar's own). A provider whose `supports_service_ops` is False cannot: `SandboxError`."""
        raise SandboxError(Event.PROVIDER_FAILED, f"the {self.provider} provider cannot run commands in sidecar "
                           f"{service!r}", node=self.node)

    async def service_download(self, service: str, remote_path: str, local_path: Path | str) -> None:
        """Copy a file or folder out of one of its sidecars (Harbor's artifacts of a service); `SandboxError`
        when it is not there, or where the provider cannot."""
        raise SandboxError(Event.PROVIDER_FAILED, f"the {self.provider} provider cannot copy files out of sidecar "
                           f"{service!r}", node=self.node)

    async def prepare_verifier(self) -> None:
        """Before the tests are uploaded: no agent process left, empty /tests and /logs/verifier."""
        await self.end_agent_processes()
        await self.reset_dir("/logs/verifier")
        await self.reset_dir("/tests")


class SandboxProvider(abc.ABC):
    """Starts sandboxes for tasks on nodes."""

    name: str
    # Whether it starts Harbor's sidecar services beside a sandbox (task.sidecars); wrappers copy it.
    supports_sidecars: bool = False
    # Whether its sandboxes run commands in, and copy files out of, their sidecars (`Sandbox.service_exec`,
    # `service_download`: Harbor's collect hooks and artifacts of a service); wrappers copy it.
    supports_service_ops: bool = False

    @abc.abstractmethod
    def nodes(self) -> list[NodeCapacity]:
        """Where this provider can place sandboxes."""

    @abc.abstractmethod
    async def start(self, task: Task, *, attempt_id: str, labels: Mapping[str, str],
                    node: str | None = None) -> Sandbox:
        """Start a sandbox for `task` (on `node`, or the provider's choice); `SandboxError` when it cannot."""

    async def detach(self, sandbox: Sandbox) -> dict[str, Any]:
        """Let the sandbox outlive this process (a fleet); returns what the state file must record to stop it."""
        return sandbox.info()

    async def close(self) -> None:
        """Release connections and threads; live sandboxes are not touched."""

    def expect(self, task: Task, count: int) -> None:
        """`count` sessions of `task` are about to start (a group arrived): a provider that starts
        sandboxes ahead of demand sizes its warm pool by it; others ignore it."""

    def pooled_nodes(self, task: Task) -> set[str]:
        """The nodes where a start of `task` now finds a sandbox ready or being made ahead of it (a warm
        pool), which placement prefers; empty from a provider that keeps none."""
        return set()

    def pull_load(self) -> tuple[int, int] | None:
        """(image pulls in flight now, the most this provider runs at once), for each step's figures;
        None from a provider that does not say."""
        return None

    def image_ref(self, task: Task) -> str:
        """What a node's image cache must hold for a warm start of `task`."""
        return self.as_started(task).image_ref

    def as_started(self, task: Task) -> Task:
        """`task` as this provider starts it: under `[sandbox] force_build`, built from the Dockerfile its
        `docker_image` came from (Harbor's `--force-build`, `force_built`), else as it is."""
        return force_built(task) if getattr(getattr(self, "config", None), "force_build", False) else task

    def reservation(self, task: Task) -> tuple[float, int]:
        """(CPUs, memory MB) a sandbox of `task` gets: the recipe's [sandbox] override, else the task's own."""
        config = getattr(self, "config", None)
        return ((getattr(config, "cpus", None) or task.cpus), (getattr(config, "memory_mb", None) or task.memory_mb))

    def footprint(self, task: Task) -> tuple[float, int]:
        """(CPUs, memory MB) a sandbox of `task` holds on its node, sidecars included: each sidecar runs
        under the sandbox's own limits (`reservation`), so each counts once more."""
        cpus, memory_mb = self.reservation(task)
        copies = containers_of(task)
        return cpus * copies, memory_mb * copies


class WrappedSandbox(Sandbox):
    """A sandbox that adds one behaviour to another and hands every other call through to it."""

    def __init__(self, inner: Sandbox):
        self.inner = inner
        self.id, self.node, self.provider = inner.id, inner.node, inner.provider
        self.task, self.attempt_id = inner.task, inner.attempt_id

    @property
    def workdir(self) -> str:
        return self.inner.workdir

    async def exec(self, command: str, *, timeout_s: float, env: Mapping[str, str] | None = None,
                   user: str | None = None) -> ExecResult:
        return await self.inner.exec(command, timeout_s=timeout_s, env=env, user=user)

    async def upload(self, local_path, remote_path):
        await self.inner.upload(local_path, remote_path)

    async def download(self, remote_path, local_path):
        await self.inner.download(remote_path, local_path)

    async def read_file(self, remote_path, *, max_bytes=1 << 20):
        return await self.inner.read_file(remote_path, max_bytes=max_bytes)

    async def reset_dir(self, remote_path):
        await self.inner.reset_dir(remote_path)

    async def end_agent_processes(self):
        await self.inner.end_agent_processes()

    async def service_exec(self, service, command, *, timeout_s, user=None):
        return await self.inner.service_exec(service, command, timeout_s=timeout_s, user=user)

    async def service_download(self, service, remote_path, local_path):
        await self.inner.service_download(service, remote_path, local_path)

    async def prepare_verifier(self):
        await self.inner.prepare_verifier()

    async def stop(self):
        await self.inner.stop()

    def info(self):
        return self.inner.info()

    def egress_report(self):
        return self.inner.egress_report()

    async def open_door(self, upstream: str, key: str) -> dict[str, str] | None:
        return await self.inner.open_door(upstream, key)


class WrappedProvider(SandboxProvider):
    """A provider that adds one behaviour to another (fault injection, admission waves) and hands every
    other call through to it; a subclass writes `start` (and `detach`, to unwrap its own sandboxes)."""

    def __init__(self, inner: SandboxProvider):
        self.inner = inner
        self.name = inner.name
        self.supports_sidecars = inner.supports_sidecars
        self.supports_service_ops = inner.supports_service_ops

    def nodes(self) -> list[NodeCapacity]:
        return self.inner.nodes()

    def image_ref(self, task: Task) -> str:
        return self.inner.image_ref(task)

    def reservation(self, task: Task) -> tuple[float, int]:
        """What the inner provider gives a sandbox (its config is the truth, not the wrapper's)."""
        return self.inner.reservation(task)

    def expect(self, task: Task, count: int) -> None:
        self.inner.expect(task, count)

    def pooled_nodes(self, task: Task) -> set[str]:
        return self.inner.pooled_nodes(task)

    def pull_load(self) -> tuple[int, int] | None:
        return self.inner.pull_load()

    async def close(self) -> None:
        await self.inner.close()


def containers_of(task: Task) -> int:
    """Containers (or process groups) a sandbox of `task` runs on its node under its limits: itself and
    each sidecar."""
    return 1 + len(getattr(task, "sidecars", ()))


def sandbox_labels(labels: Mapping[str, str], *, run_id: str, task: Task, attempt_id: str) -> dict[str, str]:
    """The caller's labels completed with the managed marker, run, task and attempt."""
    out = {str(k): str(v) for k, v in labels.items()}
    out[MANAGED_LABEL] = "true"
    out.setdefault("rl360.run", run_id or "none")
    out["rl360.task"] = task.id
    out["rl360.attempt"] = attempt_id
    return out


def _quote(path: str) -> str:
    return shlex.quote(path)

