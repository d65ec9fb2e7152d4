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

The sandbox itself, its commands and its files, is process/sandbox.py's `ProcessSandbox`.

Test: tests/sandbox/test_process_provider.py, tests/sandbox/test_security.py, tests/sandbox/test_process_keeper.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rl360cli import procinfo
from rl360cli.backends.local import machine_resources
from rl360cli.egress.client import EgressRoute, EgressUnavailable
from rl360cli.egress.trust import process_trust
from rl360cli.errors import Rl360Error
from rl360cli.sandbox.config import SandboxConfig
from rl360cli.sandbox.network import Abilities, Access, Network, decide
from rl360cli.sandbox.process.isolation import Isolation, chown_tree
from rl360cli.sandbox.process.keeper import keeper_binary
from rl360cli.sandbox.process.seccomp import deny_ptrace_and_sigcont_program
from rl360cli.sandbox.process.image import ProcessImages
from rl360cli.sandbox.process.sandbox import NODE, ProcessSandbox, close_fds
from rl360cli.sandbox.process.sidecars import ProcessSidecars, make_volumes, mount_points
from rl360cli.sandbox.provider import NodeCapacity, Sandbox, SandboxProvider, sandbox_labels
from rl360cli.sandbox.taxonomy import Event, SandboxError

log = logging.getLogger(__name__)
_warned_no_egress = False
_warned_no_keeper = False
# What a process sandbox's record calls each way out (rl360cli/sandbox/network.py decides which it gets).
NETWORK_NAMES = {Access.NONE: "none", Access.SIDECARS: "none", Access.PROXY: "egress", Access.OPEN: "slirp4netns"}

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


# ----------------------------------------------------------------------------- helpers


def _check_traversable(root: Path) -> None:
    """Sandboxes run as other uids: every folder above the root must let them pass (o+x)."""
    for folder in [root.absolute(), *root.absolute().parents]:
        if not os.stat(folder).st_mode & 0o001:
            raise Rl360Error(f"process sandboxes cannot reach {root}: {folder} is not searchable by other users",
                             "set [sandbox] process_root to a folder under /tmp (the default is "
                             f"{default_root()})")


def _cleanup(folder: Path, lock_fd: int | None) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    close_fds(lock_fd)

