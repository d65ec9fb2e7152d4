"""A CI-sized local-smoke: the real recipe's policy and settings, fewer steps; the reward rises by a
clear margin, and the trainer and every engine end on the same policy version."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.loop.conftest import TASKS, metrics_of, write_run_files

pytestmark = pytest.mark.slow

NUM_STEPS = 12


def ci_sized_recipe(folder: Path) -> Path:
    """recipes/local-smoke.toml with fewer steps (and half the tasks per step), on free ports."""
    recipe = write_run_files(folder, recipe_body="")  # writes profile.toml on free ports
    text = (REPO / "recipes" / "local-smoke.toml").read_text()
    text = re.sub(r"(?m)^num_steps = \d+", f"num_steps = {NUM_STEPS}", text)
    text = re.sub(r"(?m)^num_tasks_per_step = \d+", "num_tasks_per_step = 16", text)
    text = text.replace('profile = "../cluster/local.toml"', 'profile = "profile.toml"')
    text = text.replace('path = "tasks/arith-32"', f'path = "{TASKS}"')
    # Held-out evaluation has its own test (tests/loop/test_eval.py): here it would only add minutes.
    text = text.replace('path = "tasks/arith-heldout"', 'path = ""')
    recipe.write_text(text)
    return recipe


def test_a_ci_sized_local_smoke_learns(run_folder, state_path):
    recipe = ci_sized_recipe(run_folder)
    up = run_cli("up", "--recipe", str(recipe), state=state_path, cwd=run_folder, timeout=1200)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    rewards = [row["reward_mean"] for row in metrics_of(state_path)]
    assert len(rewards) == NUM_STEPS
    start, end = statistics.mean(rewards[:2]), statistics.mean(rewards[-3:])
    assert end >= start + 0.15, rewards

    doc = json.loads(state_path.read_text())
    run = doc["runs"][doc["current_run"]]
    assert run["status"] == "finished"
    assert set(run["engine_versions"].values()) == {run["policy_version"]} and run["policy_version"] > 0
    # W&B ran offline and left its files in the run folder; every step is in metrics.jsonl too.
    assert list((Path(run["run_dir"]) / "wandb").glob("offline-run-*"))
    assert run_cli("down", state=state_path, cwd=run_folder).returncode == 0
