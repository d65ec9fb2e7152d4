"""A docker sandbox: one container of a docker provider's, and the commands and files of its attempt.

Commands run with `docker exec` (bash when the image has it, else sh), as the image's USER unless
told otherwise, each first waiting for the container's init to have made its folders. At a
command's timeout every process in the container but its init is killed; what the agent leaves running
lives on through the verifier (Harbor's rule) and ends once the attempt is done with the sandbox. An OOM
kill of a command is read from the daemon's `oom` events; a container that dies, or a daemon that stops answering,
mid-attempt is a `SandboxError` (`sandbox_killed` / `node_unreachable`); a container paused from
outside is waited for (`PAUSE_WAIT_S`). Files go in and out as tar archives (`put_archive`,
`get_archive`), owned by root. `stop` hands the container back to its provider, which removes it.

Made by `DockerProvider.start` (docker/provider.py). Test: tests/sandbox/test_docker_provider.py,
tests/sandbox/test_security.py, tests/sandbox/test_faults.py (the dev Docker nodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import posixpath
import shlex
import shutil
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import docker.errors

from rl360cli.egress.client import EgressReport, EgressUnavailable
from rl360cli.sandbox.docker.container import ContainerSpec, within
from rl360cli.sandbox.docker.entrypoint import ENTRYPOINT_WAIT_S, SNAPSHOT, kill_except, parse_snapshot
from rl360cli.sandbox.docker.errors import as_sandbox_error, node_lost
from rl360cli.sandbox.docker.owner import SandboxOwner
from rl360cli.sandbox.docker.sidecars import DockerSidecars
from rl360cli.sandbox.provider import ExecResult, OutputBuffer, Sandbox, containers_of, own_command_failed
from rl360cli.sandbox.taxonomy import Event, SandboxError

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
    mode = f" && chmod 777 {q}" if within(posixpath.normpath(path), "/logs") else ""
    return (f"rm -rf {q} 2>/dev/null; mkdir -p {q} && rm -rf {q}/* {q}/.[!.]* {q}/..?* && [ ! -L {q} ] && "
            f'[ -z "$(ls -A {q})" ]{mode}')


def prepare_verifier_command(kept: tuple[int, ...] = (), *, kill: bool = False) -> str:
    """Empty /tests and /logs/verifier; with `kill`, first kill every process but the init (and `kept`:
    what the image's entrypoint started)."""
    reset = f"{reset_command('/tests')} && {reset_command('/logs/verifier')}"
    if not kill:
        return reset
    return f"{kill_except(kept) if kept else 'kill -9 -1 2>/dev/null'}; {reset}"


class DockerSandbox(Sandbox):
    provider = "docker"

    def __init__(self, owner: SandboxOwner, task, spec: ContainerSpec, *, node: str, container_id: str, name: str,
                 image: str, warm: bool, attempt_id: str, created: float, network: str, network_denied: bool,
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
        self._egress: EgressReport | None = None
        # SSL_CERT_FILE naming the system bundle that holds the egress CA, for every command (egress/trust.py).
        self.trust_env: dict[str, str] = {}
        # Set by `settle`: what every command's environment adds (NO_PROXY with /etc/hosts' names), and the
        # processes the image's entrypoint left running, which a kill before the verifier spares.
        self._exec_env: dict[str, str] = {}
        self._kept_pids: tuple[int, ...] = ()

    @property
    def workdir(self) -> str:
        return self.spec.workdir

    def info(self) -> dict[str, Any]:
        return {"node": self.node, "provider": "docker", "task": self.task.id, "attempt": self.attempt_id,
                "container_id": self.container_id, "name": self.name, "image": self.image,
                "image_id": self.owner.images.get((self.node, self.image)), "warm": self.warm,
                "pool_hit": self.pool_hit,
                "docker_host": self.owner.specs[self.node].docker_host,
                "network": "egress" if self.spec.egress else self.network,
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
                    self.container_id, [*SHELL, AWAIT_INIT + command],
                    environment={**self.trust_env, **self._exec_env, **(env or {})},
                    user=user or owner.node_images.users.get((node, self.image), ""),
                    workdir=self.spec.workdir)))["Id"]
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

    async def settle(self) -> None:
        """Before the agent: run the image's ENTRYPOINT as Harbor would (docker/entrypoint.py), then learn
        what it left (its processes, spared by a kill before the verifier) and, for a sandbox whose commands
        go through the egress proxy, the names its /etc/hosts maps (never the proxy's to resolve)."""
        owner, node = self.owner, self.node
        entrypoint = owner.node_images.entrypoints.get((node, self.image), ())
        if not entrypoint and not self.spec.egress:
            return
        if entrypoint:
            await self._run_entrypoint(entrypoint)
        # Through the proxy, also for what runs as root without the environment (`sudo apt-get`): one exec with
        # the snapshot, which then sees none of its processes.
        configure = f"{owner.egress.system_config_command()}; " if self.spec.egress else ""
        snapshot = await self.exec(configure + SNAPSHOT, timeout_s=30, user="root")
        if snapshot.exit_code != 0:
            raise own_command_failed(snapshot, f"cannot read what {self.id} holds", node=node)
        names, pids = parse_snapshot(snapshot.output)
        if entrypoint:
            self._kept_pids = pids
        if self.spec.egress:
            base = dict(self.spec.env).get("NO_PROXY", "")
            listed = base.split(",") if base else []
            local = ",".join([*listed, *(n for n in names if n not in listed)])
            self._exec_env = {"NO_PROXY": local, "no_proxy": local}

    async def _run_entrypoint(self, entrypoint: tuple[str, ...]) -> None:
        owner, node = self.owner, self.node
        api = owner.api(node)
        try:
            exec_id = (await owner.call(lambda: api.exec_create(
                self.container_id, [*entrypoint, "true"], environment=self._exec_env,
                user=owner.node_images.users.get((node, self.image), ""), workdir=self.spec.workdir)))["Id"]
            await owner.call(lambda: api.exec_start(exec_id, detach=True))
            deadline = time.monotonic() + ENTRYPOINT_WAIT_S
            while True:
                state = await owner.call(lambda: api.exec_inspect(exec_id))
                if not state.get("Running") or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
        except Exception as e:  # noqa: BLE001
            raise await self._lost(e) from None
        if not state.get("Running") and state.get("ExitCode"):
            raise SandboxError(Event.START_FAILED, f"the image's ENTRYPOINT {list(entrypoint)} exited "
                               f"{state.get('ExitCode')} (run as Harbor does, before the agent)", node=node)

    async def prepare_verifier(self) -> None:
        """One exec: empty /tests and /logs/verifier. What the agent left running stays alive for the
        verifier, as Harbor leaves it ([sandbox] end_agent_before_verifier kills it first, sparing what the
        image's entrypoint started)."""
        prepare = prepare_verifier_command(self._kept_pids, kill=self.config.end_agent_before_verifier)
        result = await self.exec(prepare, timeout_s=60, user="root")
        if result.limit == "processes":
            # It could not start: what the agent left holds every pid, so no verifier could run either.
            # The init kills it, then once more.
            await self._kill_all()
            result = await self.exec(prepare, timeout_s=60, user="root")
        if result.exit_code != 0:
            raise own_command_failed(result, f"cannot prepare the verifier in {self.id}", node=self.node)

    async def _new_oom(self) -> bool:
        """True when the daemon reported an OOM kill in this container since the last look."""
        owner, node = self.owner, self.node
        until = time.time() + owner.clock_offset(node) + 0.5
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
        # dockerd sets OOMKilled from containerd's OOM event, which may come after the exit it followed: read the
        # state again now that the grace has passed, so an OOM kill is not recorded as a kill from outside.
        try:
            state = (await self.owner.call(
                lambda: self.owner.api(self.node).inspect_container(self.container_id)))["State"]
        except Exception:  # noqa: BLE001 — removed meanwhile: what was read before is all there is
            pass
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
            return node_lost(node, error)
        try:
            state = (await self.owner.call(
                lambda: self.owner.api(node).inspect_container(self.container_id)))["State"]
        except docker.errors.NotFound:
            return SandboxError(Event.SANDBOX_KILLED, f"container {self.id} on {node} was removed from outside",
                                node=node)
        except Exception as e:  # noqa: BLE001
            return as_sandbox_error(node, e, Event.PROVIDER_FAILED, "inspect container")
        if not state.get("Running"):
            return await self._dead(state)
        return as_sandbox_error(node, error, Event.PROVIDER_FAILED, "exec")

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

    async def service_exec(self, service: str, command: str, *, timeout_s: float,
                           user: str | None = None) -> ExecResult:
        if self.sidecars is None:
            raise SandboxError(Event.PROVIDER_FAILED, f"the sandbox has no sidecar {service!r}", node=self.node)
        return await self.sidecars.exec_in(service, command, timeout_s=timeout_s, user=user)

    async def service_download(self, service: str, remote_path: str, local_path: Path | str) -> None:
        if self.sidecars is None:
            raise SandboxError(Event.PROVIDER_FAILED, f"the sandbox has no sidecar {service!r}", node=self.node)
        data = await self.sidecars.archive_of(service, remote_path)
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

    def egress_report(self) -> EgressReport | None:
        return self._egress

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.spec.egress or self.door_route is not None:  # what the proxy counted, before the namespace goes
            try:
                self._egress = await self.owner.egress.detach(self.container_id)
            except EgressUnavailable as e:  # the proxy died under the sandbox: its network failed it
                line = f"rl360 egress: {e}"
                self._egress = EgressReport(failed={"egress-proxy": 1}, lines=(line,), failure=line)
        if self.sidecars is not None and self.sidecars.holders:  # what its sidecars fetched is the sandbox's too
            self._egress = EgressReport.merged([self._egress, *await self.sidecars.detach_egress()])
        # Nothing waits on the removal (the reservation is free once the attempt ends): the provider
        # finishes it in the background, and its close waits for it.
        if self.sidecars is None:
            self.owner.release(self.node, self.spec, self.container_id)
        else:
            self.owner.release(self.node, self.spec, self.container_id, containers=containers_of(self.task),
                               then=self.sidecars.remove_blocking)


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
