"""The `docker` provider: a sandbox is a container on a node's Docker daemon, through the docker SDK.

The image is the task's `docker_image` (pulled once per node, at most
`max_concurrent_pulls` pulls in flight across all nodes) or built once per
node from `environment/Dockerfile` under the content-hash tag
`rl360-task/<task>:<hash>`. The container gets `--cpus`, `--memory` (no swap)
and `--pids-limit` from the reservation, `fsize`/`nofile` ulimits, no network
unless the task asks for one (and the node has a bridge), no-new-privileges,
every capability dropped but `CAP_ADD`, a read-only root when it has no network
and `[sandbox] read_only_root` (volumes and tmpfs for the paths it writes:
`read_only_volumes`), and the labels
`rl360.managed=true`, `rl360.run`, `rl360.task`, `rl360.attempt`, so that the
janitor finds everything a run made even after the orchestrator crashed.

With `[sandbox.warm_pool] size` > 0, each node keeps up to that many idle containers per creation spec
started ahead of demand (rl360cli/sandbox/warm_pool.py), no more of a task than the starts the session
actor said are coming (`expect`), so a start is a lookup; a pooled container
carries the label `rl360.attempt=warm-pool` and serves one attempt only. `stop` returns once the
removal is sent to the provider's threads; `close` waits for every removal it sent (and the janitor
removes by label whatever a crashed orchestrator left).

Commands run with `docker exec` (bash when the image has it, else sh). At a
command's timeout every process in the container but its init is killed.
An OOM kill of a command is read from the daemon's `oom` events; a container
that dies, or a daemon that stops answering, mid-attempt is a `SandboxError`
(`sandbox_killed` / `node_unreachable`).

Heavy import (the docker SDK): loaded only by make_provider.
Test: tests/sandbox/test_docker_provider.py (the dev Docker nodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import logging
import posixpath
import re
import shlex
import tarfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import requests.exceptions

from rl360cli.errors import Rl360Error
from rl360cli.images.config import RegistrySpec
from rl360cli.images.mirrors import MirrorRefused, rewrite_dockerfile, through_mirrors
from rl360cli.sandbox.config import SandboxConfig
from rl360cli.sandbox.docker_sidecars import DockerSidecars
from rl360cli.sandbox.provider import ExecResult, NodeCapacity, OutputBuffer, Sandbox, SandboxProvider, \
    containers_of, own_command_failed, sandbox_labels
from rl360cli.sandbox.task import resolve_env
from rl360cli.sandbox.taxonomy import Event, SandboxError
from rl360cli.sandbox.warm_pool import PoolStats, WarmPool

if TYPE_CHECKING:
    from rl360cli.nodes.config import NodeSpec

log = logging.getLogger(__name__)

# The container's init (PID 1, so `kill -9 -1` from a command spares it) never forks, so that processes
# holding every pid of the limit cannot end it (a shell that cannot fork exits: a model failure would be
# masked as a lost sandbox). It blocks reading its stdin (kept open, never written), exits on SIGTERM,
# kills every other process itself on SIGUSR1 (an exec that would do it cannot start while the pids are
# full), and ignores SIGCHLD, so the agent's orphans, which come to it, are reaped by the kernel.
KEEPALIVE = "trap '' CHLD; trap 'exit 0' TERM; trap 'kill -9 -1' USR1; while :; do read -r _; done"
# The init runs as root and first makes the folders Harbor's verifier and agents expect (cheaper than a
# put_archive before the start, which mounts the container's filesystem: ~70 ms of a ~300 ms start).
INIT = ("mkdir -p /tests /logs/verifier /logs/agent && chmod 777 /logs /logs/verifier /logs/agent; "
        "touch /run/rl360-ready 2>/dev/null || touch /tmp/rl360-ready; " + KEEPALIVE)
# Every command first waits for the init to have made them (two `test`s once it has).
AWAIT_INIT = "while [ ! -e /run/rl360-ready ] && [ ! -e /tmp/rl360-ready ]; do sleep 0.01; done; "
SHELL = ["/bin/sh", "-c", 'if [ -x /bin/bash ]; then exec /bin/bash -c "$1"; else exec /bin/sh -c "$1"; fi', "sh"]
KILL_ALL = "kill -9 -1 2>/dev/null; true"
# How long a command waits for a container paused from outside to go on, before it is a provider error.
PAUSE_WAIT_S = 30.0
# A command SIGKILLed by no OOM: how long its container gets to show it was killed from outside.
KILL_SETTLE_S = 0.5


def reset_command(path: str) -> str:
    """Shell that leaves `path` an empty folder: removed and made again, or (a mount point of a read-only
    root, which cannot be removed) emptied; fails, saying why, when something is left in it. A folder
    under /logs is made writable by all again, as the init made it: the verifier may be another user."""
    q = shlex.quote(path)
    mode = f" && chmod 777 {q}" if _within(posixpath.normpath(path), "/logs") else ""
    return (f"rm -rf {q} 2>/dev/null; mkdir -p {q} && rm -rf {q}/* {q}/.[!.]* {q}/..?* && [ ! -L {q} ] && "
            f'[ -z "$(ls -A {q})" ]{mode}')


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


PREPARE_VERIFIER = f"kill -9 -1 2>/dev/null; {reset_command('/tests')} && {reset_command('/logs/verifier')}"
# Capabilities: all dropped, then these added back for the root that the init and rl360's own execs run
# as, next to an agent that may be another user (the image's USER, a step's `user`). Measured
# (docs/sandboxes.md): the shipped tasks need none, as root there owns everything it touches; an agent of
# another user needs KILL (`kill -9 -1` before the verifier leaves its processes running without it) and
# DAC_OVERRIDE (emptying the 0700 folders it left in /logs, /tests fails without it).
CAP_ADD = ("DAC_OVERRIDE", "KILL")
# And where the root is writable (a network task, which may install packages): apt-get drops to its
# `_apt` user (setgroups: SETGID, SETUID) and dpkg gives the files it unpacks their owners (CHOWN, FOWNER).
# Never: NET_RAW (raw sockets: spoofing on a bridge), MKNOD, SETFCAP, SETPCAP, SYS_CHROOT,
# NET_BIND_SERVICE, AUDIT_WRITE, FSETID of Docker's default set.
PACKAGE_CAPS = ("CHOWN", "FOWNER", "SETGID", "SETUID")
# A read-only root's writable paths: volumes, which Docker fills with what the image holds there (a
# Dockerfile's COPY into /app survives), and tmpfs (empty, counted against the memory limit, and out of
# reach of the daemon's archive calls: nothing is uploaded to or read from them).
VOLUME_PATHS = ("/tests", "/logs", "/solution")
TMPFS_PATHS = ("/tmp", "/run")
SYSTEM_FOLDERS = frozenset({"usr", "etc", "bin", "sbin", "lib", "lib64", "var", "proc", "sys", "dev"})
_NOT_FOUND = re.compile(r"not found|manifest unknown|repository does not exist|pull access denied|"
                        r"no such image|name unknown", re.IGNORECASE)


POOL_ATTEMPT = "warm-pool"


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """Everything a container is created with but its name: containers of one spec are interchangeable."""

    image: str
    cpus: float
    memory_mb: int
    network: str
    network_denied: bool
    workdir: str
    env: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]
    file_bytes: int
    # Read-only root: the volumes (workdir, /tests, /logs, /solution) and tmpfs paths it writes to;
    # () for a writable root.
    volumes: tuple[str, ...] = ()
    tmpfs: tuple[str, ...] = ()
    # The node's GPUs (device indices) the container reserves: `--gpus '"device=0,1"'`.
    gpus: tuple[str, ...] = ()


class DockerProvider(SandboxProvider):
    name = "docker"
    supports_sidecars = True

    def __init__(self, nodes: Sequence[NodeSpec], *, config: SandboxConfig, run_id: str = "",
                 registry: RegistrySpec | None = None, share: tuple[int, int] = (0, 1)):
        if not nodes:
            raise Rl360Error("the docker provider needs nodes, and the cluster profile lists none",
                             "add [[nodes]] to the profile, e.g. --profile cluster/dev-docker.toml")
        self.specs = {n.name: n for n in nodes}
        self.config = config
        self.run_id = run_id
        # The pull cap, and the mirrors every image reference goes through (rl360cli/images/mirrors.py).
        # The cap is the registry's, so each of `share[1]` session actors (each with a provider of its
        # own) takes its slice: together they stay within it (with more actors than the cap allows,
        # one pull each).
        self.registry = registry or RegistrySpec()
        self.max_concurrent_pulls = max(1, self.registry.max_concurrent_pulls // max(1, share[1]))
        self.pulls_in_flight = 0
        self._executor = ThreadPoolExecutor(max_workers=min(512, 2 * config.max_concurrent + 16),
                                            thread_name_prefix="rl360-docker")
        self._clients: dict[tuple[str, str], Any] = {}
        self._clients_lock = threading.Lock()
        self._clock_offset: dict[str, float] = {}
        self._has_bridge: dict[str, bool] = {}
        self._image_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._pulls: asyncio.Semaphore | None = None
        self._next = 0
        # (node, image ref) -> image id, learned from inspects, pulls and builds.
        self.images: dict[tuple[str, str], str] = {}
        self.image_users: dict[tuple[str, str], str] = {}
        self.pulls = 0
        self.builds = 0
        # The reservations of the live sandboxes on each node (CPUs, MB), which the warm pool must leave be.
        self._reserved: dict[str, list[float]] = {name: [0.0, 0] for name in self.specs}
        # The GPU indices live sandboxes hold on each node: a start takes free ones (a count alone would
        # give every container the node's first GPUs).
        self._gpus_held: dict[str, set[int]] = {name: set() for name in self.specs}
        self._removals: set[Future] = set()
        self._in_flight: set[Future] = set()
        self.pool = WarmPool(size=config.warm_pool.size, make=self._make_pooled, discard=self._discard,
                             cost=lambda spec: (spec.cpus, spec.memory_mb), free=self._free)

    def nodes(self) -> list[NodeCapacity]:
        return [NodeCapacity(name=n.name, cpus=n.cpus, memory_mb=n.memory_mb, gpus=n.gpus, gpu_type=n.gpu_type)
                for n in self.specs.values()]

    # ------------------------------------------------------------------ plumbing

    async def call(self, fn, *args, **kwargs):
        """Run a blocking SDK call on the provider's own threads (the default pool is tiny on 2 cores)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def api(self, node: str, *, stream: bool = False):
        """The node's low-level client; `stream` ones have no read timeout (long silent commands)."""
        key = (node, "stream" if stream else "control")
        with self._clients_lock:
            client = self._clients.get(key)
        if client is not None:
            return client
        spec = self.specs[node]
        timeout = None if stream else 60
        try:
            if spec.docker_host.startswith("ssh://"):
                from rl360cli.nodes.docker_runtime import docker_client

                client = docker_client(spec, timeout_s=timeout or 3600).api
            else:
                client = docker.APIClient(base_url=spec.docker_host, version="auto", timeout=timeout,
                                          max_pool_size=self.config.max_concurrent + 8)
        except Exception as e:  # noqa: BLE001 — every way of not reaching a daemon is a lost node here
            raise _node_lost(node, e) from None
        with self._clients_lock:
            self._clients.setdefault(key, client)
            return self._clients[key]

    def _node_facts(self, node: str) -> None:
        """Once per node: the daemon's clock offset (for its event times) and whether it has a bridge."""
        if node in self._clock_offset:
            return
        api = self.api(node)
        stamp = api.info().get("SystemTime", "")
        offset = 0.0
        with contextlib.suppress(ValueError):
            offset = _parse_time(stamp) - time.time()
        self._has_bridge[node] = bool(api.networks(names=["bridge"]))
        self._clock_offset[node] = offset

    def failure(self, node: str, error: BaseException, event: Event, what: str) -> SandboxError:
        """`error` of a call to `node`'s daemon as the attempt sees it (a lost node, or `event`)."""
        return _error(node, error, event, what)

    async def ping(self, node: str) -> bool:
        try:
            await asyncio.wait_for(self.call(lambda: self.api(node).ping()), 5)
            return True
        except Exception:  # noqa: BLE001
            return False

    # ------------------------------------------------------------------ images

    def image_ref(self, task) -> str:
        """What the node must hold: the task's image through the profile's mirrors (a build's own tag as is).
        A reference the mirrors refuse is answered as written here (placement only reads it); its start fails."""
        with contextlib.suppress(MirrorRefused):
            return self._mirrored(task)
        return task.image_ref

    def _mirrored(self, task) -> str:
        return through_mirrors(task.image_ref, self.registry) if task.docker_image else task.image_ref

    async def ensure_image(self, node: str, task) -> tuple[str, bool]:
        """(image ref on the node, whether it was there already): pulled or built once per node."""
        try:
            ref = self._mirrored(task)
        except MirrorRefused as e:
            raise SandboxError(Event.IMAGE_NOT_FOUND, f"task {task.id}: {e}", node=node) from None
        lock = self._image_locks.setdefault((node, ref), asyncio.Lock())
        async with lock:
            if (node, ref) in self.images:  # seen on this node by this provider: no round trip
                return ref, True
            image_id = await self._inspect_image(node, ref)
            if image_id is not None:
                self.images[(node, ref)] = image_id
                return ref, True
            if task.docker_image:
                await self._pull(node, ref)
            else:
                await self._build(node, task, ref)
            image_id = await self._inspect_image(node, ref)
            if image_id is None:
                raise SandboxError(Event.IMAGE_PULL_FAILED, f"{ref} is not on {node} after its pull/build", node=node)
            self.images[(node, ref)] = image_id
            return ref, False

    async def _inspect_image(self, node: str, ref: str) -> str | None:
        try:
            attrs = await self.call(lambda: self.api(node).inspect_image(ref))
            # Commands run as the image's USER (the container itself is created as root, for its init).
            self.image_users[(node, ref)] = (attrs.get("Config") or {}).get("User") or ""
            return attrs["Id"]
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.NotFound:
            return None
        except SandboxError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _error(node, e, Event.PROVIDER_FAILED, f"inspect image {ref}") from None

    async def _pull(self, node: str, ref: str) -> None:
        if self._pulls is None:
            self._pulls = asyncio.Semaphore(self.max_concurrent_pulls)
        repo, tag = docker.utils.parse_repository_tag(ref)

        def pull() -> None:
            for line in self.api(node, stream=True).pull(repo, tag=tag or "latest", stream=True, decode=True):
                if isinstance(line, dict) and line.get("error"):
                    message = (line.get("errorDetail") or {}).get("message") or line["error"]
                    raise _PullError(message)

        async with self._pulls:
            self.pulls_in_flight += 1
            try:
                await asyncio.wait_for(self.call(pull), self.config.pull_timeout_s)
                self.pulls += 1
            except TimeoutError:
                raise SandboxError(Event.START_TIMEOUT, f"pull of {ref} on {node} took over "
                                   f"{self.config.pull_timeout_s:g}s", node=node) from None
            except (_PullError, docker.errors.APIError) as e:
                message = str(e)
                event = Event.IMAGE_NOT_FOUND if _NOT_FOUND.search(message) else Event.IMAGE_PULL_FAILED
                if isinstance(e, docker.errors.APIError) and _is_connection(e):
                    raise _node_lost(node, e) from None
                raise SandboxError(event, f"pull of {ref} on {node}: {_one_line(message)}", node=node) from None
            except SandboxError:
                raise
            except Exception as e:  # noqa: BLE001
                raise _error(node, e, Event.IMAGE_PULL_FAILED, f"pull {ref}") from None
            finally:
                self.pulls_in_flight -= 1

    def expect(self, task, count: int) -> None:
        self.pool.expect(task.id, count)

    def pooled_nodes(self, task) -> set[str]:
        return self.pool.nodes_holding(task.id)

    def pull_load(self) -> tuple[int, int] | None:
        return self.pulls_in_flight, self.max_concurrent_pulls

    async def _build(self, node: str, task, ref: str) -> None:
        context = task.dockerfile.parent
        try:
            dockerfile = task.dockerfile.read_text()
            mirrored = rewrite_dockerfile(dockerfile, self.registry)
        except MirrorRefused as e:
            raise SandboxError(Event.IMAGE_BUILD_FAILED, f"task {task.id}: {e}", node=node) from None
        # With its FROM lines rewritten the context travels as a tar holding the rewritten Dockerfile.
        where = ({"path": str(context)} if mirrored == dockerfile else
                 {"fileobj": _context_tar(context, task.dockerfile.name, mirrored), "custom_context": True,
                  "dockerfile": task.dockerfile.name})

        def build() -> None:
            stream = self.api(node, stream=True).build(
                **where, tag=ref, rm=True, forcerm=True, pull=False, decode=True, network_mode="none",
                labels={"rl360.task": task.id})
            for line in stream:
                if isinstance(line, dict) and line.get("error"):
                    raise _PullError((line.get("errorDetail") or {}).get("message") or line["error"])

        try:
            await asyncio.wait_for(self.call(build), task.build_timeout_s)
            self.builds += 1
        except TimeoutError:
            raise SandboxError(Event.IMAGE_BUILD_FAILED, f"build of {ref} on {node} ran past build_timeout_sec "
                               f"({task.build_timeout_s:g}s)", node=node) from None
        except (_PullError, docker.errors.BuildError, docker.errors.APIError) as e:
            if isinstance(e, docker.errors.APIError) and _is_connection(e):
                raise _node_lost(node, e) from None
            raise SandboxError(Event.IMAGE_BUILD_FAILED, f"build of task {task.id} on {node}: "
                               f"{_one_line(str(e))}", node=node) from None
        except SandboxError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _error(node, e, Event.IMAGE_BUILD_FAILED, f"build {ref}") from None

    # ------------------------------------------------------------------ start

    def _pick(self) -> str:
        names = list(self.specs)
        node = names[self._next % len(names)]
        self._next += 1
        return node

    async def start(self, task, *, attempt_id: str, labels: Mapping[str, str], node: str | None = None) -> Sandbox:
        node = node or self._pick()
        if node not in self.specs:
            raise Rl360Error(f"node '{node}' is not one of the docker provider's nodes ({', '.join(self.specs)})")
        began = time.monotonic()
        try:
            await self.call(self._node_facts, node)
        except SandboxError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _node_lost(node, e) from None
        ref, warm = await self.ensure_image(node, task)
        try:
            env = resolve_env(task.env)
        except KeyError as e:
            raise SandboxError(Event.START_FAILED, f"[environment.env] needs ${{{e.args[0]}}}, which is not set",
                               node=node) from None
        sidecars = None
        if task.sidecars:
            # One private network per sandbox, its sidecars on it by name (docker_sidecars.py).
            outbound = task.network and self.config.network == "task" and bool(self._has_bridge.get(node))
            sidecars = DockerSidecars(self, node, task, sandbox_labels(labels, run_id=self.run_id, task=task,
                                                                       attempt_id=attempt_id), outbound=outbound)
        spec = self._container_spec(node, task, ref, env, labels, sidecars=sidecars,
                                    gpus=self._take_gpus(node, task.gpus))
        # Before the pool looks at the node: its refill must count this sandbox (and its sidecars).
        self._reserve(node, spec, +containers_of(task))
        pooled = None
        try:
            if sidecars is not None:
                cpus, memory_mb = self.reservation(task)
                await sidecars.start(cpus=cpus, memory_mb=memory_mb)
            # A sandbox with sidecars or GPUs is one of a kind (its own network, its own devices): never pooled.
            if sidecars is None and not spec.gpus:
                pooled = await self.pool.take(node, spec, key=task.id)
            if pooled is not None:
                _, cid, name = pooled
            else:
                await self.pool.make_room(node)
                cid, name = await self._create(node, spec, attempt_id,
                                               networking=sidecars.main_networking() if sidecars else None)
        except BaseException:
            self._reserve(node, spec, -containers_of(task))
            self._gpus_held[node].difference_update(int(g) for g in spec.gpus)
            if sidecars is not None:
                await asyncio.shield(self.call(sidecars.remove_blocking))
            raise
        return DockerSandbox(self, task, spec, node=node, container_id=cid, name=name, image=ref, warm=warm,
                             attempt_id=attempt_id, created=time.time() + self._clock_offset.get(node, 0.0) - 1.0,
                             network=spec.network, network_denied=spec.network_denied,
                             pool_hit=pooled is not None, start_s=time.monotonic() - began, sidecars=sidecars)

    def _take_gpus(self, node: str, count: int) -> tuple[str, ...]:
        """`count` of the node's GPU indices that no live sandbox holds (the admission controller has
        counted them; this picks which)."""
        if not count:
            return ()
        held = self._gpus_held[node]
        free = [i for i in range(self.specs[node].gpus) if i not in held]
        if len(free) < count:
            raise SandboxError(Event.START_FAILED, f"node {node} has {len(free)} free GPU(s) of "
                               f"{self.specs[node].gpus}, the task needs {count}", node=node)
        held.update(free[:count])
        return tuple(str(i) for i in free[:count])

    def _container_spec(self, node: str, task, ref: str, env: dict[str, str], labels: Mapping[str, str], *,
                        sidecars: DockerSidecars | None = None, gpus: tuple[str, ...] = ()) -> ContainerSpec:
        cpus, memory_mb = self.reservation(task)
        network_wanted = task.network and self.config.network == "task"
        network = "bridge" if network_wanted and self._has_bridge.get(node) else "none"
        read_only_ok = network == "none"  # a sandbox that may install packages needs a writable root
        if sidecars is not None:
            network, read_only_ok = sidecars.network, not sidecars.outbound
        # The attempt is not part of the spec: any attempt of the same task may take a pooled container.
        all_labels = sandbox_labels(labels, run_id=self.run_id, task=task, attempt_id=POOL_ATTEMPT)
        volumes = read_only_volumes(task) if self.config.read_only_root and read_only_ok else None
        return ContainerSpec(image=ref, cpus=cpus, memory_mb=memory_mb, network=network, gpus=gpus,
                             network_denied=network_wanted and (network == "none" or (sidecars is not None
                                                                                     and not sidecars.outbound)),
                             workdir=task.workdir,
                             env=tuple(sorted(env.items())), labels=tuple(sorted(all_labels.items())),
                             file_bytes=min(self.config.max_file_mb, task.storage_mb) << 20,
                             volumes=volumes or (), tmpfs=TMPFS_PATHS if volumes else ())

    async def _create(self, node: str, spec: ContainerSpec, attempt_id: str, *,
                      networking: dict | None = None) -> tuple[str, str]:
        """Create and start one container within the start timeout; (id, name)."""
        name = _container_name(self.run_id, attempt_id)
        # Set when the caller stopped waiting (start timeout, cancel): the worker removes what it made.
        abandoned = threading.Event()
        labels = dict(spec.labels)
        if attempt_id != POOL_ATTEMPT:
            labels["rl360.attempt"] = attempt_id
        # A concurrent future, so that giving up on it works even once the event loop that asked is gone
        # (its callback runs on the worker thread); `close` waits for the creates still in flight.
        work = self._executor.submit(self._create_blocking, node, spec, name, labels, abandoned, networking)
        self._in_flight.add(work)
        work.add_done_callback(self._in_flight.discard)
        waited = asyncio.wrap_future(work)
        waited.add_done_callback(_retrieve)  # an abandoned create's error is nobody's to raise
        try:
            cid = await asyncio.wait_for(asyncio.shield(waited), self.config.start_timeout_s)
        except TimeoutError:
            self._abandon(node, work, abandoned)
            raise SandboxError(Event.START_TIMEOUT, f"creating a container on {node} took over "
                               f"{self.config.start_timeout_s:g}s", node=node) from None
        except asyncio.CancelledError:
            self._abandon(node, work, abandoned)
            raise
        except SandboxError:
            raise
        except Exception as e:  # noqa: BLE001
            if isinstance(e, docker.errors.ImageNotFound):
                self.images.pop((node, spec.image), None)  # removed from outside: the next start pulls it again
            raise _error(node, e, Event.START_FAILED, "create container") from None
        return cid, name

    def _create_blocking(self, node: str, spec: ContainerSpec, name: str, labels: dict[str, str],
                         abandoned: threading.Event, networking: dict | None = None) -> str:
        api = self.api(node)
        kwargs = create_kwargs(spec, self.config)
        # tmpfs is mounted noexec by default: a task compiles and runs programs in /tmp.
        tmpfs = {path: f"rw,exec,nosuid,nodev,size={spec.file_bytes}" + (",mode=1777" if path == "/tmp" else "")
                 for path in spec.tmpfs}
        host_config = api.create_host_config(**kwargs["host_config"], tmpfs=tmpfs or None)
        container = api.create_container(
            spec.image, entrypoint=["/bin/sh", "-c"], command=[INIT], stdin_open=True, user="0", labels=labels,
            working_dir=spec.workdir, environment=dict(spec.env), host_config=host_config, name=name,
            hostname="sandbox", volumes=list(spec.volumes) or None, networking_config=networking)
        cid = container["Id"]
        try:
            api.start(cid)
            if abandoned.is_set():
                raise _Abandoned()
        except BaseException:
            with contextlib.suppress(Exception):
                api.remove_container(cid, force=True, v=True)
            raise
        return cid

    # ------------------------------------------------------------------ warm pool and removal

    async def _make_pooled(self, node: str, spec: ContainerSpec) -> tuple[str, str, str]:
        return (node, *await self._create(node, spec, POOL_ATTEMPT))

    async def _discard(self, pooled: tuple[str, str, str]) -> None:
        node, cid, _ = pooled
        self.remove_soon(node, cid)

    def _reserve(self, node: str, spec: ContainerSpec, copies: int) -> None:
        """Count `copies` containers of `spec`'s limits on the node (negative: give them back)."""
        reserved = self._reserved[node]
        reserved[0] += copies * spec.cpus
        reserved[1] += copies * spec.memory_mb

    def _free(self, node: str) -> tuple[float, int]:
        """What the node's live sandboxes leave of its capacity (CPUs, MB)."""
        cpus, mb = self._reserved[node]
        return self.specs[node].cpus - cpus, self.specs[node].memory_mb - int(mb)

    def release(self, node: str, spec: ContainerSpec, container_id: str,
                sidecars: DockerSidecars | None = None) -> None:
        """A sandbox's attempt is over: its reservation and GPUs are free now, its container (then its
        sidecars and their network) go soon."""
        self._reserve(node, spec, -(containers_of(sidecars.task) if sidecars else 1))
        self._gpus_held[node].difference_update(int(g) for g in spec.gpus)
        self.remove_soon(node, container_id, then=sidecars.remove_blocking if sidecars else None)

    def remove_soon(self, node: str, container_id: str, *, then=None) -> None:
        """Send the removal to the provider's threads and return; `close` waits for it. `then` runs after
        the container is gone (a sidecar network cannot be removed while the sandbox is on it)."""
        def remove() -> None:
            try:
                self.api(node).remove_container(container_id, force=True, v=True)
                if then is not None:
                    then()
            except docker.errors.NotFound:
                if then is not None:
                    then()
            except Exception as e:  # noqa: BLE001 — the janitor removes it once the node answers again
                log.warning("could not remove container %s on %s (%s); `rl360 down` removes it later",
                            container_id[:12], node, _one_line(str(e)))

        try:
            future = self._executor.submit(remove)
        except RuntimeError:  # the provider is closed: the janitor removes it by label
            return
        self._removals.add(future)
        future.add_done_callback(self._removals.discard)

    def pool_stats(self) -> PoolStats:
        return self.pool.stats()

    def _abandon(self, node: str, work: Future, abandoned: threading.Event) -> None:
        """Nobody waits for this create any more: the container it makes (if it makes one) goes."""
        abandoned.set()

        def remove_late(done: Future) -> None:
            if done.cancelled() or done.exception() is not None:
                return
            with contextlib.suppress(Exception):  # else the janitor removes it by label
                self.api(node).remove_container(done.result(), force=True, v=True)

        work.add_done_callback(remove_late)

    async def close(self) -> None:
        """Empty the warm pool, wait for every removal sent (at most a minute), then let the threads go."""
        await self.pool.close()
        pending = [asyncio.wrap_future(f) for f in [*self._in_flight, *self._removals]]
        for future in pending:
            future.add_done_callback(_retrieve)
        if pending:
            await asyncio.wait(pending, timeout=60)
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._clients_lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()


