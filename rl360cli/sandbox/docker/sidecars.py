"""A docker sandbox's sidecars: its private network and one container per compose service.

Compose's layout, per sandbox: a user-defined bridge network (`internal` and without an address on
the node, so no way out and no way to the node's own services, unless the task has a network and the
node a bridge), each sidecar on it under its service name as a network
alias (so `http://mcp-server:8000` resolves through the daemon's DNS), and the sandbox itself on it
as `main`. Nothing is published on the node: another sandbox, on its own network, cannot reach them.
Sidecars carry the sandbox's labels (`rl360.managed`, `rl360.run`, `rl360.task`, `rl360.attempt`) and
`rl360.sidecar=<service>`; the network carries them too, so the janitor's sweep by label removes
everything a crashed run left. The task's compose volumes are volumes of the sandbox's own
(`<network>-<name>`, the same labels), made before any container, mounted in each service that names
them, `main` included. `remove_blocking` removes the containers, then the network, then the volumes.

Under `[egress] mode = "allow"`, where the sandbox goes out through the node's proxy, so do its sidecars
(Harbor's sidecars have the network: harbor-cookbook's mcp-tools server runs `uv run server.py`, which
fetches its dependencies from PyPI as it starts). A process must find the proxy from its first instant,
so each sidecar gets a holder first (docker/build_net.py's pause container, Kubernetes' pod pattern): on
the private network under the service's name, attached to the proxy, and the sidecar runs in its
namespace (`network_mode="container:<holder>"`) with the proxy's environment (NO_PROXY naming the other
services and `main`). What they fetched joins the sandbox's counts at its stop.

A sidecar runs the task author's server, not the policy's code, but the policy's code talks to it:
it gets no-new-privileges, every capability dropped but those a server's entrypoint may need to drop
its own privileges, the sandbox's memory and CPU limits, and the pids limit.

Used by docker/provider.py. Test: tests/sandbox/test_sidecars.py (the dev Docker nodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shlex
import time
import uuid
from collections.abc import Mapping, Sequence

import docker.errors
import docker.types

from rl360cli.egress.client import EgressReport, EgressUnavailable
from rl360cli.sandbox.docker.build_net import HOLDER_IMAGE
from rl360cli.sandbox.docker.container import cpu_limit_nanos
from rl360cli.sandbox.docker.owner import SandboxOwner
from rl360cli.sandbox.provider import ExecResult
from rl360cli.sandbox.sidecars import MAIN, Sidecar, VolumeMount, image_task, volume_names, wait_healthy
from rl360cli.sandbox.taxonomy import Event, SandboxError

SIDECAR_LABEL = "rl360.sidecar"
# What a sidecar's entrypoint may need: write its files as their owners, drop to its own user.
SIDECAR_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID", "KILL")
# What a collect hook's output keeps (its tail): it is recorded, never read by the verifier.
_OUTPUT_CHARS = 4000


class DockerSidecars:
    """The network and sidecar containers of one sandbox on one node."""

    def __init__(self, owner: SandboxOwner, node: str, task, labels: Mapping[str, str], *, outbound: bool,
                 egress: bool = False):
        self.owner = owner
        self.node = node
        self.task = task
        self.labels = dict(labels)
        self.outbound = outbound
        # Through the node's egress proxy, each sidecar in a holder's namespace (the module's docstring).
        self.egress = egress
        self.network = f"rl360-net-{uuid.uuid4().hex[:12]}"
        self.network_id: str | None = None
        self.containers: dict[str, str] = {}
        # service name -> its holder container (egress only); removed after the sidecars.
        self.holders: dict[str, str] = {}
        # compose volume -> the docker volume of this sandbox's; `made`: those created so far (removed last).
        self.volumes = {name: f"{self.network}-{name}" for name in volume_names(task)}
        self.made_volumes: list[str] = []

    async def start(self, *, cpus: float, memory_mb: int) -> None:
        """Make the network, then start the sidecars in order, waiting where compose waits; on failure,
        remove what was made and raise `SandboxError`."""
        try:
            self.network_id = (await self.owner.call(self._create_network))["Id"]
            for volume in self.volumes.values():
                await self.owner.call(self._create_volume, volume)
            for sidecar in self.task.sidecars:
                ref, _ = await self.owner.ensure_image(self.node, image_task(self.task, sidecar))
                holder = await self._hold(sidecar) if self.egress else None
                self.containers[sidecar.name] = await self.owner.call(self._create, sidecar, ref, cpus, memory_mb,
                                                                      holder)
                if sidecar.healthcheck is not None and (sidecar.wait_healthy or self._awaited(sidecar)):
                    await wait_healthy(sidecar, lambda t, s=sidecar: self._probe(s, t),
                                       lambda s=sidecar: self._stopped(s), node=self.node)
        except BaseException as e:
            await asyncio.shield(self.owner.call(self.remove_blocking))
            if isinstance(e, SandboxError | asyncio.CancelledError):
                raise
            raise self.owner.failure(self.node, e, Event.START_FAILED, "start sidecars") from None

    def _awaited(self, sidecar: Sidecar) -> bool:
        """Another sidecar depends on this one: compose starts that one after this one is up."""
        return any(sidecar.name in other.depends_on for other in self.task.sidecars)

    def _create_network(self) -> dict:
        # Without a way out, the bridge also gets no address on the node (`inhibit_ipv4`): an internal
        # network's gateway is the node itself, where services bound to 0.0.0.0 answer (measured on the
        # dev nodes: a listener on the node was reached through it; with the option, "no route to host").
        options = {} if self.outbound else {"com.docker.network.bridge.inhibit_ipv4": "true"}
        return self.owner.api(self.node).create_network(
            self.network, driver="bridge", internal=not self.outbound, labels=self.labels, options=options,
            check_duplicate=True)

    def _create_volume(self, name: str) -> None:
        self.owner.api(self.node).create_volume(name=name, driver="local", labels=self.labels)
        self.made_volumes.append(name)

    def mounts(self, mounts: tuple[VolumeMount, ...]) -> tuple[tuple[str, str, bool], ...]:
        """A service's compose volumes as this sandbox's docker volumes: (volume, target, read-only)."""
        return tuple((self.volumes[m.volume], m.target, m.read_only) for m in mounts)

    async def _hold(self, sidecar: Sidecar) -> str:
        """A started holder on the private network as `sidecar`, the proxy listening in its namespace."""
        owner, node = self.owner, self.node
        api = owner.api(node)
        await owner.call(owner.node_images.build_net.ensure_image, node)

        def create() -> str:
            host_config = api.create_host_config(network_mode=self.network, security_opt=["no-new-privileges"],
                                                 cap_drop=["ALL"])
            networking = api.create_networking_config(
                {self.network: api.create_endpoint_config(aliases=[sidecar.name])})
            cid = api.create_container(HOLDER_IMAGE, command=["/pause"], host_config=host_config,
                                       networking_config=networking, hostname=sidecar.name,
                                       name=f"{self.network}-{sidecar.name}-holder"[:120],
                                       labels={**self.labels, SIDECAR_LABEL: f"{sidecar.name}.holder"})["Id"]
            self.holders[sidecar.name] = cid
            api.start(cid)
            return cid

        cid = await owner.call(create)
        await owner.node_images.build_net.attach(node, cid, Event.START_FAILED, f"sidecar {sidecar.name}'s way out")
        return cid

    async def detach_egress(self) -> list[EgressReport]:
        """What the sidecars did through the proxy (their holders detached); before their removal."""
        reports = []
        for cid in self.holders.values():
            with contextlib.suppress(EgressUnavailable):
                reports.append(await self.owner.egress.detach(cid))
        return reports

    def _create(self, sidecar: Sidecar, ref: str, cpus: float, memory_mb: int, holder: str | None = None) -> str:
        api = self.owner.api(self.node)
        config = self.owner.config
        host_config = api.create_host_config(
            nano_cpus=cpu_limit_nanos(cpus, self.owner.node_cpus.get(self.node, 0)), mem_limit=f"{memory_mb}m", memswap_limit=f"{memory_mb}m",
            pids_limit=config.pids_limit, network_mode=f"container:{holder}" if holder else self.network,
            security_opt=["no-new-privileges"], cap_drop=["ALL"], cap_add=list(SIDECAR_CAPS),
            mounts=[docker.types.Mount(target, source, type="volume", read_only=read_only)
                    for source, target, read_only in self.mounts(sidecar.mounts)] or None)
        networking = None if holder else api.create_networking_config(
            {self.network: api.create_endpoint_config(aliases=[sidecar.name])})
        environment = dict(sidecar.environment)
        if holder:
            others = [s.name for s in self.task.sidecars if s.name != sidecar.name]
            environment = {**self.owner.egress.proxy_env(no_proxy=[*others, MAIN]), **environment}
        kwargs = {}
        if sidecar.entrypoint is not None:
            kwargs["entrypoint"] = list(sidecar.entrypoint)
        if sidecar.command is not None:
            kwargs["command"] = list(sidecar.command)
        if sidecar.workdir:
            kwargs["working_dir"] = sidecar.workdir
        if sidecar.user:
            kwargs["user"] = sidecar.user
        name = f"{self.network}-{sidecar.name}"[:120]
        if not holder:  # in a holder's namespace, the holder has the name
            kwargs["hostname"] = sidecar.name
        container = api.create_container(
            ref, labels={**self.labels, SIDECAR_LABEL: sidecar.name}, environment=environment,
            host_config=host_config, networking_config=networking, name=name, **kwargs)
        cid = container["Id"]
        api.start(cid)
        return cid

    def main_networking(self) -> dict:
        """The sandbox's own endpoint: on the sidecars' network, as `main` (Harbor's service name)."""
        api = self.owner.api(self.node)
        return api.create_networking_config({self.network: api.create_endpoint_config(aliases=[MAIN])})

    async def _probe(self, sidecar: Sidecar, timeout_s: float) -> bool:
        api = self.owner.api(self.node)
        cid = self.containers[sidecar.name]

        def check() -> int | None:
            exec_id = api.exec_create(cid, list(sidecar.healthcheck.argv))["Id"]
            api.exec_start(exec_id)
            return api.exec_inspect(exec_id).get("ExitCode")

        try:
            return await asyncio.wait_for(self.owner.call(check), timeout_s) == 0
        except TimeoutError:
            return False
        except docker.errors.APIError:
            return False  # not running (yet): `_stopped` says which

    async def _stopped(self, sidecar: Sidecar) -> str | None:
        api = self.owner.api(self.node)
        cid = self.containers[sidecar.name]
        state = (await self.owner.call(api.inspect_container, cid))["State"]
        if state.get("Running"):
            return None
        logs = await self.owner.call(api.logs, cid, tail=5)
        return f"exit {state.get('ExitCode')} ({' '.join(logs.decode(errors='replace').split())[-200:] or 'no output'})"

    # ------------------------------------------------------------------ Harbor's collection pass

    def _container(self, service: str) -> str:
        cid = self.containers.get(service)
        if cid is None:
            raise SandboxError(Event.PROVIDER_FAILED, f"the sandbox has no sidecar {service!r}", node=self.node)
        return cid

    async def exec_in(self, service: str, command: str, *, timeout_s: float, user: str | None) -> ExecResult:
        """Run `command` with sh in the sidecar, as compose exec does (its own user and folder, no env of the
        sandbox's). Past `timeout_s` it is reported timed out; where the image has `timeout` it is killed a
        second later (so it frees the provider's thread that waits on it), else it ends with the sidecar."""
        cid, started = self._container(service), time.monotonic()
        quoted = shlex.quote(command)
        bounded = (f"if command -v timeout >/dev/null 2>&1; then exec timeout -s KILL {math.ceil(timeout_s) + 1} "
                   f"/bin/sh -c {quoted}; else exec /bin/sh -c {quoted}; fi")

        def run() -> tuple[int | None, bytes]:
            exec_id = self.owner.api(self.node).exec_create(cid, ["/bin/sh", "-c", bounded], user=user or "")["Id"]
            output = self.owner.api(self.node, stream=True).exec_start(exec_id)
            return self.owner.api(self.node).exec_inspect(exec_id).get("ExitCode"), output

        try:
            code, output = await asyncio.wait_for(self.owner.call(run), timeout_s)
        except TimeoutError:
            return ExecResult(exit_code=None, output="", timed_out=True, duration_s=time.monotonic() - started)
        except docker.errors.APIError as e:
            raise SandboxError(Event.PROVIDER_FAILED, f"sidecar {service}: {e}", node=self.node) from None
        text = output.decode(errors="replace")
        return ExecResult(exit_code=code, output=text[-_OUTPUT_CHARS:], duration_s=time.monotonic() - started,
                          truncated_chars=max(0, len(text) - _OUTPUT_CHARS))

    async def archive_of(self, service: str, remote_path: str) -> bytes:
        """The tar archive docker gives of `remote_path` in the sidecar; `SandboxError` "no such" when absent."""
        cid = self._container(service)

        def get() -> bytes:
            stream, _ = self.owner.api(self.node).get_archive(cid, remote_path)
            return b"".join(stream)

        try:
            return await self.owner.call(get)
        except docker.errors.NotFound:
            raise SandboxError(Event.PROVIDER_FAILED, f"no such file {remote_path} in sidecar {service}",
                               node=self.node) from None
        except docker.errors.APIError as e:
            raise SandboxError(Event.PROVIDER_FAILED, f"sidecar {service}: {e}", node=self.node) from None

    def info(self) -> dict:
        holders = {f"{name}.holder": cid for name, cid in self.holders.items()}
        return {"network": self.network, "network_id": self.network_id, "sidecars": {**self.containers, **holders},
                **({"volumes": list(self.made_volumes)} if self.made_volumes else {})}

    def remove_blocking(self) -> None:
        """Remove the sidecars, then their holders, then their network (a network with containers on it
        cannot go), then the volumes (the sandbox itself is gone by then: a volume in use cannot go)."""
        remove_sidecars(self.owner.api(self.node), [*self.containers.values(), *self.holders.values()],
                        self.network_id, self.made_volumes)


def remove_sidecars(api, container_ids: list[str], network_id: str | None, volumes: Sequence[str] = ()) -> None:
    """Remove sidecar containers, then their network, then the sandbox's volumes; what is gone already is
    no error."""
    for cid in container_ids:
        with contextlib.suppress(docker.errors.NotFound):
            api.remove_container(cid, force=True, v=True)
    if network_id:
        with contextlib.suppress(docker.errors.NotFound):
            api.remove_network(network_id)
    for volume in volumes:
        with contextlib.suppress(docker.errors.NotFound):
            api.remove_volume(volume, force=True)
