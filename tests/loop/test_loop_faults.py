"""The loop under faults, together in one run: injected sandbox failures are masked, never rewards of
0; an engine killed mid-run costs only its in-flight attempts, and the run goes on (here with restarts
off, `max_restarts = 0`: with fewer engines; tests/loop/test_engine_restart.py has it come back)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from rl360cli.backends import procinfo
from tests.conftest import run_cli
from tests.loop.conftest import metrics_of, write_run_files

pytestmark = pytest.mark.slow

SMALL = """
[model]
kind = "tiny"
warmup_steps = 30
[loop]
num_steps = {steps}
num_tasks_per_step = 6
num_samples_per_task = 4
max_generation_rounds = 1
# A 30-step warm-up earns little reward: the runs here test masking, not learning, so a step with
# no trainable group must not stop them (the spinning guard has its own test).
max_steps_without_signal = 0
[rollout]
num_session_actors = 2
max_new_tokens = 24
[engine]
num_engines = {engines}
max_restarts = 0
"""


def test_injected_failures_and_an_engine_killed_mid_run_are_masked_and_the_run_goes_on(run_folder, state_path):
    """Two faults in one run: sandbox failures injected at 25% from the start, then one of the two
    engines killed after step 1 (restarts off). Every injected failure is masked with its cause, never
    a reward of 0; the kill costs only `engine_error` attempts; the survivor serves on and follows
    every weight update."""
    recipe = write_run_files(run_folder, recipe_body=SMALL.format(steps=5, engines=2))
    up = run_cli("up", "--recipe", str(recipe), "--detach", "--inject-failures", "0.25", state=state_path,
                 cwd=run_folder, timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        doc = json.loads(state_path.read_text())
        if doc["runs"][doc["current_run"]].get("step", 0) >= 1:
            break
        assert doc["runs"][doc["current_run"]]["status"] in ("starting", "running")
        time.sleep(0.5)
    victim = doc["components"]["rollout/engine-1"]
    os.kill(victim["pid"], signal.SIGKILL)
    killed_at_step = doc["runs"][doc["current_run"]]["step"]

    follow = run_cli("logs", "--follow", state=state_path, cwd=run_folder, timeout=600)
    assert follow.returncode == 0, follow.stdout[-3000:]
    status = json.loads(run_cli("status", "--json", state=state_path, cwd=run_folder).stdout)
    assert status["components"]["rollout/engine-1"]["status"] == "failed"
    run = status["runs"][status["current_run"]]
    assert run["status"] == "finished" and run["step"] == 5

    rows = metrics_of(state_path)
    assert len(rows) == 5
    for row in rows:
        batch = row["batch"]
        # Every injected failure is masked with its cause, and every sample is in exactly one bucket.
        assert batch.get("masked/injected", 0) == row["injected_failures"]
        assert row["infra_failures_by_cause"].get("injected", 0) == row["injected_failures"]
        assert batch["total"] == row["samples"]
        assert batch["kept"] + batch["masked"] + batch["filtered_zero_std"] + batch["dropped_stale"] \
            + batch["dropped_too_few_valid"] == batch["total"]
        assert batch["masked"] == sum(row["infra_failures_by_cause"].values())
    # 5 steps x 24 samples at 25% (starts and execs both draw): some were injected.
    assert sum(row["injected_failures"] for row in rows) > 0
    # Before the kill only what was injected failed; after it, the kill's engine_error attempts too.
    assert {cause for row in rows[:killed_at_step] for cause in row["infra_failures_by_cause"]} <= {"injected"}
    after = rows[killed_at_step:]
    assert {cause for row in after for cause in row["infra_failures_by_cause"]} <= {"engine_error", "injected"}
    assert sum(row["infra_failures_by_cause"].get("engine_error", 0) for row in after) >= 1
    # The surviving engine serves on and follows every weight update.
    survivors = {url: v for url, v in run["engine_versions"].items() if v is not None}
    assert len(survivors) == 1 and set(survivors.values()) == {run["policy_version"]}

    families = [procinfo.family(rec["supervisor_pid"], rec["pgid"]) for rec in status["components"].values()
                if rec.get("supervisor_pid")]
    assert run_cli("down", state=state_path, cwd=run_folder).returncode == 0
    leftovers = [pid for family in families for pid in family if procinfo.is_alive(pid)]
    assert leftovers == []
