"""`rl360 up` with `[trainer] kind = "megatron"` at TP=2: the train stage starts the trainer
component under torchrun (`trainer_argv`), two ranks of `python -m rl360cli.run.driver` against a real
run (local engine, real sglang-router, Ray session actors, process sandboxes, the gloo weight
broadcast). Rank 0 drives the loop, rank 1 follows; the engine ends on the trainer's last policy version.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import need, run_cli
from tests.loop.conftest import LOCAL_SMOKE_V0, metrics_of, write_run_files

pytestmark = pytest.mark.slow

RECIPE = """
[model]
kind = "huggingface"
path = "{policy}"
[trainer]
kind = "megatron"
tensor_parallel = 2
checkpoint_every = 2
[loop]
num_steps = 3
num_tasks_per_step = 6
num_samples_per_task = 4
max_generation_rounds = 1
[rollout]
num_session_actors = 2
max_new_tokens = 24
[engine]
num_engines = 1
"""


def test_up_runs_the_megatron_trainer_under_torchrun(tmp_path, state_path):
    import importlib.util

    need(importlib.util.find_spec("megatron") is not None,
         "megatron-core is not installed; pip install -e '.[megatron]'")

    recipe = write_run_files(tmp_path, recipe_body=RECIPE.format(policy=LOCAL_SMOKE_V0), name="megatron")
    try:
        up = run_cli("up", "--recipe", str(recipe), state=state_path, cwd=tmp_path, timeout=900)
        doc = json.loads(state_path.read_text())
        run_id = doc["current_run"]
        log_file = Path(doc["runs"][run_id]["run_dir"]) / "logs" / "training.trainer.log"
        log = log_file.read_text() if log_file.is_file() else ""
        assert up.returncode == 0, up.stdout[-3000:] + log[-6000:]

        run = json.loads(state_path.read_text())["runs"][run_id]
        assert run["status"] == "finished" and run["step"] == 3
        rows = metrics_of(state_path)
        trained = [row for row in rows if row["train"]]
        assert trained, "no step had a batch to train on"
        assert run["policy_version"] == len(trained)
        # The engine took every broadcast: it serves the trainer's last version.
        assert set(run["engine_versions"].values()) == {run["policy_version"]}
        for row in trained:
            # On-policy steps: the megatron model (TP=2) scores the engine's samples as the engine did.
            if row["policy_version"] == 1:
                assert row["train"]["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
        checkpoint = Path(run["run_dir"]) / "checkpoints" / "step_000003"
        # Layout-free (format 2): one file per pipeline stage and TP rank, each with a share of whole tensors.
        assert sorted(p.name for p in (checkpoint / "megatron").iterdir()) == [
            "layout.json", "stage000-tp00.safetensors", "stage000-tp01.safetensors"]
        assert (checkpoint / "model" / "model.safetensors").is_file()
        # Only rank 0 ran the loop (one "step 1/3" line, printed by the driver of rank 0).
        assert log.count("[driver] step 1/3") == 1
    finally:
        run_cli("down", state=state_path, cwd=tmp_path)
