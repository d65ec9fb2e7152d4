"""`rl360 tasks calibrate`: a real calibration of local-smoke's starting policy on six of its tasks (engines,
router, control plane, Ray session actors and sandboxes, as `rl360 up` starts them), with sandbox failures
injected; then what the table, the manifest and the run's record say, and bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.loop.conftest import LOCAL_SMOKE_V0, TASKS, write_run_files

K = 4
TASK_NAMES = ["arith-00", "arith-01", "arith-02", "arith-03", "arith-04", "arith-05"]


def local_smoke_recipe(folder: Path) -> Path:
    recipe = write_run_files(folder, recipe_body="")
    text = (REPO / "recipes" / "local-smoke.toml").read_text()
    text = text.replace('profile = "../cluster/local.toml"', 'profile = "profile.toml"')
    text = text.replace('path = "tasks/arith-32"', f'path = "{TASKS}"')
    text = text.replace('path = "models/local-smoke-v0"', f'path = "{LOCAL_SMOKE_V0}"')
    text = text[:text.index("[eval]")]  # its held-out set is not in the test's folder
    recipe.write_text(re.sub(r"(?m)^wandb = true", "wandb = false", text))
    return recipe


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_calibration_scores_each_task_on_policy_v0_and_lists_those_in_band(run_folder, state_path):
    recipe = local_smoke_recipe(run_folder)
    manifest = run_folder / "chosen" / "manifest.json"
    include = [arg for name in TASK_NAMES for arg in ("--include", name)]
    # Sandbox starts and commands fail now and then: those samples have no verdict, their tasks are not chosen.
    proc = run_cli("tasks", "calibrate", str(TASKS), "--recipe", str(recipe), "-k", str(K), "--band", "0.25:1",
                   *include, "--manifest", str(manifest), "--set", "sandbox.inject_failure_rate=0.05", "--json",
                   state=state_path, cwd=run_folder, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    rows = {row["task"]: row for row in result["tasks"]}
    assert sorted(rows) == TASK_NAMES
    for row in rows.values():
        assert row["samples"] == K and row["valid"] + sum(row["infra_failures"].values()) == K
        assert row["pass_rate"] == (row["passed"] / row["valid"] if row["valid"] else None)
    expected = [t for t, r in rows.items() if r["valid"] == K and 0.25 <= r["pass_rate"] <= 1]
    assert result["chosen"] == expected
    assert json.loads(manifest.read_text())["tasks"] == expected
    assert any(r["passed"] for r in rows.values()), "local-smoke's v0 solves some arithmetic"

    doc = json.loads(state_path.read_text())
    run = doc["runs"][result["run"]]
    assert run["calibrate"] == K and run["status"] == "finished" and run["policy_version"] == 0
    run_dir = Path(run["run_dir"])
    # The table in the run folder is what was reported; nothing was trained.
    assert json.loads((run_dir / "calibration.json").read_text())["tasks"] == result["tasks"]
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.jsonl").exists()
    # Its engines, router and control plane were stopped when it ended.
    mine = [c for c in doc["components"].values() if c.get("run") == result["run"]]
    assert mine and all(c["status"] != "running" for c in mine), mine
    # A calibration run is never the one `--resume` continues.
    resumed = run_cli("up", "--recipe", str(recipe), "--resume", state=state_path, cwd=run_folder)
    assert resumed.returncode == 1 and "no earlier run" in resumed.stdout + resumed.stderr


def test_bad_input_is_refused_before_anything_starts(run_folder, state_path):
    recipe = local_smoke_recipe(run_folder)
    for args, said in ((["--band", "0.6:0.2"], "LOW:HIGH"), (["-k", "1"], "at least 2 samples"),
                       (["--include", "no-such-task"], "no task folder named no-such-task")):
        proc = run_cli("tasks", "calibrate", str(TASKS), "--recipe", str(recipe), *args, state=state_path,
                       cwd=run_folder)
        assert proc.returncode == 1 and said in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    missing = run_cli("tasks", "calibrate", str(TASKS), state=state_path, cwd=run_folder)
    assert missing.returncode == 1 and "--recipe" in missing.stdout + missing.stderr
    assert not state_path.exists() or not json.loads(state_path.read_text()).get("runs")
