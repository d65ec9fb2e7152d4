"""Stopping is not failing: `rl360 down` ends a run `stopped`, and the `rl360 up` that followed it says so
and exits 4 — here while `up` is still starting the engines (a real run on the local backend), and the
trainer's side of the race. `rl360 down` during a run under way is tests/loop/test_resume.py's (its
first resume is stopped that way)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from rl360cli.run import driver
from rl360cli.state import transitions
from rl360cli.state.store import StateFile
from tests.conftest import REPO, run_cli
from tests.loop.conftest import LOCAL_SMOKE_V0, assert_nothing_left, write_run_files

# Small and long: it is certain to be starting when `down` comes.
RECIPE = f"""
[model]
kind = "huggingface"
path = "{LOCAL_SMOKE_V0}"
[loop]
num_steps = 200
num_tasks_per_step = 4
num_samples_per_task = 4
max_generation_rounds = 1
[rollout]
num_session_actors = 1
max_new_tokens = 24
[grpo]
filter_zero_std = false
"""


def test_a_trainer_that_meets_its_engines_end_after_a_stop_leaves_the_run_stopped(state_path, monkeypatch):
    """The race of `rl360 down`: it records the stop, then stops the engines before the trainer, whose next
    request is reset. The driver's own `main` meets that error here (its `run` raises it)."""
    state = StateFile(state_path)
    with state.update() as doc:
        doc["runs"]["r1"] = {"name": "r", "status": "running", "step": 2}

    def engines_gone_after_the_stop(*args, **kwargs):
        with state.update() as doc:  # what stages/down.py's stop_runs records first
            doc["runs"]["r1"].update(status="stopped", reason="stopped by rl360 down", ended_at="t")
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(driver, "run", engines_gone_after_the_stop)
    assert driver.main(["--state", str(state_path), "--run", "r1"]) == 0
    assert state.read()["runs"]["r1"] == {"name": "r", "status": "stopped", "step": 2,
                                          "reason": "stopped by rl360 down", "ended_at": "t"}
    # And a trainer that reaches the loop only after the stop does not mark it running again.
    transitions.mark_run_running(state, "r1", pid=1)
    transitions.record_run_progress(state, "r1", step=3, policy_version=3, reward_mean=None)
    assert state.read()["runs"]["r1"]["status"] == "stopped" and state.read()["runs"]["r1"]["step"] == 3


def test_a_trainer_that_fails_on_its_own_still_fails_the_run(state_path, monkeypatch):
    state = StateFile(state_path)
    with state.update() as doc:
        doc["runs"]["r1"] = {"name": "r", "status": "running", "step": 2}

    def broken(*args, **kwargs):
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(driver, "run", broken)
    assert driver.main(["--state", str(state_path), "--run", "r1"]) == 3
    run = state.read()["runs"]["r1"]
    assert run["status"] == "failed" and run["reason"].startswith("ConnectionResetError")


@pytest.mark.slow
def test_down_while_up_is_still_starting_the_engines_is_a_stop_too(tmp_path, state_path):
    recipe = write_run_files(tmp_path, recipe_body=RECIPE, name="stopearly")
    follower = subprocess.Popen([sys.executable, "-m", "rl360cli", "up", "--recipe", str(recipe)], cwd=tmp_path,
                                env={**os.environ, "RL360_STATE": str(state_path), "COLUMNS": "200"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            doc = json.loads(state_path.read_text()) if state_path.exists() else {"components": {}}
            if any(c["kind"].startswith("engine") for c in doc["components"].values()):
                break  # the first engine is recorded: `up` waits for it to answer
            time.sleep(0.05)
        down = run_cli("down", "--grace", "2", state=state_path, cwd=tmp_path)
        assert down.returncode == 0, down.stderr
        stdout, stderr = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
            run_cli("down", "--grace", "1", state=state_path, cwd=tmp_path)
    doc = json.loads(state_path.read_text())
    run = doc["runs"][doc["current_run"]]
    assert run["status"] == "stopped" and run["reason"] == "stopped by rl360 down"
    assert follower.returncode == 4, stdout + stderr
    assert "Traceback" not in stderr and stdout.strip().splitlines()[-1].endswith("stopped by rl360 down"), stdout
    assert_nothing_left(state_path)


def test_down_stops_a_run_whose_up_died_before_anything_was_provisioned_from_any_folder(tmp_path, state_path):
    """`rl360 up` killed right after it recorded the run: no profile in the state yet, and `up` again says
    the run is still starting and names `rl360 down`, which must then work from any folder (it takes the
    profile from the run's recipe, here a profile.toml beside it, not ./cluster/local.toml)."""
    recipe = write_run_files(tmp_path, recipe_body=RECIPE, name="died")
    state = StateFile(state_path)
    with state.update() as doc:
        doc["runs"]["died-1"] = {"name": "died", "recipe": str(recipe), "run_dir": str(tmp_path / "runs" / "died-1"),
                                 "status": "starting", "step": 0, "overrides": ["run.seed=5"]}
        doc["current_run"] = "died-1"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    again = run_cli("up", "--recipe", str(recipe), state=state_path, cwd=elsewhere)
    assert again.returncode == 1 and "rl360 down" in again.stderr, again.stderr
    down = run_cli("down", state=state_path, cwd=elsewhere)
    assert down.returncode == 0, down.stderr
    run = state.read()["runs"]["died-1"]
    assert run["status"] == "stopped" and run["reason"] == "stopped by rl360 down"


def test_logs_follow_of_a_stopped_run_says_why_and_exits_4(state_path, tmp_path):
    state = StateFile(state_path)
    with state.update() as doc:
        doc["runs"]["r1"] = {"name": "r", "status": "running", "run_dir": str(tmp_path / "r1"), "step": 2,
                             "num_steps": 9}
        doc["current_run"] = "r1"
    follower = subprocess.Popen([sys.executable, "-m", "rl360cli", "logs", "--follow"], cwd=REPO,
                                env={**os.environ, "RL360_STATE": str(state_path)}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)  # following: the run is still under way
        assert follower.poll() is None
        with state.update() as doc:  # what stages/down.py's stop_runs records
            doc["runs"]["r1"].update(status="stopped", reason="stopped by rl360 down")
        stdout, _ = follower.communicate(timeout=20)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 4
    assert stdout.strip().splitlines()[-1] == "── run r1 stopped at step 2/9 (stopped by rl360 down) ──"
