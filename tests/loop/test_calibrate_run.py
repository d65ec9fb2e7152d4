"""`rl360 tasks calibrate`: a real calibration of local-smoke's starting policy on four coding-32 tasks (engines,
router, control plane, Ray session actors and sandboxes, as `rl360 up` starts them), with sandbox failures
injected; what the table, the manifest and the run's record say; one training step on the manifest, with its
figures per task tag in metrics.jsonl and the report; bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.loop.conftest import LOCAL_SMOKE_V0, TASKS, metrics_of, write_run_files

K = 2
CODING = REPO / "recipes" / "tasks" / "coding-32"
# Four domains: bugfix/dates, strings/parsing, data-structures/caching, intervals/sorting.
TASK_NAMES = ["fix-leap-year", "lru-cache", "merge-intervals", "roman-numerals"]
BUDGET = 2048


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
def test_calibration_scores_each_task_on_policy_v0_and_a_run_trains_on_its_manifest(run_folder, state_path):
    recipe = local_smoke_recipe(run_folder)
    manifest = run_folder / "chosen" / "manifest.json"
    include = [arg for name in TASK_NAMES for arg in ("--include", name)]
    # Sandbox starts and commands fail now and then: those samples have no verdict, their tasks are not chosen.
    # (local-smoke's policy was made for arithmetic: it solves none of these, so the band starts at 0; its
    # budget of 512 tokens holds none of their prompts, 509 to 1,207 tokens in its tokenizer.)
    proc = run_cli("tasks", "calibrate", str(CODING), "--recipe", str(recipe), "-k", str(K), "--band", "0:1",
                   *include, "--manifest", str(manifest), "--set", "sandbox.inject_failure_rate=0.05",
                   "--set", f"rollout.max_total_tokens={BUDGET}", "--json",
                   state=state_path, cwd=run_folder, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    rows = {row["task"]: row for row in result["tasks"]}
    assert sorted(rows) == TASK_NAMES
    for row in rows.values():
        assert row["samples"] == K and row["valid"] + sum(row["infra_failures"].values()) == K
        assert row["pass_rate"] == (row["passed"] / row["valid"] if row["valid"] else None)
    expected = [t for t, r in rows.items() if r["valid"] == K]
    assert result["chosen"] == expected and expected, result
    listed = json.loads(manifest.read_text())
    assert listed["tasks"] == expected
    assert listed["tags"]["lru-cache" if "lru-cache" in expected else expected[0]][0] == "coding-32"

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

    # A run on the manifest trains on its tasks, and says how each tag's sessions did.
    up = run_cli("up", "--recipe", str(recipe), "--set", f"tasks.path={CODING}", "--set",
                 f"rollout.max_total_tokens={BUDGET}", "--set", f"tasks.manifest={manifest}",
                 "--set", "loop.num_steps=1", "--set", f"loop.num_tasks_per_step={len(expected)}",
                 "--set", "loop.num_samples_per_task=2", "--set", "loop.max_generation_rounds=1", state=state_path, cwd=run_folder, timeout=600)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    [row] = metrics_of(state_path)
    tags = {tag for task in expected for tag in listed["tags"][task]}
    assert {k.removeprefix("sessions/domain/") for k in row if k.startswith("sessions/domain/")} == tags
    assert row["sessions/domain/coding-32"] == row["sessions"] == 2 * len(expected)
    assert row["reward/domain/coding-32"] == row["reward_mean_all"]
    report = run_cli("report", "--json", state=state_path, cwd=run_folder)
    assert report.returncode == 0 and any("domains" in chart for chart in json.loads(report.stdout)["charts"]), \
        report.stdout


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
