"""Node loss on the real dev Slurm: a killed slurmd (and its steps) -> node_lost -> the tier requeued on
another node -> the trainer restarted with --resume, continuing from its checkpoint."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from rl360cli.config import load_profile
from tests.slurm.conftest import DEV_PROFILE, dev_slurm, start_component

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
COUNTER = Path(__file__).parent / "components" / "counter.py"


def read_checkpoint(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_killed_slurmd_means_node_lost_then_requeue_and_resume(rl360, tmp_path):
    interval = load_profile(DEV_PROFILE).slurm.poll_interval_s
    assert rl360("provision", "--profile", str(DEV_PROFILE)).returncode == 0
    tiers = rl360.doc()["tiers"]
    victim = tiers["training"]["nodes"][0]
    checkpoint = tmp_path / "checkpoint.json"
    rec = start_component(rl360.state, name="trainer", tier="training", kind="trainer",
                          argv=[sys.executable, str(COUNTER), str(checkpoint)])
    assert rec["node"] == victim
    wait_for(lambda: read_checkpoint(checkpoint).get("step", 0) >= 10, 120, "the trainer to checkpoint")

    dev_slurm("kill-node", victim)
    try:
        step_at_loss = read_checkpoint(checkpoint)["step"]
        # `rl360 status` once per poll interval: node_lost within two of them on a quiet machine (the
        # holder's heartbeats stop; docs/slurm.md); under load a late heartbeat can take a few more.
        polls = []
        for _ in range(10):
            time.sleep(interval)
            trainer = rl360.status()["components"]["training/trainer"]
            polls.append((trainer["status"], trainer["reason"]))
            if trainer["reason"] == "node_lost":
                break
        assert ("failed", "node_lost") in polls, polls
        print(f"\nnode_lost seen at poll {len(polls)} (every {interval:g}s)")

        report = rl360.wait_status(
            lambda r: r["tiers"]["training"]["status"] == "ready"
            and r["components"]["training/trainer"]["status"] == "running"
            and r["tiers"]["training"]["nodes"] != [victim], timeout_s=240, interval_s=interval)
        training = report["tiers"]["training"]
        assert training["requeues"] == 1 and training["lost_nodes"] == [victim]
        assert training["job_id"] != tiers["training"]["job_id"]
        assert tiers["training"]["job_id"] in training["previous_job_ids"]
        new_node = training["nodes"][0]
        trainer = report["components"]["training/trainer"]
        assert trainer["node"] == new_node and trainer["restarts"] == 1 and trainer["command"][-1] == "--resume"
        # The other tiers were not touched.
        assert {t: report["tiers"][t]["job_id"] for t in ("service", "rollout")} == \
            {t: tiers[t]["job_id"] for t in ("service", "rollout")}
        resumed = wait_for(lambda: (c := read_checkpoint(checkpoint)).get("node") == new_node and c, 120,
                           "the restarted trainer to checkpoint on its new node")
        assert resumed["step"] > step_at_loss
        log = Path(rec["log_path"]).read_text()
        resumed_from = int(log.split("resumed from step ")[1].split()[0])
        assert resumed_from == step_at_loss  # the last checkpoint written before the node died
    finally:
        dev_slurm("revive-node", victim)
