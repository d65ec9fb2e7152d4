"""Fixtures for the Slurm backend tests: the real dev Slurm, test profiles, a CLI that cleans up after itself.

The dev cluster (`cluster/dev/slurm.sh up`: four fake nodes n1..n4) is shared
with every other test, so each test works only with the jobs its own state
file records, and a test that provisioned brings its tiers down (`rl360 down`)
whatever happened. Profiles are variants of `cluster/dev-slurm.toml` written
into the test's folder.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import DEV_ROOT, REPO, run_cli

DEV_PROFILE = REPO / "cluster" / "dev-slurm.toml"
SLURM_SH = REPO / "cluster" / "dev" / "slurm.sh"


def write_profile(folder: Path, name: str, *, slurm: dict | None = None, tiers: dict | None = None) -> Path:
    """A copy of the dev profile named `name`, with `[slurm]` keys and `[tiers.X]` tables replaced."""
    text = DEV_PROFILE.read_text().replace('name = "dev-slurm"', f'name = "{name}"')
    for key, value in (slurm or {}).items():
        line = f"{key} = {json.dumps(value)}"
        text, count = re.subn(rf"(?m)^{key} = .*$", line, text)
        if not count:
            text = text.replace("[slurm]\n", f"[slurm]\n{line}\n")
    for tier, table in (tiers or {}).items():
        body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items())
        text = re.sub(rf"(?ms)^\[tiers\.{tier}\]\n.*?(?=^\[|\Z)", f"[tiers.{tier}]\n{body}\n", text)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def slurm(slurm_cluster) -> dict:
    """The dev cluster, with its SLURM_CONF exported for the Slurm commands the tests run themselves."""
    os.environ.update(slurm_cluster["env"])
    return slurm_cluster


def slurm_out(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=60).stdout


def squeue_ids() -> set[str]:
    """Every job id squeue lists now (all components of het jobs)."""
    return set(slurm_out("squeue", "-h", "-a", "-o", "%A").split())


# slurmdbd records a job's or step's end asynchronously: right after squeue stops listing it, sacct may
# still say RUNNING for a few seconds. The readers below poll until the record has settled.
UNSETTLED = {"PENDING", "RUNNING", "REQUEUED", "COMPLETING", "RESIZING", "SUSPENDED"}
ACCOUNTING_LAG_S = 30.0


def _settled(read, timeout_s: float = ACCOUNTING_LAG_S) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        states = read()
        if not UNSETTLED & set(states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


def _sacct(*args: str) -> dict[str, str]:
    out = slurm_out("sacct", "-n", "-P", "-o", "JobIDRaw,State", *args)
    return {line.split("|")[0]: line.split("|")[1].split()[0] for line in out.splitlines() if "|" in line}


def sacct_states(job_ids) -> dict[str, str]:
    """Raw job id -> settled sacct state (first word), for jobs only (no steps)."""
    return _settled(lambda: _sacct("-X", "-j", ",".join(job_ids)))


def sacct_step_state(step_key: str) -> str:
    """The settled sacct state of one step ("66.1")."""
    job_id = step_key.split(".")[0]
    return _settled(lambda: {step_key: _sacct("-j", job_id).get(step_key, "PENDING")})[step_key]


def dev_slurm(*args: str) -> None:
    proc = subprocess.run(["bash", str(SLURM_SH), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"slurm.sh {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"


class SlurmCli:
    """`rl360` against one test's state file; remembers every Slurm job the state ever recorded and
    brings them down at the end, so a failed test leaves nothing behind on the shared cluster."""

    def __init__(self, state: Path):
        self.state = state
        self.seen_jobs: set[str] = set()

    def __call__(self, *args: str, timeout: float = 180, env: dict | None = None,
                 check: bool = False) -> subprocess.CompletedProcess:
        proc = run_cli(*args, state=self.state, timeout=timeout, env=env, check=check)
        self.remember()
        return proc

    def doc(self) -> dict:
        return json.loads(self.state.read_text()) if self.state.exists() else {"tiers": {}, "components": {}}

    def remember(self) -> None:
        for tier in self.doc().get("tiers", {}).values():
            for key in ("job_id", "het_leader"):
                if tier.get(key):
                    self.seen_jobs.add(str(tier[key]))
            self.seen_jobs.update(str(j) for j in tier.get("previous_job_ids") or [])
            if tier.get("pending"):
                self.seen_jobs.add(str(tier["pending"]["job_id"]))

    def status(self) -> dict:
        proc = self("status", "--json")
        assert proc.returncode in (0, 3), proc.stderr
        return json.loads(proc.stdout)

    def wait_status(self, predicate, *, timeout_s: float = 60, interval_s: float = 0.5) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            report = self.status()
            if predicate(report):
                return report
            if time.monotonic() > deadline:
                raise AssertionError(f"status never satisfied the condition: {json.dumps(report)[:2000]}")
            time.sleep(interval_s)

    def cleanup(self) -> None:
        if self.state.exists():
            self("down", "--grace", "2")
        left = sorted(self.seen_jobs & squeue_ids())
        if left:
            subprocess.run(["scancel", *left], capture_output=True, timeout=60)


@pytest.fixture
def rl360(state_path: Path, slurm) -> SlurmCli:
    cli = SlurmCli(state_path)
    yield cli
    cli.cleanup()


def start_component(state: Path, *, name: str, tier: str, argv: list[str], kind: str = "test",
                    node: str | None = None, run: str | None = None, env: dict | None = None) -> dict:
    """Start a component through the stage code (as `serve`/`train` do), in this process."""
    from rl360cli.backends.base import ComponentSpec
    from rl360cli.stages.base import Context, resolve_profile, start_component as start
    from rl360cli.state.store import StateFile

    state_file = StateFile(state)
    profile, path = resolve_profile(state_file.read(), None, None)
    ctx = Context(state=state_file, profile=profile, profile_path=path)
    spec = ComponentSpec(name=name, tier=tier, stage="serve", kind=kind, argv=tuple(argv), node=node, run=run,
                         env=env or {})
    return start(ctx, spec)


__all__ = ["DEV_ROOT", "write_profile", "start_component", "squeue_ids", "sacct_states", "dev_slurm", "slurm_out"]


def start_spec(state: Path, spec) -> dict:
    """Start a prepared ComponentSpec through the stage code."""
    from rl360cli.stages.base import Context, resolve_profile, start_component as start
    from rl360cli.state.store import StateFile

    state_file = StateFile(state)
    profile, path = resolve_profile(state_file.read(), None, None)
    return start(Context(state=state_file, profile=profile, profile_path=path), spec)
