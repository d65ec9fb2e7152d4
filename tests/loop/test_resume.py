"""`rl360 up --resume`: a run brought down mid-way, or whose trainer was killed, continues from its last
checkpoint, each step trained once (the step ledger)."""

from __future__ import annotations

import json
import time

import pytest

from rl360cli.loop.ledger import read_ledger
from rl360cli.loop.train_loop import latest_checkpoint
from rl360cli.trainer.fault_points import FAULT_ENV
from tests.conftest import run_cli
from tests.loop.conftest import metrics_of, write_run_files

pytestmark = pytest.mark.slow

RECIPE = """
[model]
kind = "tiny"
warmup_steps = 30
[loop]
num_steps = 4
num_tasks_per_step = 4
num_samples_per_task = 4
max_generation_rounds = 1
[trainer]
checkpoint_every = 1
[rollout]
num_session_actors = 1
max_new_tokens = 24
[grpo]
filter_zero_std = false
"""


def test_down_mid_run_then_resume_finishes_from_the_checkpoint(run_folder, state_path):
    recipe = write_run_files(run_folder, recipe_body=RECIPE)
    assert run_cli("up", "--recipe", str(recipe), "--detach", state=state_path, cwd=run_folder,
                   timeout=600).returncode == 0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        doc = json.loads(state_path.read_text())
        run_id = doc["current_run"]
        if doc["runs"][run_id].get("step", 0) >= 2:
            break
        time.sleep(0.5)
    assert run_cli("down", "--grace", "5", state=state_path, cwd=run_folder).returncode == 0
    stopped = json.loads(state_path.read_text())["runs"][run_id]
    assert stopped["status"] == "stopped" and 2 <= stopped["step"] < 4

    resumed = run_cli("up", "--recipe", str(recipe), "--resume", state=state_path, cwd=run_folder, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    doc = json.loads(state_path.read_text())
    assert doc["current_run"] == run_id  # the same run, not a new one
    run = doc["runs"][run_id]
    assert run["status"] == "finished" and run["step"] == 4
    # Filtering is off, so every step updates: version 4 after 4 steps, also across the resume.
    assert run["policy_version"] == 4
    assert set(run["engine_versions"].values()) == {4}
    log = (state_path.parent / "runs" / run_id / "logs" / "training.trainer.log").read_text()
    assert "resumed from" in log and "at step" in log
    # One row per step: the rows of steps run again after the checkpoint replace those from before.
    assert [row["step"] for row in metrics_of(state_path)] == [0, 1, 2, 3]
    # The step ledger: each step once, trained on its own groups, none twice (tests/loop/test_resume_ledger.py
    # kills the trainer at exact points; this is the same check through `rl360 down` and `up --resume`).
    ledger = read_ledger(state_path.parent / "runs" / run_id / "ledger.jsonl")
    assert [entry["step"] for entry in ledger] == [0, 1, 2, 3]
    assert [entry["policy_version"] for entry in ledger] == [1, 2, 3, 4]
    for entry in ledger:
        assert entry["groups"] and all(g.startswith(f"s{entry['step']}-r0-") for g in entry["groups"])
    trained = [g for entry in ledger for g in entry["groups"]]
    assert len(trained) == len(set(trained))
    assert run_cli("down", state=state_path, cwd=run_folder).returncode == 0


def test_trainer_killed_before_its_first_checkpoint_resumes_with_its_engines_still_up(run_folder, state_path):
    """The trainer dies (the test-only fault hook, rl360cli/trainer/fault_points.py) after step 1's
    update and broadcast, before any checkpoint: its engines, still up, serve version 2. The resume
    starts over from the policy's version 0, sends those weights to the same engines first, and
    trains each step once."""
    recipe = write_run_files(run_folder, recipe_body=RECIPE.replace("checkpoint_every = 1", "checkpoint_every = 2"))
    up = run_cli("up", "--recipe", str(recipe), "--detach", state=state_path, cwd=run_folder, timeout=600,
                 env={FAULT_ENV: "after_update@1"})
    assert up.returncode == 0, up.stdout + up.stderr
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        status = json.loads(run_cli("status", "--json", state=state_path, cwd=run_folder).stdout)
        run_id = status["current_run"]
        if status["runs"][run_id]["status"] not in ("starting", "running"):
            break
        time.sleep(1)
    assert status["runs"][run_id]["status"] == "failed"
    engines_before = {cid: rec["pid"] for cid, rec in status["components"].items() if rec["kind"].startswith("engine")}
    assert engines_before and all(status["components"][cid]["status"] == "running" for cid in engines_before)
    run_dir = state_path.parent / "runs" / run_id
    assert [e["step"] for e in read_ledger(run_dir / "ledger.jsonl")] == [0]
    assert latest_checkpoint(run_dir / "checkpoints") is None

    resumed = run_cli("up", "--recipe", str(recipe), "--resume", state=state_path, cwd=run_folder, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    doc = json.loads(state_path.read_text())
    run = doc["runs"][run_id]
    assert run["status"] == "finished" and run["step"] == 4 and run["policy_version"] == 4
    assert set(run["engine_versions"].values()) == {4}
    # The same engine processes served before and after: the resume reused them, and corrected them first.
    assert {cid: doc["components"][cid]["pid"] for cid in engines_before} == engines_before
    ledger = read_ledger(run_dir / "ledger.jsonl")
    assert [e["step"] for e in ledger] == [0, 1, 2, 3] and [e["policy_version"] for e in ledger] == [1, 2, 3, 4]
    log = (run_dir / "logs" / "training.trainer.log").read_text()
    assert f"{FAULT_ENV}=after_update@1: exiting" in log
    # Step 0 was logged before the kill and again after the resume: it keeps one row, the later one.
    assert [row["step"] for row in metrics_of(state_path)] == [0, 1, 2, 3]
    assert run_cli("down", state=state_path, cwd=run_folder).returncode == 0
