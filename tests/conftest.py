"""Shared fixtures: a private state file per test, the CLI, and the real dev services.

The dev services (Docker nodes and a loopback registry, sshd nodes, Slurm) are
started by `cluster/dev/all.sh up` (the test command does it). A test that
needs one is skipped when it is not up on a developer's machine, and fails
when `CI=true`: CI must never pass by skipping the real-component tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEV_ROOT = Path(os.environ.get("RL360_DEV_ROOT", "/tmp/rl360-dev"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need(condition: bool, why: str) -> None:
    """Skip (locally) or fail (in CI) when a real component is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{why} (CI=true: real-component tests may not be skipped)")
    pytest.skip(why)


def _service(relative: str, script: str) -> dict:
    path = DEV_ROOT / relative
    need(path.exists(), f"{path} missing: start the dev services with `bash cluster/dev/{script} up`")
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def docker_nodes() -> dict:
    """The dev Docker nodes and registry (cluster/dev/docker-nodes.sh)."""
    return _service("docker/nodes.json", "docker-nodes.sh")


@pytest.fixture(scope="session")
def ssh_nodes() -> dict:
    """The dev sshd nodes on 127.0.1.x (cluster/dev/sshd-nodes.sh)."""
    return _service("ssh/nodes.json", "sshd-nodes.sh")


@pytest.fixture(scope="session")
def slurm_cluster() -> dict:
    """The dev Slurm cluster (cluster/dev/slurm.sh)."""
    return _service("slurm/cluster.json", "slurm.sh")


@pytest.fixture
def state_path(tmp_path: Path) -> Path:
    return tmp_path / "rl360" / "state.json"


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
