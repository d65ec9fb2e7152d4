"""What a docker sandbox's container is created with: its spec, its init, its limits and privileges.

`ContainerSpec` is everything but the container's name; containers of one spec are interchangeable (the
warm pool keys on it). `create_kwargs` turns a spec into the daemon's host configuration: `--cpus`,
`--memory` (no swap) and `--pids-limit` from the reservation, `fsize`/`nofile` ulimits, the network,
no-new-privileges, every capability dropped but `capabilities(spec)`, a read-only root with the
volumes of `read_only_volumes` and tmpfs for the paths it writes, and the GPUs it reserves. The init
(`INIT`) runs as root, makes the folders Harbor's verifier and agents expect, and keeps the container
alive without ever forking.

No docker SDK call happens here (`create_kwargs` only builds the SDK's types). Used by docker/provider.py and
docker/sandbox.py. Test: tests/sandbox/test_security.py, tests/sandbox/test_sidecars.py (GPUs).
"""

from __future__ import annotations

import posixpath
import re
import uuid
from dataclasses import dataclass
from typing import Any

from rl360cli.sandbox.config import SandboxConfig
from rl360cli.sandbox.task import MAIN_SERVICE

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
# Capabilities: all dropped, then these added back for the root that the init and rl360's own execs run
# as, next to an agent that may be another user (the image's USER, a step's `user`). Measured
# (docs/sandboxes.md): the shipped tasks need none, as root there owns everything it touches; an agent of
# another user needs KILL (`kill -9 -1` before the verifier leaves its processes running without it) and
# DAC_OVERRIDE (emptying the 0700 folders it left in /logs, /tests fails without it).
CAP_ADD = ("DAC_OVERRIDE", "KILL")
# And where the root is writable (Harbor's images install and serve what they need): apt-get drops to its
# `_apt` user (setgroups: SETGID, SETUID), dpkg gives the files it unpacks their owners (CHOWN, FOWNER), and
# sshd chroots its pre-auth child into /run/sshd (SYS_CHROOT: a task that serves git over ssh, as two of
# Terminal-Bench 2.0's do, fails without it; inside the container's own mount namespace, with
# no-new-privileges, a chroot reaches nothing the container does not already hold).
# Never: NET_RAW (raw sockets: spoofing on a bridge), MKNOD, SETFCAP, SETPCAP, NET_BIND_SERVICE, AUDIT_WRITE,
# FSETID of Docker's default set.
WRITABLE_ROOT_CAPS = ("CHOWN", "FOWNER", "SETGID", "SETUID", "SYS_CHROOT")
# A read-only root's writable paths: volumes, which Docker fills with what the image holds there (a
# Dockerfile's COPY into /app survives), and tmpfs (empty, counted against the memory limit, and out of
# reach of the daemon's archive calls: nothing is uploaded to or read from them).
VOLUME_PATHS = ("/tests", "/logs", "/solution")
TMPFS_PATHS = ("/tmp", "/run")
SYSTEM_FOLDERS = frozenset({"usr", "etc", "bin", "sbin", "lib", "lib64", "var", "proc", "sys", "dev"})
# The `rl360.attempt` label of a container the warm pool started; its attempt's own is set on creation.
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
    # It goes out through the node's egress proxy, which listens on its 127.0.0.1 (its own network is none).
    egress: bool = False
    # Compose volumes of the sandbox's own (docker/sidecars.py): (docker volume name, target, read-only).
    mounts: tuple[tuple[str, str, bool], ...] = ()


# Every sandbox container's hostname (`hostname` in it, resolvable in it).
HOSTNAME = "sandbox"


def cpu_limit_nanos(cpus: float, node_cpus: int) -> int:
    """A container's CPU limit in billionths of a CPU: the task's `cpus`, at most the node's own (0: unknown).
    A daemon refuses a limit above its CPUs ("Range of CPUs is from 0.01 to 2.00"), and such a limit
    limits nothing there: a task asking for 4 CPUs on a 2-CPU node runs with all 2, its reservation unchanged."""
    return int((min(cpus, node_cpus) if node_cpus else cpus) * 1e9)


