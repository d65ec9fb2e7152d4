"""A process sandbox's own network namespace, and its sidecars: each a sandboxed process in it.

The namespace is also where the node's egress proxy listens for a sandbox that goes out through it
(`[egress] mode = "allow"`, rl360cli/egress/proxy.py): a sandbox with a network then gets one, sidecars or not.

A process sandbox's commands normally get a fresh network namespace each (process/provider.py); a sidecar must
outlive them and be reachable from every one. So a sandbox with sidecars gets one namespace of its
own, held by a `sleep` under bubblewrap (`--unshare-net`: only its own loopback, never the host's),
and everything of the sandbox joins it (`nsenter --net`, then bubblewrap with `--share-net`):

- each sidecar runs as its own process sandbox: its image built like the task's (process/image.py;
  the host stands in for an `image:`), its own folder, its own uid (the agent's code cannot signal it
  or read its files), the same rlimits, seccomp filter and read-only host; its command is compose's,
  else its Dockerfile's ENTRYPOINT / CMD;
- it listens in that namespace; the sandbox reaches it by its service name, which the sandbox's own
  `/etc/hosts` maps to a loopback address of its own (127.0.0.2, 127.0.0.3, ...: a server bound to
  0.0.0.0 answers there, as it does at its container address under Docker);
- another sandbox has its own namespace: nothing there leads to these sidecars, and the host's
  loopback is not in either;
- a task with a network gets slirp4netns once, on the shared namespace (process/outbound.py), not per command.

The task's compose volumes are folders of the sandbox's own (`<sandbox>/volumes/<name>`, writable by
the sandbox's and the sidecars' uids), bound at their targets in each service that names them, `main`
included (`volume_binds`), and removed with the sandbox's folder.

Unlike Docker, the sandbox and its sidecars share one network namespace: the sandbox also reaches a
sidecar at 127.0.0.1, and two services (or a service and the agent) cannot listen on one port.
Joining a namespace the provider did not create needs root: without it the process provider says it
does not start sidecars, and placement refuses the task naming the docker provider.

Used by process/provider.py. Test: tests/sandbox/test_sidecars.py (real bubblewrap).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from rl360cli.sandbox.process.isolation import DEFAULT_PATH, RESERVED, chown_tree, filled_pipe, rlimit_args
from rl360cli.sandbox.process.outbound import OutboundNet, read_bwrap_info
from rl360cli.sandbox.sidecars import Sidecar, VolumeMount, hosts_file, image_task, volume_names, wait_healthy
from rl360cli.sandbox.taxonomy import Event, SandboxError

NODE = "local"
# How long a network namespace's holder may take to set its loopback up: setting one up can wait on the kernel's
# lock while it cleans up ended ones (one per command of a bubblewrap-per-command sandbox): a likely cause of
# one of six sandboxes missing a 10 s wait in CI on 2 busy cores (2026-12-07).
HOLDER_WAIT_S = 60.0
# A sidecar lives as long as its sandbox: its CPU-time limit is for runaways only.
_LIFETIME_CPU_S = 10**7


class ProcessSidecars:
    """The shared network namespace and the sidecar processes of one process sandbox."""

    def __init__(self, owner, task, folder: Path):
        self.owner = owner
        self.task = task
        self.folder = folder / "sidecars"
        self.holder: subprocess.Popen | None = None
        self.holder_pid: int | None = None
        self.net: OutboundNet | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.uids: list[tuple[int, int]] = []
        self.uid_of: dict[str, int] = {}
        self.addresses = {s.name: f"127.0.0.{index + 2}" for index, s in enumerate(task.sidecars)}
        self.hosts = self.folder / "hosts"
        # The system trust bundle with the egress CA, over the host's (rl360cli/egress/trust.py), once attached.
        self.trust_binds: tuple[tuple[str, str], ...] = ()

    @property
    def netns(self) -> str:
        """The namespace to join; `SandboxError` once its holder is gone (never a reused pid's)."""
        # poll() is the only place the holder is reaped: while it returns None its pid cannot be reused.
        if self.holder is None or self.holder.poll() is not None:
            raise SandboxError(Event.SANDBOX_KILLED, "the sandbox's network namespace is gone", node=NODE)
        return f"/proc/{self.holder_pid}/ns/net"

    def ro_binds(self) -> tuple[tuple[str, str], ...]:
        return ((str(self.hosts), "/etc/hosts"), *self.trust_binds)

    async def start(self, *, networked: bool) -> None:
        """The namespace (with slirp4netns when `networked`), then each sidecar, waiting where compose
        waits; on failure everything made is stopped and `SandboxError` raised."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.hosts.write_text(hosts_file(self.addresses))
            os.chmod(self.hosts, 0o644)
            await self.owner.files(self._hold)
            if networked:
                self.net = OutboundNet(self.owner.isolation.slirp)
                await self.owner.files(self.net.attach, self.holder_pid)
            for sidecar in self.task.sidecars:
                await self._start_one(sidecar)
                if sidecar.healthcheck is not None and (sidecar.wait_healthy or any(
                        sidecar.name in other.depends_on for other in self.task.sidecars)):
                    await wait_healthy(sidecar, lambda t, s=sidecar: self._probe(s, t),
                                       lambda s=sidecar: self._stopped(s), node=NODE)
        except BaseException:
            await asyncio.shield(self.owner.files(self.stop))
            raise

    def _hold(self) -> None:
        """A `sleep` in a fresh network namespace (bubblewrap brings its loopback up); dies with rl360."""
        iso = self.owner.isolation
        info_r, info_w = os.pipe()
        argv = [iso.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-net", "--die-with-parent",
                "--info-fd", str(info_w), "--", "sleep", "infinity"]
        try:
            self.holder = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, pass_fds=(info_w,), start_new_session=True)
        finally:
            os.close(info_w)
        info = read_bwrap_info(info_r)
        if not info or "child-pid" not in info:
            raise SandboxError(Event.START_FAILED, "bubblewrap could not make the sandbox's network namespace",
                               node=NODE)
        if not _became(int(info["child-pid"]), "sleep"):
            raise SandboxError(Event.START_FAILED, "the sandbox's network namespace did not come up (its loopback "
                               f"was not set up in {HOLDER_WAIT_S:g} s)", node=NODE)
        self.holder_pid = int(info["child-pid"])

    async def _start_one(self, sidecar: Sidecar) -> None:
        iso = self.owner.isolation
        image = await self.owner.images.ensure(image_task(self.task, sidecar)) if sidecar.dockerfile else None
        argv = sidecar.argv()
        if not argv:
            raise SandboxError(Event.START_FAILED, f"sidecar {sidecar.name} has no command (neither compose's "
                               "`command` nor its Dockerfile's CMD)", node=NODE)
        fs = self.folder / sidecar.name / "fs"
        fs.mkdir(parents=True)
        if image is not None and image.tree is not None:
            await self.owner.files(shutil.copytree, image.tree, fs, symlinks=True, dirs_exist_ok=True)
        workdir = sidecar.workdir or (image.workdir if image else None) or "/tmp"
        for path in (workdir, "/tmp", *mount_points(sidecar.mounts, f"{self.task.id} service {sidecar.name}")):
            (fs / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
        uid = None
        if self.owner.uids is not None:
            uid, fd = self.owner.uids.acquire()
            self.uids.append((uid, fd))
            self.uid_of[sidecar.name] = uid
            chown_tree(fs, uid)
        os.chmod(fs / "tmp", 0o1777)
        limits = self._limits(_LIFETIME_CPU_S)
        seccomp = filled_pipe(iso.seccomp) if iso.seccomp is not None else None
        command = "exec " + shlex.join(argv)
        full = iso.argv(fs, command, workdir=workdir, limits=limits, uid=uid, seccomp_fd=seccomp, netns=self.netns,
                        ro_binds=self.ro_binds(), binds=volume_binds(self.folder.parent, sidecar.mounts))
        env = {"PATH": DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp", "MALLOC_ARENA_MAX": "2",
               "HOSTNAME": sidecar.name, **(image.env if image else {}), **sidecar.environment}
        log = open(self.folder / f"{sidecar.name}.log", "wb")  # noqa: SIM115 — the sidecar keeps writing to it
        try:
            self.procs[sidecar.name] = subprocess.Popen(
                full, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                pass_fds=(seccomp,) if seccomp is not None else (), start_new_session=True,
                **iso.spawn_kwargs(uid, limits))
        except OSError as e:
            raise SandboxError(Event.START_FAILED, f"cannot start sidecar {sidecar.name}: {e}", node=NODE) from None
        finally:
            log.close()
            if seccomp is not None:
                os.close(seccomp)

    def _limits(self, cpu_s: float) -> list[str]:
        _, memory_mb = self.owner.reservation(self.task)
        config = self.owner.config
        return rlimit_args(memory_mb=memory_mb, pids=config.pids_limit,
                           file_mb=min(config.max_file_mb, self.task.storage_mb),
                           open_files=config.max_open_files, cpu_s=max(1, math.ceil(cpu_s)) + 1)

    async def _probe(self, sidecar: Sidecar, timeout_s: float) -> bool:
        """The sidecar's healthcheck, once: in its own folder and the shared namespace, as its uid."""
        iso = self.owner.isolation
        fs = self.folder / sidecar.name / "fs"
        uid = self.uid_of.get(sidecar.name)
        seccomp = filled_pipe(iso.seccomp) if iso.seccomp is not None else None
        limits = self._limits(timeout_s)
        argv = iso.argv(fs, shlex.join(sidecar.healthcheck.argv), workdir="/tmp", limits=limits, uid=uid,
                        seccomp_fd=seccomp, netns=self.netns, ro_binds=self.ro_binds(),
                        binds=volume_binds(self.folder.parent, sidecar.mounts))
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={"PATH": DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", **sidecar.environment},
                pass_fds=(seccomp,) if seccomp is not None else (), start_new_session=True,
                **iso.spawn_kwargs(uid, limits))
        finally:
            if seccomp is not None:
                os.close(seccomp)
        try:
            return await asyncio.wait_for(proc.wait(), timeout_s) == 0
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return False

    async def _stopped(self, sidecar: Sidecar) -> str | None:
        proc = self.procs[sidecar.name]
        if proc.poll() is None:
            return None
        try:
            tail = (self.folder / f"{sidecar.name}.log").read_bytes()[-400:].decode(errors="replace")
        except OSError:
            tail = ""
        return f"exit {proc.returncode} ({' '.join(tail.split())[-200:] or 'no output'})"

    def stop(self) -> None:
        """End the sidecars, the NAT and the namespace's holder, and free the sidecars' uids (blocking)."""
        for proc in [*self.procs.values(), *([self.holder] if self.holder else [])]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        for proc in [*self.procs.values(), *([self.holder] if self.holder else [])]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        if self.net is not None:
            self.net.close()
            self.net = None
        for _, fd in self.uids:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.uids.clear()
        self.procs.clear()


def make_volumes(folder: Path, task) -> None:
    """The sandbox's compose volumes: a folder each under `folder`/volumes, writable by every uid of the
    sandbox (its own and its sidecars'), inside the sandbox's folder that no other sandbox reaches."""
    for name in volume_names(task):
        path = folder / "volumes" / name
        path.mkdir(parents=True)
        os.chmod(path, 0o777)


def mount_points(mounts: tuple[VolumeMount, ...], where: str) -> tuple[str, ...]:
    """The targets of a service's compose volumes, made in its folder before it starts; a target in a folder
    the host binds read-only (/usr, /etc, ...) cannot take a mount: `SandboxError`."""
    for m in mounts:
        if m.target.strip("/").split("/")[0] in RESERVED or m.target == "/":
            raise SandboxError(Event.START_FAILED, f"{where}: compose volume {m.volume} at {m.target} is in a "
                               "folder a process sandbox takes read-only from the host: use the docker provider",
                               node=NODE)
    return tuple(m.target for m in mounts)


def volume_binds(folder: Path, mounts: tuple[VolumeMount, ...]) -> tuple[tuple[str, str, bool], ...]:
    """(host folder, target, read-only) of a service's compose volumes in the sandbox whose folder is `folder`."""
    return tuple((str(folder / "volumes" / m.volume), m.target, m.read_only) for m in mounts)


def _became(pid: int, command: str, timeout_s: float = HOLDER_WAIT_S) -> bool:
    """Wait until process `pid` runs `command`: bubblewrap reports its child's pid before the child has set up
    the namespace's loopback, and the egress proxy must find 127.0.0.1 there to listen on."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == command:
                    return True
        except OSError:
            return False
        time.sleep(0.001)
    return False
