"""Shared fixtures: a private state file per test, the CLI, and the real dev services.

The dev services (Docker nodes and a loopback registry, sshd nodes, Slurm) are
started by `cluster/dev/all.sh up` (the test command does it). A test that
needs one is skipped when it is not up on a developer's machine, and fails
when `CI=true`: CI must never pass by skipping the real-component tests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DEV_SCRIPTS = REPO / "cluster" / "dev"
DEV_ROOT = Path(os.environ.get("RL360_DEV_ROOT", "/tmp/rl360-dev"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need(condition: bool, why: str) -> None:
    """Skip (locally) or fail (in CI) when a real component is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{why} (CI=true: real-component tests may not be skipped)", pytrace=False)
    pytest.skip(why)


def _missing(what: str, start_with: str) -> None:
    need(False, f"{what}; start it with: {start_with}")


def _load(path: Path, what: str, start_with: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        _missing(f"{what} not started ({path} missing)", start_with)
    except json.JSONDecodeError as exc:
        _missing(f"{what}: unreadable {path} ({exc})", start_with)
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
    """$DEV_ROOT/docker/nodes.json of cluster/dev/docker-nodes.sh, all daemons answering; RL360_DEV_DOCKER_NODES
    names another such file (cluster/dev/podman-nodes.sh's $DEV_ROOT/podman/nodes.json: the same tests on Podman)."""
    start = f"{DEV_SCRIPTS}/docker-nodes.sh up"
    desc = _load(Path(os.environ.get("RL360_DEV_DOCKER_NODES") or DEV_ROOT / "docker" / "nodes.json"), "docker nodes",
                 start)
    host, _, port = desc["registry"].partition(":")
    if not _tcp_open(host, int(port)):
        _missing(f"loopback registry {desc['registry']} not answering", start)
    down = [n["name"] for n in desc["nodes"] if not _docker_ping(n["docker_host"])]
    if down:
        _missing(f"dockerd of {', '.join(down)} not answering", start)
    return desc


@pytest.fixture(scope="session")
def ssh_nodes() -> dict[str, Any]:
    """$DEV_ROOT/ssh/nodes.json of cluster/dev/sshd-nodes.sh, all sshd listening."""
    start = f"{DEV_SCRIPTS}/sshd-nodes.sh up"
    desc = _load(DEV_ROOT / "ssh" / "nodes.json", "sshd nodes", start)
    down = [n["name"] for n in desc["nodes"] if not _tcp_open(n["host"], n["port"])]
    if down:
        _missing(f"sshd of {', '.join(down)} not listening", start)
    return desc


@pytest.fixture(scope="session")
def slurm_cluster() -> dict[str, Any]:
    """$DEV_ROOT/slurm/cluster.json of cluster/dev/slurm.sh, slurmctld answering.

    Commands need SLURM_CONF=desc["conf"] (also in desc["env"]).
    """
    start = f"{DEV_SCRIPTS}/slurm.sh up"
    desc = _load(DEV_ROOT / "slurm" / "cluster.json", "Slurm cluster", start)
    env = {**os.environ, **desc["env"]}
    try:
        out = subprocess.run(
            ["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        _missing(f"scontrol ping failed ({exc})", start)
    if "UP" not in out:
        _missing(f"slurmctld not answering ({out.strip() or 'no output'})", start)
    return desc


@pytest.fixture(scope="module")
def ray_up():
    """A local Ray instance on this machine's 2 CPUs for a module's actors (left running if one already was)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture
def state_path(tmp_path: Path):
    """The test's state file; whatever it still records at the end (a test that failed half-way) is
    brought down, so one failure does not leave engines, trainers or Slurm jobs to the next tests."""
    path = tmp_path / "rl360" / "state.json"
    yield path
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if doc.get("components") or doc.get("tiers"):
        run_cli("down", state=path, cwd=tmp_path, timeout=300)


def run_cli(*args: str, state: Path, cwd: Path = REPO, timeout: float = 120, env: dict | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
    """Run `rl360 ARGS` as a user would, in a subprocess, against `state`."""
    full_env = {**os.environ, "RL360_STATE": str(state), "COLUMNS": "200", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "rl360cli", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"rl360 {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def cli(state_path: Path):
    """`cli("status", "--json")` runs the CLI against this test's own state file."""

    def call(*args: str, **kwargs) -> subprocess.CompletedProcess:
        return run_cli(*args, state=state_path, **kwargs)

    return call


# cluster/dev/test.sh runs the tests not marked slow as two pytest processes side by side: RL360_TEST_PART=services
# takes the tests that use the shared dev services, one after another (some stop or kill a node: a slurmd, a
# dockerd, which would fail another test on that node), and RL360_TEST_PART=others the rest. Not pytest-xdist's
# --dist loadgroup: under pytest 9 it groups nothing (it renames the ids through `item._nodeid`, which pytest 9
# no longer reads; seen 2026-12-06, tests/images/ on both workers, two at once stopping and starting n9).
SERVICE_MARKERS = ("docker", "slurm", "sshd")
SERVICE_PATHS = ("tests/slurm/", "tests/dev/", "tests/images/", "tests/loop/test_chaos_ci.py")
SERVICE_FIXTURES = {"docker_nodes", "docker_node_specs", "slurm_cluster", "slurm", "ssh_nodes", "spare_node"}
TEST_PARTS = ("services", "others")


def uses_dev_services(item: pytest.Item) -> bool:
    path = item.path.resolve().relative_to(REPO).as_posix()
    return (path.startswith(SERVICE_PATHS) or any(item.get_closest_marker(m) for m in SERVICE_MARKERS)
            or bool(SERVICE_FIXTURES & set(getattr(item, "fixturenames", ()))))


def pytest_collection_modifyitems(config, items):
    part = os.environ.get("RL360_TEST_PART")
    if not part:
        return
    if part not in TEST_PARTS:
        raise pytest.UsageError(f"RL360_TEST_PART={part!r}: use one of {', '.join(TEST_PARTS)}, or leave it unset")
    kept, dropped = [], []
    for item in items:
        (kept if uses_dev_services(item) == (part == "services") else dropped).append(item)
    config.hook.pytest_deselected(items=dropped)
    items[:] = kept