def create_kwargs(spec: ContainerSpec, config: SandboxConfig, *, node_cpus: int = 0) -> dict[str, Any]:
    """The daemon's host configuration of a container of `spec` (all but its tmpfs), as the docker SDK's
    `create_host_config` takes it: limits, network, privileges and the GPU device request. `node_cpus`:
    the node's CPUs as its daemon counts them (0: unknown)."""
    import docker.types

    host = {
        "nano_cpus": cpu_limit_nanos(spec.cpus, node_cpus),
        "mem_limit": f"{spec.memory_mb}m", "memswap_limit": f"{spec.memory_mb}m",
        "pids_limit": config.pids_limit, "network_mode": spec.network, "security_opt": ["no-new-privileges"],
        "cap_drop": ["ALL"], "cap_add": list(capabilities(spec)), "read_only": bool(spec.volumes),
        "ulimits": [docker.types.Ulimit(name="fsize", soft=spec.file_bytes, hard=spec.file_bytes),
                    docker.types.Ulimit(name="nofile", soft=config.max_open_files, hard=config.max_open_files)],
    }
    if spec.network == "none":
        # Docker maps a container's hostname only to its address on a network: with none, nothing resolves it,
        # and gloo (torch.distributed on one machine: Terminal-Bench 2.0's torch-tensor-parallelism) waited on it.
        host["extra_hosts"] = {HOSTNAME: "127.0.0.1"}
    if spec.mounts:
        host["mounts"] = [docker.types.Mount(target, source, type="volume", read_only=read_only)
                          for source, target, read_only in spec.mounts]
    if spec.gpus:
        # `docker run --gpus '"device=1,2"'`: these GPUs of the node, not the first N (docs/sandboxes.md).
        host["device_requests"] = [docker.types.DeviceRequest(device_ids=list(spec.gpus), capabilities=[["gpu"]])]
    return {"host_config": host}


def tmpfs_mounts(spec: ContainerSpec) -> dict[str, str] | None:
    """The tmpfs of a container of `spec` with their mount options (None: a writable root has none)."""
    # tmpfs is mounted noexec by default: a task compiles and runs programs in /tmp.
    tmpfs = {path: f"rw,exec,nosuid,nodev,size={spec.file_bytes}" + (",mode=1777" if path == "/tmp" else "")
             for path in spec.tmpfs}
    return tmpfs or None


def capabilities(spec: ContainerSpec) -> tuple[str, ...]:
    """What a container of `spec` gets back after dropping all: see CAP_ADD and WRITABLE_ROOT_CAPS."""
    return CAP_ADD if spec.volumes else CAP_ADD + WRITABLE_ROOT_CAPS


def read_only_volumes(task, workdir: str | None = None) -> tuple[str, ...] | None:
    """The volumes of `task`'s read-only root (its workdir, else `task.workdir`; /tests, /logs, /solution,
    less those inside another), or None when the task needs a writable root: its workdir is / or in a
    system folder, or it hands on an artifact from a path that would be read-only."""
    workdir = posixpath.normpath(workdir or task.workdir)
    # A task working in /, /usr/src/app or /var/www writes beside its workdir too.
    if workdir == "/" or workdir.split("/")[1] in SYSTEM_FOLDERS:
        return None
    paths = sorted({*VOLUME_PATHS, workdir})
    volumes = tuple(p for p in paths
                    if not any(within(p, other) for other in (*paths, *TMPFS_PATHS) if other != p))
    # In a volume, not a tmpfs: the daemon's archive calls (which hand artifacts on) see only the volumes.
    # (A sidecar's artifacts are its own; a relative source is read from /, as `docker cp` reads it.)
    artifacts = [posixpath.normpath(posixpath.join("/", a.source))
                 for a in (*task.artifacts, *(a for step in task.steps for a in step.artifacts))
                 if a.service == MAIN_SERVICE]
    if any(not any(within(a, v) for v in volumes) for a in artifacts):
        return None
    return volumes


def within(path: str, folder: str) -> bool:
    """Whether the normalised absolute `path` is `folder` or below it."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def container_name(run_id: str, attempt_id: str) -> str:
    """A unique container name that says whose it is: `rl360-<run>-<attempt>-<6 hex>`."""
    base = re.sub(r"[^a-zA-Z0-9_.-]+", "-", f"rl360-{run_id or 'none'}-{attempt_id}")[:100].strip("-.")
    return f"{base}-{uuid.uuid4().hex[:6]}"
