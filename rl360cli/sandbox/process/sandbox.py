"""A process sandbox: a private folder on this machine, and the commands and files of its attempt.

Each command runs in a bubblewrap of its own (rl360cli/sandbox/process/isolation.py builds its argv), with
the sandbox's rlimits, its uid when rl360 runs as root, and its network: a fresh namespace, the sandbox's
own (sidecars, the egress proxy) or slirp4netns's outbound NAT (process/outbound.py). With `[sandbox]
process_namespace = "sandbox"` commands run through the sandbox's keeper instead (process/keeper.py), so
what a command leaves running lives until the sandbox stops; host-side file operations then run with the
sandbox's processes stopped. Files go in and out by copying within the sandbox's folder, never
following a symbolic link the sandbox planted. `keep_alive` makes it a fleet member; `stop` hands the
folder back to its provider, which removes it.

Made by `ProcessProvider.start` (process/provider.py). Test: tests/sandbox/test_process_provider.py,
tests/sandbox/test_security.py, tests/sandbox/test_process_keeper.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import math
import os
import posixpath
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl360cli import procinfo
from rl360cli.egress.client import EgressReport, EgressUnavailable
from rl360cli.sandbox.process.isolation import DEFAULT_PATH, RESERVED, chown_tree, filled_pipe, rlimit_args
from rl360cli.sandbox.process.keeper import KEEPER_PATH, Keeper, KeeperGone, prelude
from rl360cli.sandbox.process.outbound import attach_outbound
from rl360cli.sandbox.process.owner import SandboxOwner
from rl360cli.sandbox.process.sidecars import ProcessSidecars, volume_binds
from rl360cli.sandbox.provider import ExecResult, OutputBuffer, Sandbox
from rl360cli.sandbox.task import resolve_env
from rl360cli.sandbox.taxonomy import Event, SandboxError

# The one node of the process provider: this machine.
NODE = "local"


class ProcessSandbox(Sandbox):
    provider = "process"

    def __init__(self, owner: SandboxOwner, task, *, sid: str, folder: Path, uid: int | None,
                 lock_fd: int | None, attempt_id: str, image_env: dict[str, str], start_s: float,
                 sidecars: ProcessSidecars | None = None, network: str = "none", network_denied: bool = False,
                 trust_env: Mapping[str, str] | None = None):
        self.owner = owner
        # SSL_CERT_FILE and REQUESTS_CA_BUNDLE naming the bundle that holds the egress CA (egress/trust.py).
        self.trust_env = dict(trust_env or {})
        # The sandbox's own network namespace (with its sidecars, if the task has any), or None.
        self.sidecars = sidecars
        self.network = network
        # The task wanted the internet and got none (rl360cli/sandbox/network.py).
        self.network_denied = network_denied
        self._egress: EgressReport | None = None
        self._released = False
        self.config = owner.config
        self.task = task
        self.id = sid
        self.node = NODE
        self.folder = folder
        self.fs = folder / "fs"
        self._fs_real = os.path.realpath(self.fs)
        self.uid = uid
        self._lock_fd = lock_fd
        self.attempt_id = attempt_id
        self.image_env = image_env
        self.start_s = start_s
        self._procs: set[asyncio.subprocess.Process] = set()
        self._stopped = False
        self.keeper: dict[str, Any] | None = None
        # [sandbox] process_namespace = "sandbox": the process whose namespaces the commands join, and the
        # sandbox's top-level folders when it started (a new one, made by an upload, needs a new keeper).
        self._kept: Keeper | None = None
        self._kept_entries: tuple[str, ...] = ()
        self._kept_busy = False  # a command is on its way through the keeper

    def info(self) -> dict[str, Any]:
        out = {"node": NODE, "provider": "process", "task": self.task.id, "attempt": self.attempt_id,
               "folder": str(self.folder), "uid": self.uid, "image": self.owner.image_ref(self.task),
               "container_id": None, "pid": None, "network": self.network,
               "network_denied": self.network_denied}
        if self.task.sidecars:
            out["sidecars"] = dict(self.sidecars.addresses)
        if self.keeper:
            out.update(self.keeper)
        return out

    # ------------------------------------------------------------------ exec

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = {"PATH": DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp",
               # glibc reserves 64 MB of address space per malloc arena and thread; under an address-space
               # limit that would fail multi-threaded programs long before they use the memory.
               "MALLOC_ARENA_MAX": "2"}
        env.update(self.image_env)  # expanded when the image was built
        env.update(self.task_env())
        if self.network == "egress":
            env.update(self.owner.egress.proxy_env(no_proxy=[s.name for s in self.task.sidecars]))
            env.update(self.trust_env)
        if extra:
            env.update({str(k): str(v) for k, v in extra.items()})
        return env

    def task_env(self) -> dict[str, str]:
        try:
            return resolve_env(self.task.env)
        except KeyError as e:
            raise SandboxError(Event.PROVIDER_FAILED, f"[environment.env] needs ${{{e.args[0]}}}, which is not set",
                               node=NODE) from None

    def _limits(self, timeout_s: float) -> list[str]:
        _, memory_mb = self.owner.reservation(self.task)
        return rlimit_args(memory_mb=memory_mb, pids=self.config.pids_limit,
                           file_mb=min(self.config.max_file_mb, self.task.storage_mb),
                           open_files=self.config.max_open_files, cpu_s=max(1, math.ceil(timeout_s)) + 1)

    async def exec(self, command: str, *, timeout_s: float, env: Mapping[str, str] | None = None,
                   user: str | None = None) -> ExecResult:
        # `user` is not honoured: every command of a process sandbox runs as the sandbox's own uid.
        if self._stopped:
            raise SandboxError(Event.SANDBOX_KILLED, f"sandbox {self.id} was stopped", node=NODE)
        if not self.fs.is_dir():
            raise SandboxError(Event.SANDBOX_KILLED, f"sandbox folder {self.fs} was removed from outside",
                               node=NODE)
        if self.owner.keeps_namespaces:
            kept = await self._exec_kept(command, timeout_s=timeout_s, env=env)
            if kept is not None:
                return kept
        iso = self.owner.isolation
        limits = self._limits(timeout_s)
        # With sidecars the command joins the sandbox's own namespace, whose NAT (if any) is attached already.
        shared = self.sidecars is not None
        networked = self.network == "slirp4netns" and not shared
        info_r = info_w = block_r = block_w = seccomp_r = None
        if iso.bwrap:
            info_r, info_w = os.pipe()
            if networked:  # the command waits until slirp4netns is attached to its namespace
                block_r, block_w = os.pipe()
            if iso.seccomp is not None:
                seccomp_r = filled_pipe(iso.seccomp)
        workdir = self.task.workdir
        try:
            shared_net = {"netns": self.sidecars.netns, "ro_binds": self.sidecars.ro_binds()} if shared else {}
        except SandboxError:
            close_fds(info_r, info_w, block_r, block_w, seccomp_r)
            raise
        argv = iso.argv(self.fs, command, workdir=workdir, limits=limits, uid=self.uid, info_fd=info_w,
                        block_fd=block_r, seccomp_fd=seccomp_r,
                        binds=volume_binds(self.folder, self.task.volume_mounts), **shared_net)
        kwargs: dict[str, Any] = {"start_new_session": True, **iso.spawn_kwargs(self.uid, limits)}
        kwargs["pass_fds"] = tuple(fd for fd in (info_w, block_r, seccomp_r) if fd is not None)
        cwd = self.fs / workdir.lstrip("/") if not iso.bwrap else None
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                        stderr=subprocess.STDOUT, env=self._env(env), cwd=cwd,
                                                        **kwargs)
        except OSError as e:
            close_fds(info_r, block_w)  # ours; the child's ends are closed below
            raise SandboxError(Event.PROVIDER_FAILED, f"cannot start a command in sandbox {self.id}: {e}",
                               node=NODE) from None
        finally:
            close_fds(info_w, block_r, seccomp_r)  # the child's ends
        self._procs.add(proc)
        net = None
        set_up: bool | None = None
        if networked:
            try:
                net, set_up = await attach_outbound(iso.slirp, info_r, block_r, self.owner.files)
            except BaseException:
                await asyncio.shield(_kill(proc))
                self._procs.discard(proc)
                close_fds(block_w)
                raise
            info_r = None  # read and closed
            close_fds(block_w)  # lets the command start (or, when bwrap failed, nothing is waiting)
        buffer = OutputBuffer(self.config.max_output_chars)
        timed_out = False
        try:
            async with asyncio.timeout(timeout_s):
                while chunk := await proc.stdout.read(1 << 16):
                    buffer.feed(chunk)
                await proc.wait()
        except TimeoutError:
            timed_out = True
            await _kill(proc)
        except BaseException:
            await asyncio.shield(_kill(proc))
            close_fds(info_r)
            raise
        finally:
            self._procs.discard(proc)
            if net is not None:  # slirp4netns exits once its exit pipe closes: reaped off the event loop
                await asyncio.shield(self.owner.files(net.close))
        duration = time.monotonic() - started
        if set_up is None:
            set_up = _read_info(info_r) if info_r is not None else True
        if not set_up and not timed_out:
            output, _ = buffer.text()
            raise SandboxError(Event.PROVIDER_FAILED, f"bubblewrap could not set up sandbox {self.id}: "
                               f"{output.strip()[-300:]}", node=NODE)
        return _result(None if timed_out else proc.returncode, buffer, timed_out=timed_out, duration_s=duration)

    # ------------------------------------------------------------------ the keeper

    def _entries(self) -> tuple[str, ...]:
        return tuple(sorted(entry for entry in os.listdir(self.fs) if entry not in RESERVED))

    async def start_keeper(self) -> None:
        """Start the sandbox's keeper (process/keeper.py): the provider's argv around it, the filter that also
        refuses SIGCONT, no CPU limit of its own (each command gets its own)."""
        iso = self.owner.isolation
        limits = self._limits(10**7)
        shared = self.sidecars is not None
        networked = self.network == "slirp4netns" and not shared
        entries = self._entries()
        ro_binds: tuple = ((str(self.owner.keeper_sh), KEEPER_PATH),)
        netns = None
        if shared:
            netns, ro_binds = self.sidecars.netns, ro_binds + tuple(self.sidecars.ro_binds())
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe() if networked else (None, None)
        seccomp_r = filled_pipe(self.owner.keeper_seccomp)
        argv = iso.argv(self.fs, "true", workdir=self.task.workdir, limits=limits, uid=self.uid, info_fd=info_w,
                        block_fd=block_r, seccomp_fd=seccomp_r, init=False, netns=netns, ro_binds=ro_binds,
                        binds=volume_binds(self.folder, self.task.volume_mounts))
        try:
            keeper = await Keeper.start(argv, env=self._env(None), kwargs=iso.spawn_kwargs(self.uid, limits),
                                        pass_fds=tuple(fd for fd in (info_w, block_r, seccomp_r) if fd is not None),
                                        info_r=info_r, block_w=block_w, slirp=iso.slirp if networked else None,
                                        files=self.owner.files)
        except SandboxError as e:
            raise SandboxError(e.event, f"sandbox {self.id}: {e.detail}", node=NODE) from None
        try:
            await keeper.ready(self.config.start_timeout_s)
        except (KeeperGone, TimeoutError) as e:
            await asyncio.shield(keeper.end(self.owner.files))
            raise SandboxError(Event.START_FAILED, f"the keeper of sandbox {self.id} did not start: "
                               f"{keeper.words.strip()[-300:] or e}", node=NODE) from None
        self._kept, self._kept_entries = keeper, entries

    async def _exec_kept(self, command: str, *, timeout_s: float, env: Mapping[str, str] | None) -> ExecResult | None:
        """Run `command` through the sandbox's keeper; None when it must run on its own instead: another
        command is in flight there, a name of `env` is no shell name, or a new top-level folder appeared
        while processes of the sandbox live (a new keeper, which sees it, would end them)."""
        keeper = self._kept
        if keeper is not None and keeper.gone and not keeper.ended:
            raise SandboxError(Event.SANDBOX_KILLED, f"the keeper of sandbox {self.id} (pid {keeper.pid}) ended: "
                               f"{keeper.words.strip()[-300:] or 'killed from outside'}", node=NODE)
        if self._kept_busy:
            return None
        self._kept_busy = True  # before the first await: a concurrent command takes a bubblewrap of its own
        try:
            return await self._exec_in_keeper(command, timeout_s=timeout_s, env=env)
        finally:
            self._kept_busy = False

    async def _exec_in_keeper(self, command: str, *, timeout_s: float,
                              env: Mapping[str, str] | None) -> ExecResult | None:
        keeper = self._kept
        base = self._env(None)
        extra = {name: value for name, value in self._env(env).items() if base.get(name) != value}
        script = prelude(cpu_s=max(1, math.ceil(timeout_s)) + 1, env=extra)
        if script is None:
            return None
        if keeper is not None and not keeper.gone and self._entries() != self._kept_entries:
            if not keeper.quiet:
                return None
            await keeper.end(self.owner.files)
        for attempt in range(2):
            if self._kept is None or self._kept.gone:  # ended by rl360 (a timeout, a new folder): a new one
                await self.start_keeper()
            keeper = self._kept
            buffer = OutputBuffer(self.config.max_output_chars)
            started = time.monotonic()
            try:
                status = await keeper.run(command, workdir=self.task.workdir, prelude=script, timeout_s=timeout_s,
                                          buffer=buffer, files=self.owner.files)
            except KeeperGone:
                if keeper.ended:  # rl360 ended it meanwhile (end_agent_processes, stop): killed, as in docker
                    return _result(128 + signal.SIGKILL, buffer, timed_out=False,
                                   duration_s=time.monotonic() - started)
                if "Cannot fork" in keeper.words and attempt == 0:
                    # Every pid was held by what the sandbox left running: the keeper ended, and with it all
                    # it kept; the command never ran, so it runs once in a new keeper (docker's init kills them).
                    await keeper.end(self.owner.files)
                    continue
                await keeper.end(self.owner.files)
                keeper.ended = False  # not rl360's doing: the sandbox is lost
                raise SandboxError(Event.SANDBOX_KILLED, f"the keeper of sandbox {self.id} (pid {keeper.pid}) "
                                   f"ended: {keeper.words.strip()[-300:] or 'killed from outside'}",
                                   node=NODE) from None
            duration = time.monotonic() - started
            if status == "setup":
                output, _ = buffer.text()
                raise SandboxError(Event.PROVIDER_FAILED, f"sandbox {self.id} has no workdir {self.task.workdir} "
                                   f"any more: {output.strip()[-300:]}", node=NODE)
            code = None if status is None else int(status)
            return _result(code, buffer, timed_out=status is None, duration_s=duration)
        raise AssertionError("unreachable")

    def _still(self):
        """Around a host-side operation on the sandbox's files: its processes stopped meanwhile (keeper.py)."""
        if self._kept is None:
            return contextlib.nullcontext()
        return self._kept.still(self.owner.files)

    async def end_agent_processes(self) -> None:
        """Kill what the sandbox's commands left running (only a keeper's namespace keeps anything)."""
        keeper = self._kept
        if keeper is None or keeper.gone or keeper.quiet:
            return
        if keeper.busy or self._kept_busy:  # a command is in flight there: everything ends, the next gets a new keeper
            await keeper.end(self.owner.files)
            return
        try:
            await keeper.kill_others(60, self.owner.files)
        except KeeperGone:
            await keeper.end(self.owner.files)

    async def prepare_verifier(self) -> None:
        """Empty /tests and /logs/verifier; what the agent left running stays alive for the verifier, as Harbor
        leaves it, unless [sandbox] end_agent_before_verifier (the docker provider's rules)."""
        if self.config.end_agent_before_verifier:
            await self.end_agent_processes()
        await self.reset_dir("/logs/verifier")
        await self.reset_dir("/tests")

    # ------------------------------------------------------------------ files

    def _host_path(self, remote: str) -> Path:
        path = posixpath.normpath(remote)
        if not remote.startswith("/") or path in ("/", "//"):
            raise SandboxError(Event.PROVIDER_FAILED, f"{remote!r} is not an absolute path below /", node=NODE)
        parts = path.lstrip("/").split("/")
        if parts[0] in RESERVED or ".." in parts:
            raise SandboxError(Event.PROVIDER_FAILED,
                               f"{remote}: /{parts[0]} is the host's (read-only) in process sandboxes", node=NODE)
        return self.fs.joinpath(*parts)

    def _inside(self, host: Path) -> bool:
        """The folder holding `host` is really inside this sandbox (no symlink planted by the sandbox leads out)."""
        parent = os.path.realpath(host.parent)
        return parent == self._fs_real or parent.startswith(self._fs_real + os.sep)

    def _make_parents(self, host: Path) -> None:
        current = self.fs
        for part in host.relative_to(self.fs).parts[:-1]:
            current = current / part
            if current.is_symlink() or (current.exists() and not current.is_dir()):
                current.unlink()
            if not current.exists():
                current.mkdir()
                if self.uid is not None:
                    os.chown(current, self.uid, self.uid)

    # Each runs as root on folders the sandbox's uid owns: with nothing of the sandbox running (`_still`).

    async def upload(self, local_path: Path | str, remote_path: str) -> None:
        async with self._still():
            await self._upload(local_path, remote_path)

    async def download(self, remote_path: str, local_path: Path | str) -> None:
        async with self._still():
            await self._download(remote_path, local_path)

    async def read_file(self, remote_path: str, *, max_bytes: int = 1 << 20) -> bytes | None:
        async with self._still():
            return await self._read_file(remote_path, max_bytes=max_bytes)

    async def reset_dir(self, remote_path: str) -> None:
        async with self._still():
            await self._reset_dir(remote_path)

    def _clear(self, host: Path, *, keep: bool) -> None:
        """Remove what is at `host`; a top-level folder under a keeper is emptied instead: the keeper's mount
        namespace bound that folder when it started, and a new one of the same name would not be seen there."""
        if keep and self._kept is not None and host.parent == self.fs and host.is_dir() and not host.is_symlink():
            for entry in list(host.iterdir()):
                _remove(entry)
            os.chmod(host, 0o755)
        else:
            _remove(host)

    async def _upload(self, local_path: Path | str, remote_path: str) -> None:
        local = Path(local_path)
        host = self._host_path(remote_path)
        try:
            self._make_parents(host)
            self._clear(host, keep=local.is_dir())
            if local.is_dir():
                await self.owner.files(shutil.copytree, local, host, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(local, host)
            if self.uid is not None:
                chown_tree(host, self.uid)
        except FileNotFoundError as e:
            raise SandboxError(Event.PROVIDER_FAILED, f"upload of {local} failed: no such file {e.filename}",
                               node=NODE) from None
        except OSError as e:
            raise SandboxError(Event.PROVIDER_FAILED, f"upload of {local} to {remote_path} failed: {e}",
                               node=NODE) from None

    async def _download(self, remote_path: str, local_path: Path | str) -> None:
        host = self._host_path(remote_path)
        if not self._inside(host) or host.is_symlink():
            raise SandboxError(Event.PROVIDER_FAILED, f"{remote_path} is a symbolic link; not followed", node=NODE)
        local = Path(local_path)
        try:
            if host.is_dir():
                await self.owner.files(shutil.copytree, host, local, symlinks=True, dirs_exist_ok=True)
            elif host.exists():
                local.parent.mkdir(parents=True, exist_ok=True)
                data = _read_nofollow(host, max_bytes=None)
                local.write_bytes(data)
            else:
                raise SandboxError(Event.PROVIDER_FAILED, f"no such file {remote_path} in the sandbox", node=NODE)
        except OSError as e:
            raise SandboxError(Event.PROVIDER_FAILED, f"download of {remote_path} failed: {e}", node=NODE) from None

    async def _read_file(self, remote_path: str, *, max_bytes: int = 1 << 20) -> bytes | None:
        host = self._host_path(remote_path)
        if not self._inside(host):
            return None
        try:
            return _read_nofollow(host, max_bytes=max_bytes)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENOTDIR):
                return None
            raise SandboxError(Event.PROVIDER_FAILED, f"cannot read {remote_path}: {e}", node=NODE) from None

    async def _reset_dir(self, remote_path: str) -> None:
        host = self._host_path(remote_path)
        try:
            self._make_parents(host)
            self._clear(host, keep=True)
            host.mkdir(exist_ok=True)
            if self.uid is not None:
                os.chown(host, self.uid, self.uid)
        except OSError as e:
            raise SandboxError(Event.PROVIDER_FAILED, f"cannot reset {remote_path}: {e}", node=NODE) from None

    # ------------------------------------------------------------------ life

    def egress_report(self) -> EgressReport | None:
        return self._egress

    async def _release_network(self) -> None:
        """Detach from the egress proxy (keeping what it counted), then end the namespace and its sidecars."""
        if (self.network == "egress" or self.door_route is not None) and self._egress is None:
            try:
                self._egress = await self.owner.egress.detach(self.id)
            except EgressUnavailable as e:  # the proxy died under the sandbox: its network failed it
                line = f"rl360 egress: {e}"
                self._egress = EgressReport(failed={"egress-proxy": 1}, lines=(line,), failure=line)
        if self.sidecars is not None and not self._released:
            self._released = True
            await self.owner.files(self.sidecars.stop)

    async def keep_alive(self) -> dict[str, Any]:
        """A detached `sleep` inside the sandbox (no die-with-parent) that holds the uid lock: a fleet member."""
        if self.task.sidecars:  # they die with this process (die-with-parent): a fleet would lose them
            raise SandboxError(Event.START_FAILED, f"task {self.task.id} has sidecars: fleets of such tasks need "
                               "the docker provider", node=NODE)
        if self._kept is not None:  # what it kept dies with this process (die-with-parent): ended now
            await self._kept.end(self.owner.files)
            self._kept = None
        await self._release_network()  # a fleet member only waits: its namespace would die with this process
        if self.network == "egress":  # nothing listens in it any more: its record says so
            self.network, self.network_denied = "none", True
        iso = self.owner.isolation
        limits = self._limits(10**7)
        argv = iso.argv(self.fs, "exec sleep infinity", workdir=self.task.workdir, limits=limits, uid=self.uid,
                        init=False, die_with_parent=False, binds=volume_binds(self.folder, self.task.volume_mounts))
        kwargs: dict[str, Any] = {"start_new_session": True, **iso.spawn_kwargs(self.uid, limits)}
        if self._lock_fd is not None:
            kwargs["pass_fds"] = (self._lock_fd,)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=self._env(None), **kwargs)
        self.keeper = {"pid": proc.pid, "pid_start": procinfo.start_time(proc.pid)}
        record = json.loads((self.folder / "sandbox.json").read_text())
        record.update(keeper_pid=proc.pid, keeper_start=self.keeper["pid_start"])
        (self.folder / "sandbox.json").write_text(json.dumps(record))
        # The keeper holds the uid lock now; this process lets go of its copy.
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self._stopped = True  # this object no longer owns the sandbox: stop it by its record
        return self.info()

    async def stop(self) -> None:
        if self._stopped and self.keeper is None:
            return
        self._stopped = True
        if self._kept is not None:  # its namespace, everything in it, gone before the uid is free
            await self._kept.end(self.owner.files)
        for proc in list(self._procs):
            await _kill(proc)
        await self._release_network()
        if self.keeper is not None:
            return  # a fleet member: `rl360 sandboxes stop` / the janitor remove it by its record
        self.owner.discard(self.folder)
        close_fds(self._lock_fd)  # nothing of the sandbox runs any more: its uid is free
        self._lock_fd = None


# ----------------------------------------------------------------------------- helpers


def _result(code: int | None, buffer: OutputBuffer, *, timed_out: bool, duration_s: float) -> ExecResult:
    """A command's result from its exit status (None: past its timeout) and its output."""
    output, cut = buffer.text()
    limit = buffer.first_limit()
    if code == 128 + signal.SIGXCPU or code == -signal.SIGXCPU:
        limit = "cpu_time"
    elif code == 128 + signal.SIGXFSZ or code == -signal.SIGXFSZ:
        limit = limit or "file_size"
    return ExecResult(exit_code=code, output=output, timed_out=timed_out, oom_killed=limit == "memory",
                      duration_s=duration_s, limit=None if timed_out else limit, truncated_chars=cut)


async def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the command's process group (bwrap's pid namespace dies with it) and reap it."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        await proc.wait()



def _read_info(fd: int) -> bool:
    """True when bwrap wrote its info (it got as far as starting the command)."""
    try:
        return bool(os.read(fd, 4096))
    except OSError:
        return False
    finally:
        os.close(fd)


def close_fds(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _read_nofollow(path: Path, *, max_bytes: int | None) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read() if max_bytes is None else f.read(max_bytes)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
