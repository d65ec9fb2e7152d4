"""`rl360 up --resume`: a run brought down mid-way continues from its last checkpoint."""

from __future__ import annotations

import json
import time

import pytest

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
    steps = [row["step"] for row in metrics_of(state_path)]
    assert steps[-1] == 3 and set(steps) == {0, 1, 2, 3}
    assert run_cli("down", state=state_path, cwd=run_folder).returncode == 0
