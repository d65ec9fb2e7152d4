"""The same loop with its tiers on the real dev Slurm: engines, router and trainer as job steps on
three different fake nodes; the run finishes in sync and `down` leaves no job behind."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import REPO, run_cli
from tests.loop.conftest import LOCAL_SMOKE_SEED, metrics_of, write_run_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RECIPE = """
[model]
kind = "tiny"
# local-smoke's policy v0 (with its seed, below): built once per machine (rl360cli/trainer/cache.py)
# and shared with the other tests that use it
warmup_steps = 172
[loop]
num_steps = 3
num_tasks_per_step = 6
num_samples_per_task = 4
max_generation_rounds = 1
[engine]
num_threads = 1
[rollout]
# A rollout tier whose Ray worker never joins fails the run in two minutes, not at the test's timeout.
actor_start_timeout_s = 120
[sandbox]
cpus = 0.05
memory_mb = 256
"""


def test_a_run_on_the_dev_slurm_tiers(slurm_cluster, run_folder, state_path):
    recipe = write_run_files(run_folder, recipe_body=RECIPE, seed=LOCAL_SMOKE_SEED)
    text = recipe.read_text().replace('profile = "profile.toml"', f'profile = "{REPO}/cluster/dev-slurm.toml"')
    recipe.write_text(text)
    try:
        up = run_cli("up", "--recipe", str(recipe), state=state_path, cwd=run_folder, timeout=540)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        doc = json.loads(state_path.read_text())
        run = doc["runs"][doc["current_run"]]
        assert run["status"] == "finished" and run["step"] == 3
        assert set(run["engine_versions"].values()) == {run["policy_version"]}
        comps = doc["components"]
        nodes = {comps[c]["node"] for c in ("service/router", "rollout/engine-0", "training/trainer")}
        assert len(nodes) == 3  # each tier on its own fake node
        assert all(comps[c].get("job_id") for c in comps)
        rows = metrics_of(state_path)
        assert len(rows) == 3 and all(row["reward_mean"] is not None for row in rows)
        jobs = {str(t["job_id"]) for t in doc["tiers"].values()}
    finally:
        down = run_cli("down", state=state_path, cwd=run_folder, timeout=300)
    assert down.returncode == 0, down.stderr
    env = {**os.environ, **slurm_cluster["env"]}
    queued = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout.split()
    assert not jobs & set(queued)