class DockerSandbox(Sandbox):
    provider = "docker"

    def __init__(self, owner: DockerProvider, task, spec: ContainerSpec, *, node: str, container_id: str, name: str, image: str,
                 warm: bool, attempt_id: str, created: float, network: str, network_denied: bool,
                 pool_hit: bool, start_s: float, sidecars: DockerSidecars | None = None):
        self.owner = owner
        self.sidecars = sidecars
        self.config = owner.config
        self.task = task
        self.spec = spec
        self.node = node
        self.id = container_id[:12]
        self.container_id = container_id
        self.name = name
        self.image = image
        self.warm = warm
        self.attempt_id = attempt_id
        self.created = created
        self.network = network
        self.network_denied = network_denied
        self.pool_hit = pool_hit
        self.start_s = start_s
        self._ooms_seen = 0
        self._stopped = False

    def info(self) -> dict[str, Any]:
        return {"node": self.node, "provider": "docker", "task": self.task.id, "attempt": self.attempt_id,
                "container_id": self.container_id, "name": self.name, "image": self.image,
                "image_id": self.owner.images.get((self.node, self.image)), "warm": self.warm,
                "pool_hit": self.pool_hit,
                "docker_host": self.owner.specs[self.node].docker_host, "network": self.network,
                "network_denied": self.network_denied, "pid": None,
                **({"gpus": list(self.spec.gpus)} if self.spec.gpus else {}),
                **(self.sidecars.info() if self.sidecars else {})}

    # ------------------------------------------------------------------ exec

    async def exec(self, command: str, *, timeout_s: float, env: Mapping[str, str] | None = None,
                   user: str | None = None) -> ExecResult:
        if self._stopped:
            raise SandboxError(Event.SANDBOX_KILLED, f"sandbox {self.id} was stopped", node=self.node)
        owner, node = self.owner, self.node
        paused_until = time.monotonic() + PAUSE_WAIT_S
        while True:
            try:
                exec_id = (await owner.call(lambda: owner.api(node).exec_create(
                    self.container_id, [*SHELL, AWAIT_INIT + command], environment=dict(env or {}),
                    user=user or owner.image_users.get((node, self.image), ""),
                    workdir=self.task.workdir)))["Id"]
                break
            except Exception as e:  # noqa: BLE001
                # Paused from outside (`docker pause`, a look at its files): a pause is no failure, wait it out.
                if "is paused" not in str(e) or time.monotonic() > paused_until:
                    raise await self._lost(e) from None
                await asyncio.sleep(0.2)
        buffer = OutputBuffer(self.config.max_output_chars)
        started = time.monotonic()

        def drain() -> None:
            for chunk in owner.api(node, stream=True).exec_start(exec_id, stream=True):
                buffer.feed(chunk)

        future = asyncio.ensure_future(owner.call(drain))
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            timed_out = True
            await self._kill_all()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(future), 10)
        except asyncio.CancelledError:
            await asyncio.shield(self._kill_all())
            raise
        except Exception as e:  # noqa: BLE001 — the stream broke: the container or its node went away
            raise await self._lost(e) from None
        duration = time.monotonic() - started
        try:
            state = await owner.call(lambda: owner.api(node).exec_inspect(exec_id))
        except Exception as e:  # noqa: BLE001
            raise await self._lost(e) from None
        code = state.get("ExitCode")
        output, cut = buffer.text()
        oom = False
        if not timed_out and (code is None or code == 137 or code < 0):
            # Killed: by the OOM killer (the command hit the reservation), or the container is gone.
            await self._check_alive()
            oom = await self._new_oom()
            if not oom:  # a SIGKILL from outside: the container goes down a moment after its command
                await asyncio.sleep(KILL_SETTLE_S)
                await self._check_alive()
        limit = "memory" if oom else buffer.first_limit()
        if code == 153 and limit is None:
            limit = "file_size"
        if code == 126 and "OCI runtime exec failed" in output:
            # The command could not even start: the container is gone, or the agent's processes fill its
            # pids limit (a fork bomb's children live on between commands in a container).
            await self._check_alive()
            if await self._pids_full():
                limit = "processes"
            elif await self._new_oom():  # its memory is full: runc's setns process found none either
                limit = "memory"
        return ExecResult(exit_code=None if timed_out else code, output=output, timed_out=timed_out,
                          oom_killed=oom or limit == "memory", duration_s=duration,
                          limit=None if timed_out else limit, truncated_chars=cut)

    async def _kill_all(self) -> None:
        """Kill every process of the container but its init (a command past its timeout, and its children):
        the init's SIGUSR1 does it, then `kill -9 -1` in an exec, which returns only once it has run."""
        owner, node = self.owner, self.node

        def kill() -> None:
            api = owner.api(node)
            api.kill(self.container_id, signal="USR1")
            exec_id = api.exec_create(self.container_id, ["/bin/sh", "-c", KILL_ALL], user="root")["Id"]
            api.exec_start(exec_id)

        with contextlib.suppress(Exception):
            await asyncio.wait_for(owner.call(kill), 15)

    async def end_agent_processes(self) -> None:
        await self._kill_all()

    async def reset_dir(self, remote_path: str) -> None:
        # A read-only root's /tests is a mount point: emptied, since it cannot be removed.
        result = await self.exec(reset_command(remote_path), timeout_s=60, user="root")
        if result.exit_code != 0:
            raise own_command_failed(result, f"cannot reset {remote_path}", node=self.node)

    async def prepare_verifier(self) -> None:
        """One exec: kill what the agent left running, then empty /tests and /logs/verifier."""
        result = await self.exec(PREPARE_VERIFIER, timeout_s=60, user="root")
        if result.limit == "processes":
            # It could not start: what the agent left holds every pid. The init kills it, then once more.
            await self._kill_all()
            result = await self.exec(PREPARE_VERIFIER, timeout_s=60, user="root")
        if result.exit_code != 0:
            raise own_command_failed(result, f"cannot prepare the verifier in {self.id}", node=self.node)

    async def _new_oom(self) -> bool:
        """True when the daemon reported an OOM kill in this container since the last look."""
        owner, node = self.owner, self.node
        until = time.time() + owner._clock_offset.get(node, 0.0) + 0.5
        try:
            events = await owner.call(lambda: list(owner.api(node).events(
                since=int(self.created), until=until, filters={"container": self.container_id, "event": "oom"},
                decode=True)))
        except Exception:  # noqa: BLE001
            return False
        count = len(events)
        new = count > self._ooms_seen
        self._ooms_seen = count
        return new

    async def _pids_full(self) -> bool:
        owner, node = self.owner, self.node
        try:
            stats = await owner.call(
                lambda: owner.api(node).stats(self.container_id, stream=False, one_shot=True))
        except Exception:  # noqa: BLE001
            return False
        pids = stats.get("pids_stats") or {}
        return bool(pids.get("limit")) and pids.get("current", 0) >= pids["limit"] - 2

    async def _check_alive(self) -> None:
        """`SandboxError` when the container is no longer running (or its node no longer answers)."""
        owner, node = self.owner, self.node
        try:
            state = (await owner.call(lambda: owner.api(node).inspect_container(self.container_id)))["State"]
        except Exception as e:  # noqa: BLE001
            raise await self._lost(e) from None
        if state.get("Running"):
            return
        raise await self._dead(state)

    async def _dead(self, state: dict) -> SandboxError:
        # A daemon that is shutting down kills its containers first: give it a moment to go.
        if await self._node_gone(grace_s=2.0):
            return SandboxError(Event.NODE_UNREACHABLE, f"node {self.node}: its Docker daemon went away",
                                node=self.node)
        how = f"exit {state.get('ExitCode')}, status {state.get('Status')}"
        if state.get("OOMKilled"):
            # Its init is the smallest process in it: killed for memory only when nothing else frees any.
            return SandboxError(Event.SANDBOX_OOM, f"container {self.id} on {self.node} was OOM-killed "
                                f"({how}): its memory is full", node=self.node)
        return SandboxError(Event.SANDBOX_KILLED, f"container {self.id} on {self.node} was killed from outside "
                            f"({how})", node=self.node)

    async def _node_gone(self, *, grace_s: float) -> bool:
        deadline = time.monotonic() + grace_s
        while True:
            if not await self.owner.ping(self.node):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.25)

    async def _lost(self, error: BaseException) -> SandboxError:
        """Classify a failed call: the node is gone, the container is gone, or the daemon said no."""
        if isinstance(error, SandboxError):
            return error
        node = self.node
        if not await self.owner.ping(node):
            return _node_lost(node, error)
        try:
            state = (await self.owner.call(
                lambda: self.owner.api(node).inspect_container(self.container_id)))["State"]
        except docker.errors.NotFound:
            return SandboxError(Event.SANDBOX_KILLED, f"container {self.id} on {node} was removed from outside",
                                node=node)
        except Exception as e:  # noqa: BLE001
            return _error(node, e, Event.PROVIDER_FAILED, "inspect container")
        if not state.get("Running"):
            return await self._dead(state)
        return _error(node, error, Event.PROVIDER_FAILED, "exec")

    # ------------------------------------------------------------------ files

    async def upload(self, local_path: Path | str, remote_path: str) -> None:
        local = Path(local_path)
        remote = PurePosixPath(remote_path)
        if not remote.is_absolute() or str(remote) == "/":
            raise SandboxError(Event.PROVIDER_FAILED, f"{remote_path!r} is not an absolute path below /",
                               node=self.node)
        if not local.exists():
            raise SandboxError(Event.PROVIDER_FAILED, f"upload of {local} failed: no such file", node=self.node)
        # A folder's contents go into the folder itself (made first if missing), a file into its parent:
        # the daemon refuses an archive for the read-only root, and /tests, /solution are mount points in it.
        folder = local.is_dir()
        data = await asyncio.to_thread(_tar_of, local, "." if folder else remote.name)
        owner, node = self.owner, self.node
        parent = str(remote if folder else remote.parent)

        def put() -> None:
            api = owner.api(node)
            try:
                api.put_archive(self.container_id, parent, data)
            except docker.errors.NotFound:
                # The parent folder is missing: make it, then try once more.
                exec_id = api.exec_create(self.container_id, ["mkdir", "-p", parent], user="root")["Id"]
                api.exec_start(exec_id)
                api.put_archive(self.container_id, parent, data)

        try:
            await owner.call(put)
        except Exception as e:  # noqa: BLE001
            raise await self._lost(e) from None

    async def download(self, remote_path: str, local_path: Path | str) -> None:
        owner, node = self.owner, self.node
        try:
            stream, stat = await owner.call(lambda: owner.api(node).get_archive(self.container_id, remote_path))
            data = await owner.call(lambda: b"".join(stream))
        except docker.errors.NotFound:
            raise SandboxError(Event.PROVIDER_FAILED, f"no such file {remote_path} in the sandbox",
                               node=node) from None
        except Exception as e:  # noqa: BLE001
            raise await self._lost(e) from None
        await asyncio.to_thread(_untar_to, data, Path(local_path))

    async def read_file(self, remote_path: str, *, max_bytes: int = 1 << 20) -> bytes | None:
        owner, node = self.owner, self.node
        try:
            stream, stat = await owner.call(lambda: owner.api(node).get_archive(self.container_id, remote_path))
            data = await owner.call(lambda: b"".join(stream))
        except docker.errors.NotFound:
            await self._check_alive()  # no file in a container that is gone is a lost sandbox, not a missing file
            return None
        except Exception as e:  # noqa: BLE001
            raise await self._lost(e) from None
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                return None
            f = tar.extractfile(member)
            return f.read(max_bytes) if f else None

    # ------------------------------------------------------------------ life

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        # Nothing waits on the removal (the reservation is free once the attempt ends): the provider
        # finishes it in the background, and its close waits for it.
        self.owner.release(self.node, self.spec, self.container_id, self.sidecars)


