"""provision -> status -> down on the real dev Slurm, one job per tier and one heterogeneous job."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rl360cli.backends.slurm import SlurmBackend
from rl360cli.config import load_profile
from rl360cli.state.store import StateFile
from tests.slurm.conftest import DEV_PROFILE, sacct_states, squeue_ids, start_component, write_profile

pytestmark = pytest.mark.slurm


def job_ids(doc: dict) -> set[str]:
    return {str(t[k]) for t in doc["tiers"].values() for k in ("job_id", "het_leader") if t.get(k)}


def test_provision_status_down(rl360, state_path):
    proc = rl360("provision", "--profile", str(DEV_PROFILE))
    assert proc.returncode == 0, proc.stderr
    doc = rl360.doc()
    tiers = doc["tiers"]
    assert set(tiers) == {"service", "training", "rollout"}
    assert all(t["status"] == "ready" and t["backend"] == "slurm" for t in tiers.values())
    # Whole nodes: three different fake nodes, each recorded with its address.
    nodes = [n for t in tiers.values() for n in t["nodes"]]
    assert len(nodes) == 3 and len(set(nodes)) == 3
    assert all(doc["nodes"][n]["address"] == "127.0.0.1" for n in nodes)
    ids = job_ids(doc)
    assert len(ids) == 3 and ids <= squeue_ids()
    # What was submitted is exactly what `rl360 plan` shows.
    backend = SlurmBackend(load_profile(DEV_PROFILE), StateFile(state_path))
    for name, tier in tiers.items():
        assert Path(tier["script"]).read_text() == backend.sbatch_script((name,))

    report = rl360.status()
    assert {n: t["job_id"] for n, t in report["tiers"].items()} == {n: t["job_id"] for n, t in tiers.items()}

    again = rl360("provision", "--profile", str(DEV_PROFILE))
    assert again.returncode == 0 and "already provisioned" in again.stderr
    assert job_ids(rl360.doc()) == ids

    down = rl360("down", "--json")
    assert down.returncode == 0, down.stderr
    assert sorted(json.loads(down.stdout)["tiers"]) == ["rollout", "service", "training"]
    assert not ids & squeue_ids()
    assert set(sacct_states(ids).values()) == {"CANCELLED"}
    assert rl360.doc()["tiers"] == {}


def test_hetjob_puts_the_tiers_on_disjoint_nodes(rl360, tmp_path):
    profile = write_profile(tmp_path, "dev-het", slurm={"mode": "hetjob"})
    proc = rl360("provision", "--profile", str(profile))
    assert proc.returncode == 0, proc.stderr
    tiers = rl360.doc()["tiers"]
    leaders = {t["het_leader"] for t in tiers.values()}
    assert len(leaders) == 1 and [t["het_group"] for t in tiers.values()] == [0, 1, 2]
    # One het job, a component (its own job id) per tier, on three different nodes.
    assert len({t["job_id"] for t in tiers.values()}) == 3
    node_sets = [set(t["nodes"]) for t in tiers.values()]
    assert all(a.isdisjoint(b) for i, a in enumerate(node_sets) for b in node_sets[i + 1:])
    # A component on a non-leader group runs as a step of that group.
    rec = start_component(rl360.state, name="sleeper", tier="rollout", argv=["sleep", "300"])
    assert rec["job_id"] == tiers["rollout"]["job_id"] and rec["node"] in tiers["rollout"]["nodes"]
    report = rl360.status()
    assert report["components"]["rollout/sleeper"]["status"] == "running"
    ids = job_ids(rl360.doc())
    assert rl360("down").returncode == 0
    assert not ids & squeue_ids()
    assert set(sacct_states(ids).values()) == {"CANCELLED"}


def test_ten_concurrent_status_calls_cost_one_sacct(rl360, tmp_path, state_path):
    """Every Slurm command goes through a wrapper that logs the call, then runs the real tool."""
    profile = write_profile(tmp_path, "dev-poll", slurm={"exclusive": False, "poll_interval_s": 30.0,
                                                           "max_poll_interval_s": 60.0},
                            tiers={t: {"num_nodes": 1, "cpus_per_node": 1} for t in ("service", "training", "rollout")})
    assert rl360("provision", "--profile", str(profile)).returncode == 0
    start_component(rl360.state, name="sleeper", tier="training", argv=["sleep", "300"])
    calls = tmp_path / "calls.log"
    wrappers = tmp_path / "bin"
    wrappers.mkdir()
    for tool in ("sacct", "squeue", "sinfo"):
        real = subprocess.run(["which", tool], capture_output=True, text=True, check=True).stdout.strip()
        (wrappers / tool).write_text(f'#!/bin/sh\necho {tool} >> {calls}\nexec {real} "$@"\n')
        (wrappers / tool).chmod(0o755)
    (state_path.parent / "slurm-poll.json").unlink()  # start from no cached poll at all
    env = {**os.environ, "PATH": f"{wrappers}:{os.environ['PATH']}", "RL360_STATE": str(state_path), "COLUMNS": "200"}
    procs = [subprocess.Popen([sys.executable, "-m", "rl360cli", "status", "--json"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(10)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outputs]
    seen = [json.loads(out)["components"]["training/sleeper"]["status"] for out, _ in outputs]
    assert seen == ["running"] * 10
    lines = calls.read_text().split()
    assert lines.count("sacct") == 1 and lines.count("squeue") == 1 and lines.count("sinfo") == 1



def test_status_when_slurm_does_not_answer_says_unknown_and_backs_off(rl360, tmp_path, state_path, slurm):
    """Slurm that does not answer is not evidence that anything ended: components stay in the state, as
    `running` while sacct (slurmdbd) still answers, as `unknown` when neither does; a failed poll is cached
    with a doubled interval instead of being retried by every call."""
    small = {t: {"num_nodes": 1, "cpus_per_node": 1} for t in ("service", "training", "rollout")}
    options = {"exclusive": False, "poll_interval_s": 5.0}
    assert rl360("provision", "--profile", str(write_profile(tmp_path, "dev-deaf", slurm=options,
                                                             tiers=small))).returncode == 0
    start_component(rl360.state, name="sleeper", tier="rollout", argv=["sleep", "300"])
    before = rl360.doc()
    conf = Path(slurm["conf"]).read_text()
    poll_file = state_path.parent / "slurm-poll.json"

    def view(name: str, **ports) -> Path:
        """The same cluster through a config whose daemons' ports nothing listens on."""
        text = conf
        for key, port in ports.items():
            text = re.sub(rf"(?m)^{key}=.*$", f"{key}={port}", text)
        (tmp_path / f"{name}.conf").write_text(text)
        return write_profile(tmp_path, name, slurm={**options, "slurm_conf": str(tmp_path / f"{name}.conf"),
                                                    "command_timeout_s": 4.0}, tiers=small)

    def sleeper(profile: Path) -> dict:
        proc = rl360("status", "--json", "--profile", str(profile))
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["components"]["rollout/sleeper"]

    no_ctld = view("dev-no-ctld", SlurmctldPort=1)
    poll_file.unlink()
    assert sleeper(no_ctld)["status"] == "running"  # sacct still knows the step
    assert "squeue" in json.loads(poll_file.read_text())["errors"]

    deaf = view("dev-deaf-view", SlurmctldPort=1, AccountingStoragePort=2)
    poll_file.unlink()
    seen = sleeper(deaf)
    assert seen["status"] == "unknown" and seen["reason"] == "Slurm did not answer (sacct, sinfo, squeue)"
    poll = json.loads(poll_file.read_text())
    assert poll["failures"] == 1 and poll["num_polls"] == 1
    assert sleeper(deaf)["status"] == "unknown"
    assert json.loads(poll_file.read_text())["num_polls"] == 1  # backed off: no second poll within 2 x 5 s
    after = rl360.doc()
    assert after["tiers"] == before["tiers"] and set(after["components"]) == set(before["components"])

    poll_file.unlink()  # Slurm answers again: the truth comes back
    assert rl360.status()["components"]["rollout/sleeper"]["status"] == "running"
