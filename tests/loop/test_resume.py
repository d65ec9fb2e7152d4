"""`rl360 up --resume`: a run whose trainer was killed, and then brought down mid-way, continues each time
from its last checkpoint, each step trained once (the step ledger). Stopping is not failing: the `rl360
up --resume` that followed the run `rl360 down` stopped says so and exits 4."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from rl360cli.loop.ledger import read_ledger
from rl360cli.loop.train_loop import latest_checkpoint
from rl360cli.trainer.fault_points import FAULT_ENV
from tests.conftest import run_cli
from tests.loop.conftest import LOCAL_SMOKE_V0, assert_nothing_left, metrics_of, write_run_files

pytestmark = pytest.mark.slow

STEPS = 6

RECIPE = f"""
[model]
kind = "huggingface"
path = "{LOCAL_SMOKE_V0}"
[loop]
num_steps = 6
num_tasks_per_step = 4
num_samples_per_task = 4
max_generation_rounds = 1
[trainer]
checkpoint_every = 2
[rollout]
num_session_actors = 1
max_new_tokens = 24
[grpo]
filter_zero_std = false
"""


def wait_for_run(state_path, run_folder, done, *, timeout_s: float = 600) -> dict:
    """`rl360 status --json` until `done(run record)`; the last status."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = json.loads(run_cli("status", "--json", state=state_path, cwd=run_folder).stdout)
        if done(status["runs"][status["current_run"]]):
            return status
        assert time.monotonic() < deadline, status["runs"][status["current_run"]]
        time.sleep(0.5)


def test_a_trainer_killed_then_a_run_brought_down_both_resume_and_each_step_is_trained_once(run_folder,
                                                                                            state_path):
    """One run, two interruptions. The trainer dies (the test-only fault hook,
    rl360cli/trainer/fault_points.py) after step 1's update and broadcast, before any checkpoint: its
    engines, still up, serve version 2. The first resume starts over from version 0, sends those
    weights to the same engines first, and is brought down with `rl360 down` after its checkpoint at
    step 2: the run is `stopped`, not failed, and the `up --resume` following it says so and exits 4.
    The second resume continues from that checkpoint on new engines and finishes. Every step
    is trained once, on its own groups, and keeps one metrics row."""
    recipe = write_run_files(run_folder, recipe_body=RECIPE)
    up = run_cli("up", "--recipe", str(recipe), "--detach", state=state_path, cwd=run_folder, timeout=600,
                 env={FAULT_ENV: "after_update@1"})
    assert up.returncode == 0, up.stdout + up.stderr
    status = wait_for_run(state_path, run_folder, lambda run: run["status"] not in ("starting", "running"))
    run_id = status["current_run"]
    assert status["runs"][run_id]["status"] == "failed"
    engines_before = {cid: rec["pid"] for cid, rec in status["components"].items() if rec["kind"].startswith("engine")}
    assert engines_before and all(status["components"][cid]["status"] == "running" for cid in engines_before)
    run_dir = state_path.parent / "runs" / run_id
    assert [e["step"] for e in read_ledger(run_dir / "ledger.jsonl")] == [0]
    assert latest_checkpoint(run_dir / "checkpoints") is None

    # The first resume: the same run, the same engine processes (corrected first), down after step 2's checkpoint.
    follower = subprocess.Popen([sys.executable, "-m", "rl360cli", "up", "--recipe", str(recipe), "--resume"],
                                cwd=run_folder, env={**os.environ, "RL360_STATE": str(state_path), "COLUMNS": "200"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while True:  # the state file itself, not `status`: the window before the run's end is a few seconds
            doc = json.loads(state_path.read_text())
            if doc["runs"][run_id].get("step", 0) >= 3 or doc["runs"][run_id]["status"] == "finished":
                break
            assert follower.poll() is None, follower.communicate()
            assert time.monotonic() < deadline, doc["runs"][run_id]
            time.sleep(0.2)
        assert doc["current_run"] == run_id
        assert {cid: doc["components"][cid]["pid"] for cid in engines_before} == engines_before
        down = run_cli("down", "--grace", "5", state=state_path, cwd=run_folder)
        assert down.returncode == 0, down.stderr
        assert f"run {run_id}: stopped by rl360 down" in down.stderr
        stdout, stderr = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
            run_cli("down", "--grace", "1", state=state_path, cwd=run_folder)
    stopped = json.loads(state_path.read_text())["runs"][run_id]
    assert stopped["status"] == "stopped" and 3 <= stopped["step"] < STEPS
    assert stopped["reason"] == "stopped by rl360 down" and stopped["ended_at"]
    assert follower.returncode == 4, stdout + stderr
    last = stdout.strip().splitlines()[-1]
    assert last.startswith(f"run {run_id} stopped after ") and last.endswith("; stopped by rl360 down"), last
    assert "Traceback" not in stderr
    assert_nothing_left(state_path)
    log = (run_dir / "logs" / "training.trainer.log").read_text()
    assert f"{FAULT_ENV}=after_update@1: exiting" in log

    # The second resume: from the newest checkpoint, to the end.
    finished = run_cli("up", "--recipe", str(recipe), "--resume", state=state_path, cwd=run_folder, timeout=600)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    doc = json.loads(state_path.read_text())
    assert doc["current_run"] == run_id  # the same run, not a new one
    run = doc["runs"][run_id]
    # Filtering is off, so every step updates: version 6 after 6 steps, across both resumes.
    assert run["status"] == "finished" and run["step"] == STEPS and run["policy_version"] == STEPS
    assert set(run["engine_versions"].values()) == {STEPS}
    log = (run_dir / "logs" / "training.trainer.log").read_text()
    assert "resumed from" in log and "at step" in log
    # The step ledger: each step once, trained on its own groups, none twice (tests/loop/test_resume_ledger.py
    # kills the trainer at exact points; this is the same check through `rl360 down` and `up --resume`).
    ledger = read_ledger(run_dir / "ledger.jsonl")
    assert [entry["step"] for entry in ledger] == list(range(STEPS))
    assert [entry["policy_version"] for entry in ledger] == list(range(1, STEPS + 1))
    for entry in ledger:
        assert entry["groups"] and all(g.startswith(f"s{entry['step']}-r0-") for g in entry["groups"])
    trained = [g for entry in ledger for g in entry["groups"]]
    assert len(trained) == len(set(trained))
    # One row per step: the rows of steps run again after a kill or a checkpoint replace those from before.
    assert [row["step"] for row in metrics_of(state_path)] == list(range(STEPS))
    assert run_cli("down", state=state_path, cwd=run_folder).returncode == 0