# ----------------------------------------------------------------------------- helpers


def create_kwargs(spec: ContainerSpec, config: SandboxConfig) -> dict[str, Any]:
    """The daemon's host configuration of a container of `spec` (all but its tmpfs), as the docker SDK's
    `create_host_config` takes it: limits, network, privileges and the GPU device request."""
    host = {
        "nano_cpus": int(spec.cpus * 1e9), "mem_limit": f"{spec.memory_mb}m", "memswap_limit": f"{spec.memory_mb}m",
        "pids_limit": config.pids_limit, "network_mode": spec.network, "security_opt": ["no-new-privileges"],
        "cap_drop": ["ALL"], "cap_add": list(capabilities(spec)), "read_only": bool(spec.volumes),
        "ulimits": [docker.types.Ulimit(name="fsize", soft=spec.file_bytes, hard=spec.file_bytes),
                    docker.types.Ulimit(name="nofile", soft=config.max_open_files, hard=config.max_open_files)],
    }
    if spec.gpus:
        # `docker run --gpus '"device=1,2"'`: these GPUs of the node, not the first N (docs/sandboxes.md).
        host["device_requests"] = [docker.types.DeviceRequest(device_ids=list(spec.gpus), capabilities=[["gpu"]])]
    return {"host_config": host}


def capabilities(spec: ContainerSpec) -> tuple[str, ...]:
    """What a container of `spec` gets back after dropping all: see CAP_ADD and PACKAGE_CAPS."""
    return CAP_ADD if spec.volumes else CAP_ADD + PACKAGE_CAPS


