"""A harness written only against docs/agents.md trains: `rl360 up` with `[agent] harness =
"python:simple_agent:run"` (tests/agent/user_harness/simple_agent.py: the official `openai` client, a `bash`
tool, several turns, nothing of rl360 imported) on local-smoke's policy and tasks, for two steps. Its
sessions reach the model only through their endpoints, their commands run in the sandboxes, the trainer
trains on what the endpoints recorded, and the engines end on the trainer's version."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.loop.conftest import LOCAL_SMOKE_V0, TASKS, metrics_of, write_run_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NUM_STEPS = 2
USER_HARNESS = Path(__file__).parent / "user_harness"


def test_a_users_openai_harness_trains_through_rl360(run_folder, state_path):
    recipe = write_run_files(run_folder, recipe_body="")
    text = (REPO / "recipes" / "local-smoke.toml").read_text()
    text = re.sub(r"(?m)^num_steps = \d+", f"num_steps = {NUM_STEPS}", text)
    text = re.sub(r"(?m)^num_tasks_per_step = \d+", "num_tasks_per_step = 8", text)
    text = text.replace('profile = "../cluster/local.toml"', 'profile = "profile.toml"')
    text = text.replace('path = "tasks/arith-32"', f'path = "{TASKS}"')
    text = text.replace('path = "models/local-smoke-v0"', f'path = "{LOCAL_SMOKE_V0}"')
    text = text[:text.index("[eval]")] + '[agent]\nharness = "python:simple_agent:run"\n'
    recipe.write_text(text)
    # The session actors import the harness: it is on their path as a user's package would be installed.
    up = run_cli("up", "--recipe", str(recipe), state=state_path, cwd=run_folder, timeout=900,
                 env={"PYTHONPATH": f"{USER_HARNESS}:{REPO}"})
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    rows = metrics_of(state_path)
    assert len(rows) == NUM_STEPS
    # Its sessions were the model's: rewards, no infra failure, every history continued (no tito break).
    assert all(row["infra_failures"] == 0 and row["tito_breaks"] == 0 for row in rows), rows
    assert sum(row["batch"]["kept"] for row in rows) > 0 and 0 < rows[0]["reward_mean"] < 1
    doc = json.loads(state_path.read_text())
    run = doc["runs"][doc["current_run"]]
    assert run["status"] == "finished" and run["policy_version"] == NUM_STEPS
    assert set(run["engine_versions"].values()) == {NUM_STEPS}
    kept = [json.loads(line) for line in (Path(run["run_dir"]) / "samples.jsonl").read_text().splitlines()]
    # What trained: the instruction, the model's fenced command, the tool's observation, its last word.
    assert any("[exit code 0]" in (sample["text"] or "") for sample in kept)
