"""The `docker` provider: a sandbox is a container on a node's Docker daemon, through the docker SDK.

The provider places each sandbox on one of its nodes (round robin unless the admission controller
names one), makes sure the node holds the image (docker/images.py: pulled once per node through the
profile's mirrors, at most `max_concurrent_pulls` in flight, or built from `environment/Dockerfile`
under its content-hash tag), creates and starts the container (docker/container.py: the
reservation's limits, no network unless the task asks for one and the node has a bridge,
no-new-privileges, capabilities dropped, a read-only root where it can) with the labels
`rl360.managed=true`, `rl360.run`, `rl360.task`, `rl360.attempt`, so that the janitor finds
everything a run made even after the orchestrator crashed, and hands back a `DockerSandbox`
(docker/sandbox.py: the attempt's commands and files). It counts the reservations and GPUs its live
sandboxes hold on each node, and removes their containers once their attempts end. Harbor's sidecars
start beside a sandbox, on a private network (docker/sidecars.py). A daemon that does not answer is a
lost node (docker/errors.py); Podman's service where it cannot hold sandboxes is refused in one line
(docker/podman.py).

With `[sandbox.warm_pool] size` > 0, each node keeps up to that many idle containers per creation spec
started ahead of demand (rl360cli/sandbox/docker/warm_pool.py), no more of a task than the starts the session
actor said are coming (`expect`), so a start is a lookup; a pooled container
carries the label `rl360.attempt=warm-pool` and serves one attempt only. `stop` returns once the
removal is sent to the provider's threads; `close` waits for every removal it sent (and the janitor
removes by label whatever a crashed orchestrator left).

Heavy import (the docker SDK): loaded only by make_provider.
Test: tests/sandbox/test_docker_provider.py (the dev Docker nodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING, Any

import docker
import docker.errors

from rl360cli.egress.client import EgressRoute, EgressUnavailable
from rl360cli.egress.trust import container_trust_command, trust_env
from rl360cli.errors import Rl360Error
from rl360cli.images.config import RegistrySpec
from rl360cli.nodes.config import need_docker_nodes
from rl360cli.nodes.docker_runtime import docker_client
from rl360cli.sandbox.config import SandboxConfig
from rl360cli.sandbox.docker.container import (HOSTNAME, INIT, POOL_ATTEMPT, TMPFS_PATHS, ContainerSpec, container_name,
                                               create_kwargs, read_only_volumes, tmpfs_mounts)
from rl360cli.sandbox.docker.errors import as_sandbox_error, node_lost, one_line
from rl360cli.sandbox.docker.images import NodeImages
from rl360cli.sandbox.docker.podman import podman_facts, refusal
from rl360cli.sandbox.docker.reaper import DEADLINE_LABEL
from rl360cli.sandbox.docker.sandbox import DockerSandbox
from rl360cli.sandbox.docker.sidecars import DockerSidecars
from rl360cli.sandbox.provider import NodeCapacity, Sandbox, SandboxProvider, containers_of, sandbox_labels
from rl360cli.sandbox.task import resolve_env
from rl360cli.sandbox.taxonomy import Event, SandboxError
from rl360cli.sandbox.docker.warm_pool import PoolStats, WarmPool
from rl360cli.sandbox.network import Abilities, Access, Network, decide

if TYPE_CHECKING:
    from rl360cli.nodes.config import NodeSpec

log = logging.getLogger(__name__)


class DockerProvider(SandboxProvider):
    name = "docker"
    supports_sidecars = True
    supports_service_ops = True  # docker exec and docker cp in a sidecar: Harbor's collect hooks and artifacts

    def __init__(self, nodes: Sequence[NodeSpec], *, config: SandboxConfig, run_id: str = "",
                 registry: RegistrySpec | None = None, share: tuple[int, int] = (0, 1),
                 egress: EgressRoute | None = None):
        need_docker_nodes(nodes)
        self.specs = {n.name: n for n in nodes}
        self.config = config
        self.run_id = run_id
        # Where a network task's container goes: the profile's [egress] (none unless it says).
        self.egress = egress or EgressRoute()
        # What each node holds, pulled (through the profile's mirrors, within this provider's `share` of
        # the registry's pull cap) or built.
        self.node_images = NodeImages(self, registry=registry or RegistrySpec(), share=share)
        self._executor = ThreadPoolExecutor(max_workers=min(512, 2 * config.max_concurrent + 16),
                                            thread_name_prefix="rl360-docker")
        self._clients: dict[tuple[str, str], Any] = {}
        self._clients_lock = threading.Lock()
        self._clock_offset: dict[str, float] = {}
        self._bridges: dict[str, bool] = {}
        # Each node's CPU architecture, as its daemon says (x86_64, aarch64; "" before the first start there).
        self.architecture: dict[str, str] = {}
        # Each node's CPUs, as its daemon counts them (0 before the first start there): a container's CPU limit.
        self.node_cpus: dict[str, int] = {}
        self._next = 0
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

                client = docker_client(spec, timeout_s=timeout or 3600).api
            else:
                client = docker.APIClient(base_url=spec.docker_host, version="auto", timeout=timeout,
                                          max_pool_size=self.config.max_concurrent + 8)
        except Exception as e:  # noqa: BLE001 — every way of not reaching a daemon is a lost node here
            raise node_lost(node, e) from None
        with self._clients_lock:
            self._clients.setdefault(key, client)
            return self._clients[key]

    def _node_facts(self, node: str) -> None:
        """Once per node: the daemon's clock offset (for its event times) and whether it has a bridge."""
        if node in self._clock_offset:
            return
        api = self.api(node)
        if (refused := refusal(node, podman_facts(api))) is not None:
            raise refused
        info = api.info()
        stamp = info.get("SystemTime", "")
        self.architecture[node] = info.get("Architecture", "")
        self.node_cpus[node] = int(info.get("NCPU") or 0)
        offset = 0.0
        with contextlib.suppress(ValueError):
            offset = _parse_time(stamp) - time.time()
        self._bridges[node] = bool(api.networks(names=["bridge"]))
        self._clock_offset[node] = offset

    def has_bridge(self, node: str) -> bool:
        """Whether the node's daemon has its default bridge network (known after the first start there)."""
        return bool(self._bridges.get(node))

    def clock_offset(self, node: str) -> float:
        """Seconds the node's daemon clock is ahead of this machine's (0 before the first start there)."""
        return self._clock_offset.get(node, 0.0)

    def failure(self, node: str, error: BaseException, event: Event, what: str) -> SandboxError:
        """`error` of a call to `node`'s daemon as the attempt sees it (a lost node, or `event`)."""
        return as_sandbox_error(node, error, event, what)

    async def ping(self, node: str) -> bool:
        try:
            await asyncio.wait_for(self.call(lambda: self.api(node).ping()), 5)
            return True
        except Exception:  # noqa: BLE001
            return False

    # ------------------------------------------------------------------ images (docker/images.py)

    @property
    def images(self) -> dict[tuple[str, str], str]:
        """(node, image ref) -> image id, of the images this provider has seen on its nodes."""
        return self.node_images.ids

    @property
    def pulls(self) -> int:
        return self.node_images.pulls

    @property
    def builds(self) -> int:
        return self.node_images.builds

    def image_ref(self, task) -> str:
        return self.node_images.ref(self.as_started(task))

    async def ensure_image(self, node: str, task) -> tuple[str, bool]:
        """(image ref on the node, whether it was there already): pulled or built once per node."""
        return await self.node_images.ensure(node, task)

    def pull_load(self) -> tuple[int, int] | None:
        return self.node_images.load()

    # ------------------------------------------------------------------ start

    def _pick(self) -> str:
        names = list(self.specs)
        node = names[self._next % len(names)]
        self._next += 1
        return node

    async def start(self, task, *, attempt_id: str, labels: Mapping[str, str], node: str | None = None) -> Sandbox:
        task = self.as_started(task)  # `force_build`: built, not pulled, once per node (node_images' lock)
        node = node or self._pick()
        if node not in self.specs:
            raise Rl360Error(f"node '{node}' is not one of the docker provider's nodes ({', '.join(self.specs)})")
        began = time.monotonic()
        try:
            await self.call(self._node_facts, node)
        except (SandboxError, Rl360Error):  # Rl360Error: a daemon rl360 refuses (docker/podman.py)
            raise
        except Exception as e:  # noqa: BLE001
            raise node_lost(node, e) from None
        try:  # before the image: a sandbox that cannot start must not cost a build
            env = resolve_env(task.env)
        except KeyError as e:
            raise SandboxError(Event.START_FAILED, f"[environment.env] needs ${{{e.args[0]}}}, which is not set",
                               node=node) from None
        ref, warm = await self.ensure_image(node, task)
        network = self.network_of(task, node)
        sidecars = None
        if task.sidecars or task.volume_mounts:
            # One private network per sandbox, its sidecars on it by name (docker/sidecars.py); they go out as
            # the sandbox does: through the node's bridge, or through the proxy (docker/sidecars.py). Its
            # compose volumes are the sandbox's own, made with the network.
            sidecars = DockerSidecars(self, node, task, sandbox_labels(labels, run_id=self.run_id, task=task,
                                                                       attempt_id=attempt_id),
                                      outbound=network.access == Access.OPEN, egress=network.access == Access.PROXY)
        # The session's deadline is its container's own label, not the spec's: a pool matches specs.
        deadline = labels.get(DEADLINE_LABEL)
        spec = self._container_spec(node, task, ref, env, {k: v for k, v in labels.items() if k != DEADLINE_LABEL},
                                    network, sidecars=sidecars, gpus=self._take_gpus(node, task.gpus))
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
                cid, name = await self._create(node, spec, attempt_id, deadline=deadline,
                                               networking=sidecars.main_networking() if sidecars else None)
        except BaseException:
            self._reserve(node, spec, -containers_of(task))
            self._gpus_held[node].difference_update(int(g) for g in spec.gpus)
            if sidecars is not None:
                await asyncio.shield(self.call(sidecars.remove_blocking))
            raise
        sandbox = DockerSandbox(self, task, spec, node=node, container_id=cid, name=name, image=ref, warm=warm,
                                attempt_id=attempt_id, created=time.time() + self.clock_offset(node) - 1.0,
                                network=spec.network, network_denied=spec.network_denied,
                                pool_hit=pooled is not None, start_s=time.monotonic() - began, sidecars=sidecars)
        if network.attached:  # its way out through the proxy, or its agent's door (network.py)
            try:
                pid = (await self.call(lambda: self.api(node).inspect_container(cid)))["State"]["Pid"]
                ca_pem = await self.egress.attach(cid, pid, task.allowed_hosts, trusts_ca=True,
                                                  outbound=network.access == Access.PROXY)
                if network.door:  # its agent's way to its own session, opened by the agent's harness
                    sandbox.door_route, sandbox.door_id = self.egress, cid
            except (EgressUnavailable, docker.errors.APIError, KeyError) as e:
                await sandbox.stop()
                raise SandboxError(Event.START_FAILED, f"the container's way out: {e}", node=node) from None
            if ca_pem:  # an https:// mirror or a dated index: it trusts the CA beside its own roots (egress/trust.py)
                trusted = await sandbox.exec(container_trust_command(ca_pem), timeout_s=30, user="root")
                if trusted.exit_code != 0:
                    await sandbox.stop()
                    raise SandboxError(Event.START_FAILED, "cannot install the rl360 egress CA in the container: "
                                       f"{trusted.output.strip()[-200:]}", node=node)
                sandbox.trust_env = trust_env(trusted.output)
        try:
            await sandbox.settle()
        except BaseException:
            await asyncio.shield(sandbox.stop())
            raise
        return sandbox

    def abilities(self, node: str) -> Abilities:
        """The node's bridge, where its daemon has one; the node's proxy, where the daemon runs beside it
        (`reaches_proxy`). What a node has is known after the first start there."""
        return Abilities(open_network=self.has_bridge(node), reaches_proxy=self.reaches_proxy(node))

    def network_of(self, task, node: str) -> Network:
        """What a sandbox of `task` gets on `node` (rl360cli/sandbox/network.py)."""
        return decide(task, sandbox_network=self.config.network, egress_mode=self.egress.mode,
                      abilities=self.abilities(node), agent_inside=self.egress.door)

    def reaches_proxy(self, node: str) -> bool:
        """Whether `node`'s containers (and builds) can go out through the egress proxy: under `allow`, on a
        daemon of this machine or node (unix://), where its proxy runs (on Slurm, each rollout node's own)."""
        return self.egress.mode == "allow" and self.specs[node].docker_host.startswith("unix://")

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

    def _container_spec(self, node: str, task, ref: str, env: dict[str, str], labels: Mapping[str, str],
                        decided: Network, *, sidecars: DockerSidecars | None = None,
                        gpus: tuple[str, ...] = ()) -> ContainerSpec:
        cpus, memory_mb = self.reservation(task)
        # The proxy: no network of its own; the proxy listens on its loopback.
        egress = decided.access == Access.PROXY
        network = "bridge" if decided.access == Access.OPEN else "none"
        if sidecars is not None:
            network = sidecars.network
        read_only_ok = not decided.goes_out  # a sandbox that may install packages needs a writable root
        if egress:
            env = {**env, **self.egress.proxy_env(no_proxy=[s.name for s in task.sidecars])}
        # The attempt is not part of the spec: any attempt of the same task may take a pooled container.
        all_labels = sandbox_labels(labels, run_id=self.run_id, task=task, attempt_id=POOL_ATTEMPT)
        # A prebuilt image's task with no workdir of its own runs in the image's WORKDIR, else / (Harbor's rule).
        workdir = (self.node_images.workdirs.get((node, ref)) or "/") if task.workdir_from_image else task.workdir
        volumes = read_only_volumes(task, workdir) if self.config.read_only_root and read_only_ok else None
        return ContainerSpec(image=ref, cpus=cpus, memory_mb=memory_mb, network=network, gpus=gpus,
                             network_denied=decided.denied,
                             egress=egress,
                             workdir=workdir,
                             env=tuple(sorted(env.items())), labels=tuple(sorted(all_labels.items())),
                             file_bytes=min(self.config.max_file_mb, task.storage_mb) << 20,
                             volumes=volumes or (), tmpfs=TMPFS_PATHS if volumes else (),
                             mounts=sidecars.mounts(task.volume_mounts) if sidecars is not None else ())

    async def _create(self, node: str, spec: ContainerSpec, attempt_id: str, *, deadline: str | None = None,
                      networking: dict | None = None) -> tuple[str, str]:
        """Create and start one container within the start timeout; (id, name). `deadline`: its session's
        (epoch seconds), the label its node's reaper reads (docker/reaper.py)."""
        name = container_name(self.run_id, attempt_id)
        # Set when the caller stopped waiting (start timeout, cancel): the worker removes what it made.
        abandoned = threading.Event()
        labels = dict(spec.labels)
        if attempt_id != POOL_ATTEMPT:
            labels["rl360.attempt"] = attempt_id
        if deadline:
            labels[DEADLINE_LABEL] = str(deadline)
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
                self.node_images.forget(node, spec.image)
            raise as_sandbox_error(node, e, Event.START_FAILED, "create container") from None
        return cid, name

    def _create_blocking(self, node: str, spec: ContainerSpec, name: str, labels: dict[str, str],
                         abandoned: threading.Event, networking: dict | None = None) -> str:
        api = self.api(node)
        kwargs = create_kwargs(spec, self.config, node_cpus=self.node_cpus.get(node, 0))
        host_config = api.create_host_config(**kwargs["host_config"], tmpfs=tmpfs_mounts(spec))
        container = api.create_container(
            spec.image, entrypoint=["/bin/sh", "-c"], command=[INIT], stdin_open=True, user="0", labels=labels,
            working_dir=spec.workdir, environment=dict(spec.env), host_config=host_config, name=name,
            hostname=HOSTNAME, volumes=list(spec.volumes) or None, networking_config=networking)
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

    def expect(self, task, count: int) -> None:
        self.pool.expect(task.id, count)

    def pooled_nodes(self, task) -> set[str]:
        return self.pool.nodes_holding(task.id)

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

    def release(self, node: str, spec: ContainerSpec, container_id: str, *, containers: int = 1,
                then: Callable[[], None] | None = None) -> None:
        """A sandbox's attempt is over: the reservation of its `containers` (itself and its sidecars) and its
        GPUs are free now, its container goes soon, then `then` runs (its sidecars and their network go)."""
        self._reserve(node, spec, -containers)
        self._gpus_held[node].difference_update(int(g) for g in spec.gpus)
        self.remove_soon(node, container_id, then=then)

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
                            container_id[:12], node, one_line(str(e)))

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


def _retrieve(future) -> None:
    if not future.cancelled():
        future.exception()


class _Abandoned(Exception):
    """The start was given up while the container was being made."""


def _parse_time(stamp: str) -> float:
    """Docker's RFC 3339 time with nanoseconds, as a Unix timestamp."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", stamp)
    if not m:
        raise ValueError(stamp)
    base = datetime.fromisoformat(m.group(1) + ("+00:00" if m.group(3) == "Z" else m.group(3)))
    return base.timestamp() + float(m.group(2) or 0)
