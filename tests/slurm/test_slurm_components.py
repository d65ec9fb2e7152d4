"""Components as job steps on the real dev Slurm: start, observe, fail fast, follow the logs, stop."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.slurm.conftest import sacct_states, sacct_step_state, squeue_ids, start_component, write_profile

pytestmark = pytest.mark.slurm

# Small, shareable tiers: one CPU per node, nodes not exclusive (the dev cluster is shared by all tests).
SMALL = {"service": {"num_nodes": 1, "cpus_per_node": 1}, "training": {"num_nodes": 1, "cpus_per_node": 1},
         "rollout": {"num_nodes": 2, "cpus_per_node": 1}}
FAIL_ON_RANK_1 = ('echo "rank $SLURM_PROCID on $SLURMD_NODENAME"; '
                  'if [ "$SLURM_PROCID" = 1 ]; then sleep 1; echo failing; exit 3; fi; exec sleep 300')


@pytest.fixture
def small_cluster(rl360, tmp_path) -> dict:
    profile = write_profile(tmp_path, "dev-small", slurm={"exclusive": False, "poll_interval_s": 1.0}, tiers=SMALL)
    proc = rl360("provision", "--profile", str(profile))
    assert proc.returncode == 0, proc.stderr
    return rl360.doc()


def test_a_failing_task_takes_its_step_down_and_status_says_why(rl360, small_cluster):
    rollout = small_cluster["tiers"]["rollout"]["nodes"]
    rec = start_component(rl360.state, name="pair", tier="rollout", node="*", argv=["bash", "-c", FAIL_ON_RANK_1])
    assert rec["nodes"] == rollout and rec["num_tasks"] == 2
    report = rl360.wait_status(lambda r: r["components"]["rollout/pair"]["status"] == "failed", timeout_s=60)
    pair = report["components"]["rollout/pair"]
    assert (pair["exit_code"], pair["reason"]) == (3, f"exit code 3 on {rollout[1]} (rank 1)")
    # Rank 0 would have slept 300 s: --kill-on-bad-exit ended it, and Slurm saw the step end.
    rank0 = json.loads(Path(rec["status_path"]).read_text())
    assert rank0["signal"] in ("SIGTERM", "SIGKILL") and rank0["ended_at"] - rec["launched_at"] < 60
    assert sacct_step_state(rec["step_key"]) in ("FAILED", "CANCELLED")
    logs = rl360("logs").stdout
    assert f"rollout/pair | rank 0 on {rollout[0]}" in logs and "rollout/pair.1 | failing" in logs
    assert rl360("status").returncode == 3


def test_logs_follow_ends_with_the_run_and_its_exit_code(rl360, small_cluster):
    from rl360cli.config import load_recipe
    from rl360cli.stages.base import Context, resolve_profile
    from rl360cli.stages.lifecycle import start_run
    from rl360cli.state.store import StateFile
    from tests.conftest import REPO

    state = StateFile(rl360.state)
    recipe_path = REPO / "recipes" / "local-smoke.toml"
    profile, path = resolve_profile(state.read(), None, None)
    ctx = Context(state=state, profile=profile, profile_path=path, recipe=load_recipe(recipe_path),
                  recipe_path=recipe_path)
    run = start_run(ctx)
    with state.update() as doc:
        doc["runs"][run]["status"] = "running"
    script = "for i in 1 2 3; do echo step $i; sleep 0.5; done; echo diverged; exit 3"
    start_component(rl360.state, name="trainer", tier="training", kind="trainer", run=run,
                    argv=["bash", "-c", script])
    start_component(rl360.state, name="engine", tier="rollout", run=run,
                    argv=[sys.executable, "-c", "import time\nwhile True: print('gen', flush=True); time.sleep(1)"])
    proc = rl360("logs", "--follow", timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("training/trainer")] == [
        "training/trainer | step 1", "training/trainer | step 2", "training/trainer | step 3",
        "training/trainer | diverged"]
    assert lines[-1].startswith(f"── run {run} failed") and "trainer exit code 3 on" in lines[-1]
    assert any(ln.startswith("rollout/engine | gen") for ln in lines)


def test_down_stops_the_steps_and_confirms_through_sacct(rl360, small_cluster):
    recs = [start_component(rl360.state, name=f"sleeper-{i}", tier="rollout", argv=["sleep", "300"])
            for i in range(2)]
    # Spread over the tier's two nodes: each goes where fewer components run.
    assert sorted(r["node"] for r in recs) == sorted(small_cluster["tiers"]["rollout"]["nodes"])
    assert all(c["status"] == "running" for c in rl360.status()["components"].values())
    ids = {t["job_id"] for t in small_cluster["tiers"].values()}
    proc = rl360("down", "--grace", "3")
    assert proc.returncode == 0, proc.stderr
    for rec in recs:
        assert json.loads(Path(rec["status_path"]).read_text())["signal"] == "SIGTERM"
        assert sacct_step_state(rec["step_key"]) in ("CANCELLED", "FAILED", "COMPLETED")
    assert not ids & squeue_ids() and set(sacct_states(ids).values()) == {"CANCELLED"}
    assert rl360("down").stdout.strip() == "nothing was running"
