"""The `process` provider: a sandbox is a private folder on this machine, isolated with bubblewrap.

A sandbox's folder `ROOT/<id>/fs/` holds the paths a task expects (the
workdir, `/tests`, `/logs/verifier`, `/tmp`, and whatever the task's simple
Dockerfile installed, see process/image.py); every top-level entry of it is
bound at `/<name>` for each command. Each command runs as

    prlimit (memory, processes, file size, open files, CPU time) --
      bwrap --tmpfs / --ro-bind /usr --ro-bind /etc ... --remount-ro /
            --unshare-all --die-with-parent --as-pid-1 --seccomp FD [--block-fd FD] --
        sh -c 'bash -c "$1"; exit $?' sh COMMAND

so the root is read-only, the host's other folders (the project, /root,
/home, the state file, the run folder, other sandboxes) do not exist, the
network namespace is never the host's: a fresh one per command, or, for a
sandbox with sidecars or one that goes out through the node's egress proxy
(`[egress] mode = "allow"`), one of the sandbox's own that its commands join,
where the proxy listens on its 127.0.0.1 (rl360cli/egress/proxy.py); under
`mode = "open"` a network task gets slirp4netns's outbound NAT (process/outbound.py);
ptrace is refused (process/seccomp.py), and the command gets its own pid namespace:
when it ends, at its timeout or when this process dies, every process it
started dies with it.
Nothing runs between commands, so a sandbox costs a folder and one bwrap
start (~4 ms) per command. When rl360 runs as root, each live sandbox runs
as its own uid (from [sandbox] process_uid_base), so the process limit is
per sandbox and no sandbox can read another's files or root's.

With `[sandbox] process_namespace = "sandbox"` (as root, with bubblewrap) the namespaces are the
sandbox's instead of each command's: one keeper per sandbox, started with it, runs every command of it
(process/keeper.py), so what a command leaves running lives until the sandbox stops, as in a container;
a command sent while another runs gets a bubblewrap of its own, as above.

Without bubblewrap (not installed) rl360 warns once and runs commands in a
process group with the same rlimits but no isolation; the task's absolute
paths (/app, /tests, /logs) are then not available, so only tasks written
with relative paths work. Install `bubblewrap`.

Test: tests/sandbox/test_process_provider.py, tests/sandbox/test_security.py, tests/sandbox/test_process_keeper.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import json
import logging
import math
import os
import posixpath
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rl360cli import procinfo
from rl360cli.backends.local import machine_resources
from rl360cli.egress.client import EgressReport, EgressRoute, EgressUnavailable
from rl360cli.egress.trust import process_trust
from rl360cli.errors import Rl360Error
from rl360cli.sandbox.config import SandboxConfig
from rl360cli.sandbox.network import Abilities, Access, Network, decide
from rl360cli.sandbox.process.isolation import DEFAULT_PATH, RESERVED, Isolation, chown_tree, filled_pipe, rlimit_args
from rl360cli.sandbox.process.keeper import KEEPER_PATH, Keeper, KeeperGone, keeper_binary, prelude
from rl360cli.sandbox.process.seccomp import deny_ptrace_and_sigcont_program
from rl360cli.sandbox.process.outbound import attach_outbound
from rl360cli.sandbox.process.image import ProcessImages
from rl360cli.sandbox.process.sidecars import ProcessSidecars, make_volumes, mount_points, volume_binds
from rl360cli.sandbox.provider import ExecResult, NodeCapacity, OutputBuffer, Sandbox, SandboxProvider, sandbox_labels
from rl360cli.sandbox.task import resolve_env
from rl360cli.sandbox.taxonomy import Event, SandboxError

log = logging.getLogger(__name__)
_warned_no_egress = False
_warned_no_keeper = False
# What a process sandbox's record calls each way out (rl360cli/sandbox/network.py decides which it gets).
NETWORK_NAMES = {Access.NONE: "none", Access.SIDECARS: "none", Access.PROXY: "egress", Access.OPEN: "slirp4netns"}

NODE = "local"
# Every attempt makes a sandbox folder and removes it again: in RAM that costs ~7 ms less CPU per arith
# attempt than on the journaling disk under /tmp (measured: 48 -> 41 ms in the sandbox's processes,
# 8 -> 5.5 ms in the orchestrator), ~10% of a local-smoke session.
RAM_ROOT = Path("/dev/shm/rl360-sandboxes")
# Only where /dev/shm is a tmpfs with room to spare: a container's default /dev/shm is 64 MB, and Ray
# keeps its object store there.
RAM_ROOT_MIN_FREE = 4 << 30


def default_root() -> Path:
    """Where process sandboxes live unless [sandbox] process_root says so: $RL360_SANDBOX_ROOT, else
    RAM_ROOT where /dev/shm is a tmpfs with RAM_ROOT_MIN_FREE free, else `disk_root()`."""
    if os.environ.get("RL360_SANDBOX_ROOT"):
        return Path(os.environ["RL360_SANDBOX_ROOT"])
    return RAM_ROOT if _roomy_tmpfs(RAM_ROOT.parent) else disk_root()


def disk_root() -> Path:
    """$TMPDIR/rl360-sandboxes: the root where /dev/shm will not do, and where image trees are kept."""
    return Path(tempfile.gettempdir()) / "rl360-sandboxes"


def default_roots() -> list[Path]:
    """Every root a process sandbox of this machine may have by default (the janitor sweeps them all)."""
    return list(dict.fromkeys([default_root(), RAM_ROOT, disk_root()]))


def _roomy_tmpfs(mount_point: Path) -> bool:
    try:
        with open("/proc/self/mounts") as mounts:
            tmpfs = any(line.split()[1:3] == [str(mount_point), "tmpfs"] for line in mounts)
        stat = os.statvfs(mount_point)
    except OSError:
        return False
    return tmpfs and stat.f_bavail * stat.f_frsize >= RAM_ROOT_MIN_FREE and os.access(mount_point, os.W_OK)


def machine_capacity() -> NodeCapacity:
    cpus, memory_mb = machine_resources()
    return NodeCapacity(name=NODE, cpus=float(cpus), memory_mb=memory_mb)


# ----------------------------------------------------------------------------- uids


class UidPool:
    """One uid per live sandbox, claimed with a lock file so concurrent rl360 processes never share one."""

    def __init__(self, base: int, size: int, lock_dir: Path):
        self.base, self.size, self.lock_dir = base, size, lock_dir
        self._next = 0
        lock_dir.mkdir(parents=True, exist_ok=True)

    def acquire(self) -> tuple[int, int]:
        """(uid, fd of its held lock)."""
        for _ in range(self.size):
            uid = self.base + self._next
            self._next = (self._next + 1) % self.size
            fd = os.open(self.lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return uid, fd
        raise SandboxError(Event.START_FAILED, f"all {self.size} sandbox uids from {self.base} are in use")


# ----------------------------------------------------------------------------- provider


class ProcessProvider(SandboxProvider):
    name = "process"

    def __init__(self, config: SandboxConfig, *, run_id: str = "", root: Path | None = None,
                 egress: EgressRoute | None = None):
        self.config = config
        self.run_id = run_id
        # Where a network task's sandbox goes: the profile's [egress] (none unless it says).
        self.egress = egress or EgressRoute()
        self.root = Path(root or config.process_root or default_root())
        self.root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(self.root, 0o711)
        self.isolation = Isolation()
        if self.isolation.as_root and self.isolation.bwrap:
            _check_traversable(self.root)
        # [sandbox] process_namespace = "sandbox": one keeper per sandbox (process/keeper.py). Its filter also
        # refuses SIGCONT, and its commands must run as a uid that cannot read the keeper: root only.
        self.keeper_seccomp = deny_ptrace_and_sigcont_program()
        self.keeps_namespaces = config.process_namespace == "sandbox" and self._can_keep()
        self._keeper_sh: Path | None = None
        # The uid locks are machine-wide (not per root), so providers with different roots never share a uid.
        self.uids = UidPool(config.process_uid_base, 4096, Path(tempfile.gettempdir()) / "rl360-sandbox-uids") \
            if self.isolation.as_root else None
        # Image trees are built once and kept: on disk, also when the sandboxes' own folders are in RAM.
        image_home = disk_root() if self.root == RAM_ROOT else self.root
        # The keeper's program (process/keeper.py) is executed from there too: /dev/shm may be mounted noexec.
        self._keeper_home = image_home
        self.images = ProcessImages(image_home / ".images", self.isolation,
                                    build_uid=config.process_uid_base - 1 if self.isolation.as_root else None)
        self._owner = {"owner_pid": os.getpid(), "owner_start": procinfo.start_time(os.getpid())}
        # Copies and removals of sandbox folders run here, not in asyncio's small default pool, which
        # hundreds of concurrent attempts would queue behind.
        self._file_pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="rl360-sandbox-files")
        self._deleting: set = set()
        # Folders a crashed run left in .trash are deleted now, in the background.
        if (self.root / ".trash").is_dir():
            self._deleting.add(self._file_pool.submit(shutil.rmtree, self.root / ".trash", True))

    def _can_keep(self) -> bool:
        iso = self.isolation
        if iso.as_root and iso.bwrap and self.keeper_seccomp is not None:
            return True
        global _warned_no_keeper
        if not _warned_no_keeper:
            _warned_no_keeper = True
            log.warning('[sandbox] process_namespace = "sandbox" needs root, bubblewrap and an x86_64 or aarch64 '
                        "machine: each command gets namespaces of its own instead")
        return False

    @property
    def keeper_sh(self) -> Path:
        """The keeper's program (process/keeper.py), made at first use."""
        if self._keeper_sh is None:
            self._keeper_sh = keeper_binary(self._keeper_home)
        return self._keeper_sh

    async def files(self, fn, *args, **kwargs):
        """Run a blocking file operation on the provider's own threads (inline once the provider is closed)."""
        call = functools.partial(fn, *args, **kwargs)
        try:
            future = asyncio.get_running_loop().run_in_executor(self._file_pool, call)
        except RuntimeError:  # closed: a sandbox stopped after its provider still cleans up
            return call()
        return await future

    def discard(self, folder: Path) -> None:
        """Remove a stopped sandbox's folder: renamed into .trash at once, deleted in the background
        (deleting is slow on some disks: ~20 ms for a handful of folders on ext4 with `discard`)."""
        trash = self.root / ".trash"
        try:
            trash.mkdir(exist_ok=True)
            target = trash / folder.name
            os.rename(folder, target)
        except OSError:
            target = folder
        try:
            future = self._file_pool.submit(shutil.rmtree, target, True)
        except RuntimeError:  # closed
            shutil.rmtree(target, ignore_errors=True)
            return
        self._deleting.add(future)
        future.add_done_callback(self._deleting.discard)

    async def close(self) -> None:
        """Finish deleting stopped sandboxes' folders, then let the threads go."""
        pending = list(self._deleting)
        if pending:
            await asyncio.gather(*(asyncio.wrap_future(f) for f in pending))
        self._file_pool.shutdown(wait=False)

    def nodes(self) -> list[NodeCapacity]:
        return [machine_capacity()]

    @property
    def supports_sidecars(self) -> bool:  # type: ignore[override]
        """Sidecars share a network namespace with the sandbox's commands: process/sidecars.py (root only)."""
        return self.isolation.shares_netns

    def abilities(self, node: str = NODE) -> Abilities:
        """The machine's proxy, alone on a sandbox's own loopback, where its namespace can be shared (root,
        bubblewrap, nsenter); slirp4netns's outbound NAT where it is installed."""
        return Abilities(open_network=self.isolation.gives_open_network, reaches_proxy=self.isolation.shares_netns)

    def network_of(self, task, node: str = NODE) -> Network:
        """What a sandbox of `task` gets (rl360cli/sandbox/network.py); a network task that gets none for want
        of an ability here is warned about once."""
        network = decide(task, sandbox_network=self.config.network, egress_mode=self.egress.mode,
                         abilities=self.abilities(node), agent_inside=self.egress.door)
        if network.denied and self.config.network == "task" and self.egress.mode == "allow":
            global _warned_no_egress
            if not _warned_no_egress:
                _warned_no_egress = True
                log.warning('[egress] mode = "allow": process sandboxes reach the proxy only as root, with bubblewrap '
                            "and nsenter; network tasks get no network here")
        elif network.denied and self.config.network == "task" and self.egress.mode == "open" and \
                task.allowed_hosts is None:
            self.isolation.warn_without_open_network()
        return network

    def image_ref(self, task) -> str:
        # One node, and the host's root stands in for a named image: only a built Dockerfile is cached.
        task = self.as_started(task)
        return task.image_ref if task.dockerfile else "host"

    async def start(self, task, *, attempt_id: str, labels: Mapping[str, str], node: str | None = None) -> Sandbox:
        started = time.monotonic()
        task = self.as_started(task)
        image = await self.images.ensure(task)
        sid = f"p-{uuid.uuid4().hex[:12]}"
        folder = self.root / sid
        uid = fd = None
        try:
            if self.uids is not None:
                uid, fd = self.uids.acquire()
            fs = folder / "fs"
            fs.mkdir(parents=True)
            if image is not None and image.tree is not None:
                await self.files(shutil.copytree, image.tree, fs, symlinks=True, dirs_exist_ok=True)
            workdir = task.workdir
            for path in (workdir, "/tmp", "/tests", "/logs/verifier", "/logs/agent",
                         *mount_points(task.volume_mounts, task.id)):
                (fs / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
            make_volumes(folder, task)
            if uid is not None:
                chown_tree(fs, uid)
            os.chmod(fs / "tmp", 0o1777)
            record = {"id": sid, "run": self.run_id, "task": task.id, "attempt": attempt_id, "uid": uid,
                      "labels": sandbox_labels(labels, run_id=self.run_id, task=task, attempt_id=attempt_id),
                      "created_at": time.time(), **self._owner}
            (folder / "sandbox.json").write_text(json.dumps(record))
            sidecars = None
            decided = self.network_of(task)
            network = NETWORK_NAMES[decided.access]
            if task.sidecars and not self.supports_sidecars:
                raise SandboxError(Event.START_FAILED, f"task {task.id} has sidecars, which process sandboxes "
                                   "start only as root with bubblewrap and nsenter: use the docker provider",
                                   node=NODE)
            if task.sidecars or decided.attached:  # a namespace of the sandbox's own, its commands join it
                sidecars = ProcessSidecars(self, task, folder)
                await sidecars.start(networked=network == "slirp4netns")
            trust_env: dict[str, str] = {}
            if decided.attached:  # its way out, or its agent's door (network.py)
                try:
                    ca_pem = await self.egress.attach(sid, sidecars.holder_pid, task.allowed_hosts,
                                                      trusts_ca=True, outbound=network == "egress")
                    if ca_pem:  # an https:// mirror or a dated index: it trusts the CA beside the host's roots
                        sidecars.trust_binds, trust_env = await self.files(process_trust, ca_pem, folder)
                except EgressUnavailable as e:
                    await self.files(sidecars.stop)
                    raise SandboxError(Event.START_FAILED, str(e), node=NODE) from None
        except SandboxError:
            _cleanup(folder, fd)
            raise
        except OSError as e:
            _cleanup(folder, fd)
            raise SandboxError(Event.START_FAILED, f"cannot lay out the sandbox folder {folder}: {e}",
                               node=NODE) from None
        except BaseException:
            _cleanup(folder, fd)
            raise
        sandbox = ProcessSandbox(self, task, sid=sid, folder=folder, uid=uid, lock_fd=fd, attempt_id=attempt_id,
                                 image_env=image.env if image else {}, start_s=time.monotonic() - started,
                                 sidecars=sidecars, network=network, network_denied=decided.denied,
                                 trust_env=trust_env)
        if decided.door:  # its agent's way to its own session, opened by the agent's harness
            sandbox.door_route, sandbox.door_id = self.egress, sid
        if self.keeps_namespaces:
            try:
                await sandbox.start_keeper()
            except BaseException:
                await asyncio.shield(sandbox.stop())
                raise
        return sandbox

    async def detach(self, sandbox: Sandbox) -> dict[str, Any]:
        """Start a keeper process that holds the sandbox's uid and marks it live after this process exits."""
        assert isinstance(sandbox, ProcessSandbox)
        return await sandbox.keep_alive()


class ProcessSandbox(Sandbox):
    provider = "process"

    def __init__(self, owner: ProcessProvider, task, *, sid: str, folder: Path, uid: int | None,
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
            _close(info_r, info_w, block_r, block_w, seccomp_r)
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
            _close(info_r, block_w)  # ours; the child's ends are closed below
            raise SandboxError(Event.PROVIDER_FAILED, f"cannot start a command in sandbox {self.id}: {e}",
                               node=NODE) from None
        finally:
            _close(info_w, block_r, seccomp_r)  # the child's ends
        self._procs.add(proc)
        net = None
        set_up: bool | None = None
        if networked:
            try:
                net, set_up = await attach_outbound(iso.slirp, info_r, block_r, self.owner.files)
            except BaseException:
                await asyncio.shield(_kill(proc))
                self._procs.discard(proc)
                _close(block_w)
                raise
            info_r = None  # read and closed
            _close(block_w)  # lets the command start (or, when bwrap failed, nothing is waiting)
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
            _close(info_r)
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
        _close(self._lock_fd)  # nothing of the sandbox runs any more: its uid is free
        self._lock_fd = None


# ----------------------------------------------------------------------------- helpers


def _check_traversable(root: Path) -> None:
    """Sandboxes run as other uids: every folder above the root must let them pass (o+x)."""
    for folder in [root.absolute(), *root.absolute().parents]:
        if not os.stat(folder).st_mode & 0o001:
            raise Rl360Error(f"process sandboxes cannot reach {root}: {folder} is not searchable by other users",
                             "set [sandbox] process_root to a folder under /tmp (the default is "
                             f"{default_root()})")


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


def _close(*fds: int | None) -> None:
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


def _cleanup(folder: Path, lock_fd: int | None) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    _close(lock_fd)