def read_only_volumes(task) -> tuple[str, ...] | None:
    """The volumes of `task`'s read-only root (its workdir, /tests, /logs, /solution, less those inside
    another), or None when the task needs a writable root: its workdir is in a system folder, or it
    hands on an artifact from a path that would be read-only."""
    workdir = posixpath.normpath(task.workdir)
    if workdir.split("/")[1] in SYSTEM_FOLDERS:  # a task working in /usr/src/app or /var/www writes beside it too
        return None
    paths = sorted({*VOLUME_PATHS, workdir})
    volumes = tuple(p for p in paths
                    if not any(_within(p, other) for other in (*paths, *TMPFS_PATHS) if other != p))
    # In a volume, not a tmpfs: the daemon's archive calls (which hand artifacts on) see only the volumes.
    artifacts = [*task.artifacts, *(a for step in task.steps for a in step.artifacts)]
    if any(not any(_within(posixpath.normpath(a), v) for v in volumes) for a in artifacts):
        return None
    return volumes


def _retrieve(future) -> None:
    if not future.cancelled():
        future.exception()


class _PullError(Exception):
    pass


class _Abandoned(Exception):
    """The start was given up while the container was being made."""


def _is_connection(error: BaseException) -> bool:
    text = str(error)
    return (isinstance(error, (requests.exceptions.ConnectionError, ConnectionError, FileNotFoundError))
            or "Connection refused" in text or ("No such file or directory" in text and "sock" in text))


