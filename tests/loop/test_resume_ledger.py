"""Lossless resume: the trainer killed at several points of a step, resumed each time from its
newest checkpoint, trains every step exactly once on the groups an uninterrupted run trains, and
ends with the same weights.

The loop runs in child processes (`python -m tests.loop.loop_standins`) with the real torch trainer
on a tiny Llama, the real `Rollouts` task choice and the stand-ins named there; the test-only fault
hook (`RL360_FAULT_POINT`, rl360cli/trainer/fault_points.py) makes a child `os._exit` at an exact
point, as a SIGKILL would leave it: nothing flushed, nothing cleaned up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl360cli.errors import Rl360Error
from rl360cli.loop.ledger import read_ledger
from rl360cli.loop.train_loop import latest_checkpoint, train_loop
from rl360cli.trainer.fault_points import FAULT_ENV, FAULT_EXIT
from tests.conftest import REPO
from tests.loop.loop_standins import loop_parts, make_tiny_model, run_loop, tiny_trainer

STEPS, CHECKPOINT_EVERY = 6, 2  # checkpoints after steps 1, 3 and 5 (0-based): step_000002, _4, _6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory) -> Path:
    """An uninterrupted run of the same loop, seed and task set (in this process)."""
    run_dir = tmp_path_factory.mktemp("reference")
    run_loop(run_dir, model_dir, resume=False, steps=STEPS, checkpoint_every=CHECKPOINT_EVERY)
    return run_dir


def child(run_dir: Path, model_dir: Path, *, resume: bool, fault: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if fault:
        env[FAULT_ENV] = fault
    argv = [sys.executable, "-m", "tests.loop.loop_standins", str(run_dir), str(model_dir),
            "--steps", str(STEPS), "--checkpoint-every", str(CHECKPOINT_EVERY)] + (["--resume"] if resume else [])
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(checkpoint / "model" / "model.safetensors")


@pytest.mark.slow
def test_killed_at_every_point_of_a_step_the_resumed_run_trains_each_step_once(model_dir, reference, tmp_path):
    run_dir = tmp_path / "run"
    # (fault, what the newest complete checkpoint is once the child is dead)
    kills = [
        ("before_update@1", None),              # no checkpoint yet: the resume starts over at step 0
        ("after_update@3", "step_000002"),      # step 3's update dies with the process: redone from 2
        ("checkpoint_write@3", "step_000002"),  # step_000004.tmp is complete but not renamed in: not used
        ("after_checkpoint@5", "step_000006"),  # the last checkpoint is in; only the run record missed it
    ]
    for i, (fault, newest) in enumerate(kills):
        died = child(run_dir, model_dir, resume=i > 0, fault=fault)
        assert died.returncode == FAULT_EXIT, died.stdout + died.stderr
        found = latest_checkpoint(run_dir / "checkpoints")
        assert (found.name if found else None) == newest, fault
        # Even a dead trainer's ledger holds each step at most once, in order.
        steps = [e["step"] for e in read_ledger(run_dir / "ledger.jsonl")]
        assert steps == list(range(len(steps))), (fault, steps)
        if fault.startswith("checkpoint_write"):  # killed after every file was written, before the rename
            assert (run_dir / "checkpoints" / "step_000004.tmp" / "loop_state.json").is_file()

    finished = child(run_dir, model_dir, resume=True, fault=None)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "started at step 6" in finished.stdout

    ledger = read_ledger(run_dir / "ledger.jsonl")
    expected = read_ledger(reference / "ledger.jsonl")
    assert [e["step"] for e in ledger] == list(range(STEPS))
    assert ledger == expected  # the same groups, tasks and policy version at every step
    trained = [g for e in ledger for g in e["groups"]]
    assert len(trained) == len(set(trained)) == STEPS * 4  # no group lost, none used twice
    state = json.loads((run_dir / "checkpoints" / "step_000006" / "loop_state.json").read_text())
    assert state["ledger"] == expected and state["version"] == STEPS

    # The resumed run's final weights are the uninterrupted run's (a step trained twice or skipped
    # would move them by about the learning rate; thread scheduling only in the last bits).
    mine, theirs = weights(run_dir / "checkpoints" / "step_000006"), weights(reference / "checkpoints" / "step_000006")
    assert mine.keys() == theirs.keys()
    for name in mine:
        torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=1e-5, msg=name)
    before = weights(reference / "checkpoints" / "step_000004")
    assert any((before[n] - theirs[n]).abs().max() > 1e-3 for n in theirs)  # the check can fail


def test_a_resume_with_another_seed_is_refused_and_the_ledger_kept(model_dir, reference, tmp_path):
    run_dir = tmp_path / "run"
    run_loop(run_dir, model_dir, resume=False, steps=2, checkpoint_every=2)
    kept = (run_dir / "ledger.jsonl").read_text()
    trainer = tiny_trainer(model_dir)
    start = trainer.load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))["next_step"]
    with pytest.raises(Rl360Error, match=r"seed 0 .* seed 7 .*resume with the recipe's original \[run\] seed"):
        train_loop(loop_parts(run_dir, trainer, steps=4, checkpoint_every=2, seed=7), start_step=start)
    assert (run_dir / "ledger.jsonl").read_text() == kept


def test_a_staging_folder_is_never_the_newest_checkpoint(tmp_path):
    (tmp_path / "step_000002").mkdir()
    (tmp_path / "step_000002" / "loop_state.json").write_text("{}")
    (tmp_path / "step_000004.tmp").mkdir()
    (tmp_path / "step_000004.tmp" / "loop_state.json").write_text("{}")  # complete, but never renamed in
    (tmp_path / "step_000006").mkdir()  # a folder without loop_state.json is not a checkpoint
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000002"
