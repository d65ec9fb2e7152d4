"""Stopping is not failing: `rl360 down` during a run ends it `stopped`, and the `rl360 up` that followed it
says so and exits 4. A real run on the local backend (engines behind the real router, Ray, the trainer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from rl360cli.backends import procinfo
from rl360cli.loop import driver
from rl360cli.state import StateFile
from tests.conftest import REPO, run_cli
from tests.loop.conftest import write_run_files

# Small and long: it is certain to be under way when `down` comes.
RECIPE = """
[model]
kind = "tiny"
warmup_steps = 30
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


@pytest.mark.slow
def test_down_during_a_run_stops_it_and_the_follower_says_so(tmp_path, state_path):
    run_folder = tmp_path
    recipe = write_run_files(run_folder, recipe_body=RECIPE, name="stopme")
    follower = subprocess.Popen([sys.executable, "-m", "rl360cli", "up", "--recipe", str(recipe)], cwd=run_folder,
                                env={**os.environ, "RL360_STATE": str(state_path), "COLUMNS": "200"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_id = _wait_for_step(state_path, follower, step=1, timeout_s=300)
        down = run_cli("down", "--grace", "5", state=state_path, cwd=run_folder)
        assert down.returncode == 0, down.stderr
        assert f"run {run_id}: stopped by rl360 down" in down.stderr
        stdout, stderr = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
            run_cli("down", "--grace", "1", state=state_path, cwd=run_folder)
    run = json.loads(state_path.read_text())["runs"][run_id]
    assert run["status"] == "stopped", run
    assert run["reason"] == "stopped by rl360 down" and run["ended_at"]
    assert 1 <= run["step"] < 200
    assert follower.returncode == 4, stdout + stderr
    last = stdout.strip().splitlines()[-1]
    assert last.startswith(f"run {run_id} stopped after ") and last.endswith("; stopped by rl360 down"), last
    # `rl360 status` agrees, and the state file still loads for the next run.
    status = run_cli("status", "--json", state=state_path, cwd=run_folder)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["runs"][run_id]["status"] == "stopped"
    assert_nothing_left(state_path)


def _wait_for_step(state_path, follower: subprocess.Popen, *, step: int, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert follower.poll() is None, follower.communicate()
        if state_path.exists():
            doc = json.loads(state_path.read_text())
            run = doc["runs"].get(doc.get("current_run") or "")
            if run and run.get("step", 0) >= step:
                return doc["current_run"]
        time.sleep(0.3)
    raise AssertionError(f"the run did not reach step {step} in {timeout_s:g}s")


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
    driver.set_run(state, "r1", status="running", pid=1, step=3)
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


def assert_nothing_left(state_path) -> None:
    """No component of the state still runs: what `down` stopped is gone, and what `up` started after it
    (the early stop) `up` stopped itself."""
    for cid, rec in json.loads(state_path.read_text())["components"].items():
        assert rec["status"] in ("stopped", "exited", "failed"), (cid, rec["status"])
        assert not procinfo.is_alive(rec["pid"], rec.get("pid_start")), cid


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