def _node_lost(node: str, error: BaseException) -> SandboxError:
    return SandboxError(Event.NODE_UNREACHABLE, f"node {node}: Docker daemon unreachable "
                        f"({_one_line(str(error)) or type(error).__name__})", node=node)


def _error(node: str, error: BaseException, event: Event, what: str) -> SandboxError:
    if isinstance(error, SandboxError):
        return error
    if _is_connection(error) or isinstance(error, (requests.exceptions.Timeout, TimeoutError)):
        return _node_lost(node, error)
    return SandboxError(event, f"node {node}: {what} failed: {_one_line(str(error)) or type(error).__name__}",
                        node=node)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def _container_name(run_id: str, attempt_id: str) -> str:
    base = re.sub(r"[^a-zA-Z0-9_.-]+", "-", f"rl360-{run_id or 'none'}-{attempt_id}")[:100].strip("-.")
    return f"{base}-{uuid.uuid4().hex[:6]}"


def _context_tar(folder: Path, dockerfile_name: str, dockerfile: str) -> io.BytesIO:
    """A build context: `folder`'s files, its Dockerfile replaced by `dockerfile`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            name = path.relative_to(folder).as_posix()
            if name != dockerfile_name:
                tar.add(path, arcname=name, recursive=False)
        data = dockerfile.encode()
        info = tarfile.TarInfo(dockerfile_name)
        info.size, info.mtime = len(data), int(time.time())
        tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def _tar_of(local: Path, arcname: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(local, arcname=arcname, filter=_root_owned)
    return buffer.getvalue()


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _untar_to(data: bytes, local: Path) -> None:
    """Extract the archive docker returns for a path: its top member becomes `local`."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rl360-dl-") as tmp, tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(tmp, filter="data")
        entries = list(Path(tmp).iterdir())
        if len(entries) != 1:
            raise SandboxError(Event.PROVIDER_FAILED, f"unexpected archive from the daemon ({len(entries)} entries)")
        top = entries[0]
        local.parent.mkdir(parents=True, exist_ok=True)
        if top.is_dir():
            shutil.copytree(top, local, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(top, local)


def _parse_time(stamp: str) -> float:
    """Docker's RFC 3339 time with nanoseconds, as a Unix timestamp."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", stamp)
    if not m:
        raise ValueError(stamp)
    base = datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    return base.timestamp() + float(m.group(2) or 0)
