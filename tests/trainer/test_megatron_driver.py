"""The trainer component with the megatron trainer at TP=2: `trainer_argv`'s torchrun command runs
`python -m rl360cli.rl.driver` on two ranks against a real run (local engine, real sglang-router,
Ray session actors, process sandboxes, the gloo weight broadcast). Rank 0 drives the loop, rank 1
follows; the engine ends on the trainer's last policy version.

Until `rl360 train` launches the megatron trainer itself, this test starts the component the way
the train stage will: `rl360 provision`, `rl360 serve`, then `trainer_argv(...)`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, need, run_cli
from tests.loop.conftest import free_port_block, metrics_of, write_run_files

pytestmark = pytest.mark.slow

RECIPE = """
[model]
kind = "tiny"
# local-smoke's policy v0: built once per machine (rl360cli/trainer/cache.py), shared with the other tests
warmup_steps = 170
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


def test_the_driver_runs_the_megatron_trainer_under_torchrun(tmp_path, state_path):
    import importlib.util

    need(importlib.util.find_spec("megatron") is not None,
         "megatron-core is not installed; pip install -e '.[megatron]'")
    from rl360cli.trainer.megatron_launch import trainer_argv

    recipe = write_run_files(tmp_path, recipe_body=RECIPE, name="megatron")
    try:
        for command in (("provision", "--profile", str(tmp_path / "profile.toml")), ("serve", "--recipe", str(recipe))):
            done = run_cli(*command, state=state_path, cwd=tmp_path, timeout=600)
            assert done.returncode == 0, done.stdout + done.stderr
        run_id = json.loads(state_path.read_text())["current_run"]
        argv = trainer_argv(["--state", str(state_path), "--run", run_id], nproc_per_node=2,
                            master_port=free_port_block(1), python=sys.executable)  # fmt: skip
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(REPO)}
        trainer = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        log = trainer.stdout + trainer.stderr
        assert trainer.returncode == 0, log[-6000:]

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
        assert sorted(p.name for p in (checkpoint / "megatron").iterdir()) == ["tp00_pp000.pt", "tp01_pp000.pt"]
        assert (checkpoint / "model" / "model.safetensors").is_file()
        # Only rank 0 ran the loop (one "step 1/3" line, printed by the driver of rank 0).
        assert log.count("[driver] step 1/3") == 1
    finally:
        run_cli("down", state=state_path, cwd=tmp_path)
