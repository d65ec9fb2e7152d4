"""Fixtures for the real dev services started by cluster/dev/*.sh.

Each fixture returns the parsed description file the service's script wrote
under DEV_ROOT (RL360_DEV_ROOT, default /tmp/rl360-dev), after checking that
the service answers. When it does not, the test is skipped locally and fails
when CI=true (CI must start what its tests need).

Self-contained on purpose: the fixtures and their helper can move to
tests/conftest.py as they are.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEV_SCRIPTS = REPO_ROOT / "cluster" / "dev"


def dev_root() -> Path:
    """Where the dev service scripts keep their state."""
    return Path(os.environ.get("RL360_DEV_ROOT", "/tmp/rl360-dev"))


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def service_missing(what: str, start_with: str) -> None:
    """Skip the test (locally) or fail it (CI=true): a dev service is not up."""
    message = f"{what}; start it with: {start_with}"
    if in_ci():
        pytest.fail(f"dev service missing in CI: {message}", pytrace=False)
    pytest.skip(message)


def _load(path: Path, what: str, start_with: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        service_missing(f"{what} not started ({path} missing)", start_with)
    except json.JSONDecodeError as exc:
        service_missing(f"{what}: unreadable {path} ({exc})", start_with)
    raise AssertionError("unreachable")


def _tcp_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _docker_ping(docker_host: str, timeout: float = 2.0) -> bool:
    """GET /_ping on a unix:// docker socket, without the docker SDK."""
    path = docker_host.removeprefix("unix://")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
            status_line = sock.recv(64).split(b"\r\n", 1)[0]
            return b" 200" in status_line
    except OSError:
        return False


@pytest.fixture(scope="session")
def docker_nodes() -> dict[str, Any]:
    """$DEV_ROOT/docker/nodes.json of cluster/dev/docker-nodes.sh, all daemons answering."""
    start = f"{DEV_SCRIPTS}/docker-nodes.sh up"
    desc = _load(dev_root() / "docker" / "nodes.json", "docker nodes", start)
    host, _, port = desc["registry"].partition(":")
    if not _tcp_open(host, int(port)):
        service_missing(f"loopback registry {desc['registry']} not answering", start)
    down = [n["name"] for n in desc["nodes"] if not _docker_ping(n["docker_host"])]
    if down:
        service_missing(f"dockerd of {', '.join(down)} not answering", start)
    return desc


@pytest.fixture(scope="session")
def ssh_nodes() -> dict[str, Any]:
    """$DEV_ROOT/ssh/nodes.json of cluster/dev/sshd-nodes.sh, all sshd listening."""
    start = f"{DEV_SCRIPTS}/sshd-nodes.sh up"
    desc = _load(dev_root() / "ssh" / "nodes.json", "sshd nodes", start)
    down = [n["name"] for n in desc["nodes"] if not _tcp_open(n["host"], n["port"])]
    if down:
        service_missing(f"sshd of {', '.join(down)} not listening", start)
    return desc


@pytest.fixture(scope="session")
def slurm_cluster() -> dict[str, Any]:
    """$DEV_ROOT/slurm/cluster.json of cluster/dev/slurm.sh, slurmctld answering.

    Commands need SLURM_CONF=desc["conf"] (also in desc["env"]).
    """
    start = f"{DEV_SCRIPTS}/slurm.sh up"
    desc = _load(dev_root() / "slurm" / "cluster.json", "Slurm cluster", start)
    env = {**os.environ, **desc["env"]}
    try:
        out = subprocess.run(
            ["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        service_missing(f"scontrol ping failed ({exc})", start)
    if "UP" not in out:
        service_missing(f"slurmctld not answering ({out.strip() or 'no output'})", start)
    return desc
